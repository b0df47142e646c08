"""Corpus-scale statistics of attention heads: mergeable states, run in-process or on Dask.

* :mod:`.protocol`: :class:`Batch` (one forward pass over padded texts) and
  :class:`Statistic` (``update(batch)`` / ``merge(other)`` / ``result()``, lazy state,
  generic merge); :class:`Mergeable` is the protocol as a type.
* :mod:`.moments`: :class:`Moments`, Chan-style mergeable means and covariances.
* :mod:`.histogram`: :class:`Histogram`, fixed-edge histograms (exact merges).
* The statistics, one per module: :mod:`.radius` (:class:`RadiusStatistic`), :mod:`.tilt`
  (:class:`TiltStatistic`, built on :class:`attngeom.TiltCoverage`), :mod:`.routing`
  (:class:`RoutingStatistic`), :mod:`.cumulants` (:class:`CumulantStatistic`),
  :mod:`.whiteness` (:class:`WhitenessStatistic` and :class:`SequenceMoments`), :mod:`.profile`
  (:class:`ProfileStatistic`: every query's entropy, sink mass, mean distance and log Z from the
  streaming attention statistics, and their profile against position).
* :mod:`.partitions`: token ids, partitions of consecutive texts, forward batches, the
  fixed merge tree (:func:`merge_states`) and the results, shared by the two runs below.
* :mod:`.run`: :func:`corpus_statistics` (in-process, or partitions as tasks of a
  ``distributed.Client``, states saved per partition for a resume).
* :mod:`.store`: :func:`write_activations`, a corpus' activations in a Zarr store (chunked by
  layer and tokens) that :func:`corpus_statistics` reads with dask.array.
* :mod:`.result`: :class:`CorpusStatistics`.
"""
from .cumulants import CumulantStatistic
from .histogram import Histogram
from .moments import Moments
from .protocol import Batch, Mergeable, Statistic
from .radius import RadiusStatistic, chi_moments
from .result import CorpusStatistics
from .routing import RoutingStatistic
from .partitions import merge_states
from .profile import ProfileStatistic
from .run import DEFAULT_STATISTICS, STATISTICS, corpus_statistics, partition_states
from .store import write_activations
from .tilt import TiltStatistic
from .whiteness import SequenceMoments, WhitenessStatistic

__all__ = [
    "ProfileStatistic",
    "Batch", "Mergeable", "Statistic", "Moments", "Histogram", "RadiusStatistic", "chi_moments", "TiltStatistic",
    "RoutingStatistic", "CumulantStatistic", "SequenceMoments", "WhitenessStatistic", "CorpusStatistics",
    "corpus_statistics", "write_activations", "partition_states", "merge_states", "STATISTICS", "DEFAULT_STATISTICS",
]
