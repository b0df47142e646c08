"""The training experiment (:mod:`.result`): small character GPTs, one attention variant per arm."""
from .result import (ARM_SUFFIXES, PAPER_TABLE_1, PAPER_TABLE_2, PAPER_TABLE_3, CharCorpus, MarkovSource, TrainingConfig,
                     TrainingResult, learning_rate, load_corpus, make_optimizer, parallel_runs, parse_arms, run_training,
                     stdlib_docstrings, train_step)

__all__ = ["ARM_SUFFIXES", "PAPER_TABLE_1", "PAPER_TABLE_2", "PAPER_TABLE_3", "CharCorpus", "MarkovSource",
           "TrainingConfig", "TrainingResult", "learning_rate", "load_corpus", "make_optimizer", "parallel_runs",
           "parse_arms", "run_training", "stdlib_docstrings", "train_step"]
