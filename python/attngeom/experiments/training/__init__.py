"""Training (whitened s.5-6, projection SDPA s.3): small character GPTs, one attention variant per arm.

The experiment of "Whitened Self-Attention" (seed 004) s.5-6 at a scale that runs on a
laptop CPU: a 2-block, 2-head pre-LN GPT with RoPE (:mod:`attngeom.torch.gpt`) trained on a
character corpus with AdamW, four arms by default as in the paper's Table 1 (standard
attention; whitened attention; standard attention with the whitened model's parameter count,
reached by a wider d_model; whitened attention with half the batch) and the projection SDPA
arm of Sanger s.3, each over several seeds that share their data order across arms. It
measures the validation mean cross-entropy and next-character accuracy against iterations
and training time (Fig. 3, Table 1), the iterations and time each arm needs to reach the
equal-capacity standard arm's final loss (Table 2), milliseconds per iteration against
context and width (Table 3), and, for the whitened arms, the relative whiteness
Psi_W / Psi_X (eq. 10-12) and the first-order stationarity rho (eq. 13-14) of the input of
every block's whitening filter on a fixed validation batch (Fig. 4).

The paper trained on the collected works of Charles Dickens from Project Gutenberg (13.8m
characters, 93 symbols, 90/10 split) with d_model 256, context 256, batch 256 and 100k
iterations on a GPU. Here the default corpus is built without a download: the docstrings of
the Python standard library of the running interpreter, gathered in sorted file order and
cached (``corpus="stdlib"``); ``corpus=PATH`` reads any UTF-8 file (e.g. the Dickens text),
and ``corpus="markov"`` is a random k-th order Markov chain whose entropy rate, the floor of
the achievable loss, is known exactly. Requires PyTorch (``pip install 'attngeom[torch]'``),
imported only when the experiment runs. Modules: config (and arms), corpora, loop (and
run_training; shared with the induction experiment), result.
"""
from .config import ARM_SUFFIXES, TrainingConfig, base_variant, check_training, parse_arms
from .corpora import CharCorpus, MarkovSource, load_corpus, stdlib_docstrings, windows
from .loop import learning_rate, make_optimizer, parallel_runs, require_torch, run_training, threads, train_step
from .result import PAPER_TABLE_1, PAPER_TABLE_2, PAPER_TABLE_3, TrainingResult

__all__ = ["ARM_SUFFIXES", "PAPER_TABLE_1", "PAPER_TABLE_2", "PAPER_TABLE_3", "CharCorpus", "MarkovSource",
           "TrainingConfig", "TrainingResult", "base_variant", "check_training", "learning_rate", "load_corpus",
           "make_optimizer", "parallel_runs", "parse_arms", "require_torch", "run_training", "stdlib_docstrings",
           "threads", "train_step", "windows"]
