"""What the benchmarks share: their command line, the run's metadata and the JSON they write.

Each ``bench_<concept>.py`` runs as a script (``python benchmarks/bench_lightning.py``), which
puts this folder on ``sys.path``; ``from harness import ...`` then finds this module.
"""
from __future__ import annotations

import argparse
import json
import os
import platform
from pathlib import Path
from typing import Optional

import numpy as np

import attngeom as ag


def parser(doc: str, *, repeats: Optional[int] = 3, threads: bool = False) -> argparse.ArgumentParser:
    """The common options: ``--out`` (the results directory), ``--repeats`` (timed rounds per
    case, default `repeats`; None leaves the option out) and, with `threads`, ``--threads``
    (attngeom's thread count, applied by :func:`parse`)."""
    p = argparse.ArgumentParser(description=doc, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--out", default="benchmarks/results", help="directory the JSON file is written to")
    if repeats is not None:
        p.add_argument("--repeats", type=int, default=repeats, help="timed rounds per case")
    if threads:
        p.add_argument("--threads", type=int, default=None, help="attngeom threads (default: its own)")
    return p


def parse(p: argparse.ArgumentParser, argv=None) -> argparse.Namespace:
    """The parsed arguments; a ``--threads`` count given is applied with ag.set_num_threads."""
    args = p.parse_args(argv)
    if getattr(args, "threads", None) is not None:
        ag.set_num_threads(args.threads)
    return args


def attention_inputs(rng: np.random.Generator, heads: int, d: int, lengths):
    """The attention benchmarks' sweep: for float32 then float64, non-causal then causal, and
    each sequence length n in `lengths`, (dtype name, causal, n, (q, k, v)) with q, k, v drawn
    standard normal of shape (heads, n, d), in that order from `rng`."""
    for dtype in (np.float32, np.float64):
        for causal in (False, True):
            for n in lengths:
                yield np.dtype(dtype).name, causal, n, tuple(rng.standard_normal((heads, n, d)).astype(dtype)
                                                             for _ in range(3))


def machine(**fields) -> dict:
    """The run's metadata: attngeom's thread count, `fields`, the NumPy and Python versions and
    the CPU count."""
    return {"threads": ag.get_num_threads(), **fields, "numpy": np.__version__,
            "python": platform.python_version(), "cpu_count": os.cpu_count()}


def write(out, name: str, **payload) -> Path:
    """Write `payload` as ``<out>/<name>.json`` (the directory is created), say so, return the path."""
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    path = out / f"{name}.json"
    path.write_text(json.dumps(payload, indent=2) + "\n")
    print(f"wrote {path}")
    return path
