"""An experiment run by name into a run folder (``attngeom run``), resumed after an interruption, read back when
finished (``attngeom report``). A run folder holds config.json, summary.json, summary.md, every figure as PNG and
the ARTIFACTS its result type declares; it is written whole or not at all (:mod:`.folders`)."""
from __future__ import annotations

import dataclasses
import inspect
import json
import os
import shutil
import sys
import time

from .folders import PARTIAL, write_folder


def experiment(name: str) -> tuple:
    """(config class, run function) of the experiment `name`; ValueError naming the experiments otherwise."""
    from . import EXPERIMENTS  # the registry, in the package that imports this module

    if name not in EXPERIMENTS:
        raise ValueError(f"unknown experiment {name!r}; try: {', '.join(EXPERIMENTS)}")
    return EXPERIMENTS[name]


def _new_run_folder(out: str, name: str) -> str:
    """out/<name>_<timestamp>, with a counter appended when that folder exists already."""
    if os.path.lexists(out) and not os.path.isdir(out):
        raise ValueError(f"--out {out!r} exists and is not a folder (it is the parent of the run folder)")
    base = os.path.join(out, f"{name}_{time.strftime('%Y%m%d_%H%M%S')}")
    folder, k = base, 1
    while os.path.lexists(folder):
        k += 1
        folder = f"{base}_{k}"
    return folder


_RESUME = "resume.json"  # in the staging folder of a resumable run: the experiment and its run folder
_STATE = "state"  # the runs' saved states, inside that staging folder


def _resume_point(name, resume: str):
    """(name, config values, final folder) of the interrupted run whose staging folder is
    `resume`; ValueError naming --resume when it is not one."""
    record = os.path.join(resume, _RESUME)
    if not os.path.isfile(record):
        raise ValueError(f"--resume {resume!r} is not the folder of an interrupted run (no {_RESUME}); an interrupted "
                         f"run leaves a hidden folder '.<run>.<random>{PARTIAL}' next to its run folder")
    with open(record) as f:
        info = json.load(f)
    with open(os.path.join(resume, "config.json")) as f:
        values = json.load(f)
    if name is not None and name != info["experiment"]:
        raise ValueError(f"--resume {resume!r} is an interrupted {info['experiment']!r} run, not {name!r}")
    return info["experiment"], values, info["final"]


def run_experiment(name, *, out="runs", seed=None, overrides=None, folder=None, quiet=False, resume=None) -> str:
    """Run experiment `name` and write its run folder; returns the folder's path.

    The config and the output location are checked before the experiment runs (ValueError
    naming the field or the folder); the folder appears only once everything is written.
    `folder` (the run folder itself) overrides `out` (its parent); an existing `folder` is
    replaced when it is empty or an earlier run folder.

    Experiments that train (training, induction) save each run's state in the hidden staging
    folder as they go; when such a run is interrupted (an exception, Ctrl-C, or the process
    killed) that folder stays, and ``resume=<staging folder>`` (``attngeom run NAME --resume
    FOLDER``) continues it with its own config to the result an uninterrupted run gives
    (`seed` and `overrides` are then not allowed: the saved config is the run's).
    """
    staging = None
    if resume is not None:
        if seed is not None or overrides:
            raise ValueError("--resume continues a run with its saved config: --seed and --set are not allowed")
        staging = os.path.abspath(resume)
        name, values, folder = _resume_point(name, staging)
    config_cls, run = experiment(name)
    if resume is None:
        values = dict(overrides or {})
        if seed is not None:
            values["seed"] = seed
    config = config_cls(**values).check()
    if folder is None:
        folder = _new_run_folder(out, name)
    resumable = "state_dir" in inspect.signature(run).parameters  # it saves states it can continue from
    written = {}

    def write(staging):
        with open(os.path.join(staging, "config.json"), "w") as f:  # first: --resume reads it
            json.dump(dataclasses.asdict(config), f, indent=2)
        t0 = time.perf_counter()
        if resumable:  # what --resume needs, before the first state is saved
            with open(os.path.join(staging, _RESUME), "w") as f:
                json.dump({"experiment": name, "final": os.path.abspath(folder)}, f, indent=2)
            result = run(config, state_dir=os.path.join(staging, _STATE))
            shutil.rmtree(os.path.join(staging, _STATE), ignore_errors=True)
            os.remove(os.path.join(staging, _RESUME))
        else:
            result = run(config)
        written["elapsed"] = time.perf_counter() - t0
        written["table"] = result.table()
        with open(os.path.join(staging, "summary.md"), "w", encoding="utf-8") as f:
            f.write(f"# {name}\n\n{written['table']}\n")
        names = written["figures"] = []
        for fname, fig in result.figures().items():
            fig.savefig(os.path.join(staging, fname), dpi=110)
            names.append(fname)
        if result.ARTIFACTS:  # declared by the result type, e.g. the training runs' checkpoints
            result.save_artifacts(staging)
        result.to_json(os.path.join(staging, "summary.json"))  # last: the run's marker

    def keep(staging):
        if resumable and os.path.isdir(os.path.join(staging, _STATE)):
            print(f"attngeom run {name}: interrupted; `attngeom run {name} --resume {staging}` continues it from "
                  "the last saved state", file=sys.stderr)
            written["kept"] = True
            return True
        return False

    try:
        write_folder(folder, "summary.json", write, staging=staging, keep=keep)
    except KeyboardInterrupt as exc:  # Ctrl-C (or SIGTERM in the command line): the line above said it all
        exc.reported = written.get("kept", False)
        raise
    if not quiet:
        names = written["figures"]
        print(f"{name} ({written['elapsed']:.1f} s), seed {config.seed}")
        print(written["table"])
        print(f"wrote {folder}/: config.json, summary.json, summary.md and {len(names)} figures "
              f"({', '.join(names)})")
    return folder


def run_summary(folder: str) -> str:
    """The summary table (summary.md) of the finished run folder `folder`; ValueError saying why it is not one."""
    if not os.path.isdir(folder):
        raise ValueError(f"{folder!r} is not a folder")
    if os.path.basename(os.path.normpath(folder)).endswith(PARTIAL):
        raise ValueError(f"{folder!r} is not a complete run: it is the temporary folder of a run that was "
                         "interrupted before it finished writing")
    missing = [n for n in ("config.json", "summary.md", "summary.json") if not os.path.isfile(os.path.join(folder, n))]
    if missing:
        raise ValueError(f"{folder!r} is not a complete run folder: {', '.join(missing)} "
                         f"{'is' if len(missing) == 1 else 'are'} missing or not a file")
    path = os.path.join(folder, "summary.md")
    try:
        with open(path, encoding="utf-8") as f:
            text = f.read()
    except UnicodeDecodeError as exc:
        raise ValueError(f"{path!r} is not UTF-8 text ({exc.reason} at byte {exc.start})") from None
    return text
