"""Interrupted training runs resume to the uninterrupted result, bit for bit.

Each experiment that trains (training, induction) runs once uninterrupted, then several
times in a subprocess killed with SIGKILL once its saved state has passed a chosen iteration
(plus a random delay, so the kill lands between two saved states); `--resume` on the hidden
staging folder the kill leaves must then give the same checkpoints (byte for byte) and the
same summary (wall-clock fields aside).
"""
import json
import os
import random
import re
import signal
import subprocess
import sys
import time

import pytest

torch = pytest.importorskip("torch")

from attngeom.cli import run_experiment  # noqa: E402
from attngeom.experiments._resume import RunState  # noqa: E402

ROOT = os.path.join(os.path.dirname(__file__), "..")

# Tiny configs: a few seconds per run, a state every 25 iterations.
CONFIGS = {
    "training": dict(corpus="markov", markov_chars=20000, variants="standard", d_model=16, n_blocks=1, n_heads=2,
                     context=16, batch=8, iterations=300, seeds=1, eval_every=50, geometry_every=100, eval_windows=8,
                     geometry_batch=4, timing=False, workers=1, checkpoint_every=25),
    "induction": dict(layers="2", corpus_chars=20000, d_model=16, n_heads=2, context=16, batch=8, iterations=240,
                      seeds=1, eval_every=40, probe=2, icl_early=2, icl_late=12, segment_min=2, segment_max=6,
                      warmup=10, workers=1, checkpoint_every=25),
}
KILL_AFTER = {"training": (40, 140, 230), "induction": (30, 110, 190)}  # iterations the saved state has passed

_CLOCK = re.compile(r"time|seconds|ms_per_iter|minutes")


def _without_clock(obj):
    """A summary without its wall-clock fields (times differ between any two runs)."""
    if isinstance(obj, dict):
        return {k: _without_clock(v) for k, v in obj.items() if not _CLOCK.search(k)}
    if isinstance(obj, list):
        return [_without_clock(v) for v in obj]
    return obj


def _outputs(folder):
    """(summary without clock fields, {checkpoint file: bytes})."""
    with open(os.path.join(folder, "summary.json")) as f:
        summary = _without_clock(json.load(f)["summary"])
    files = {}
    for root, _, names in os.walk(os.path.join(folder, "checkpoints")):
        for name in names:
            if name.endswith(".safetensors"):
                path = os.path.join(root, name)
                with open(path, "rb") as f:
                    files[os.path.relpath(path, folder)] = f.read()
    return summary, files


def _iteration(staging):
    """The smallest iteration among the saved states of the runs (0 before the first)."""
    folder = os.path.join(staging, "state")
    if not os.path.isdir(folder):
        return 0
    done = []
    for name in os.listdir(folder):
        if name.endswith(".state"):
            state = RunState(folder, name[:-len(".state")]).load()
            done.append(0 if state is None else state["iteration"])
    return min(done) if done else 0


def _killed_run(name, parent, after, delay):
    """Start `name` in a subprocess, SIGKILL it once its state has passed `after` iterations
    (and `delay` seconds more); returns the staging folder it leaves."""
    code = (f"from attngeom.cli import run_experiment; "
            f"run_experiment({name!r}, out={parent!r}, overrides={CONFIGS[name]!r}, quiet=True)")
    env = dict(os.environ, OMP_NUM_THREADS="1")
    proc = subprocess.Popen([sys.executable, "-c", code], env=env, stderr=subprocess.DEVNULL)
    try:
        deadline = time.time() + 300
        staging = None
        while time.time() < deadline:
            assert proc.poll() is None, f"the {name} run ended before iteration {after}"
            found = [f for f in os.listdir(parent) if f.endswith(".partial")] if os.path.isdir(parent) else []
            if found:
                staging = os.path.join(parent, found[0])
                if _iteration(staging) >= after:
                    break
            time.sleep(0.02)
        time.sleep(delay)
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.wait()
    assert staging is not None and os.path.isdir(os.path.join(staging, "state"))
    return staging


@pytest.mark.heavy
@pytest.mark.parametrize("name", ["training", "induction"])
def test_a_killed_run_resumes_to_the_uninterrupted_result(name, tmp_path, monkeypatch):
    from attngeom.experiments import induction
    from attngeom.experiments.training import loop as training

    reference = run_experiment(name, folder=str(tmp_path / "reference"), overrides=CONFIGS[name], quiet=True)
    expected = _outputs(reference)
    assert expected[1], "the run writes checkpoints"
    steps = []  # the iterations the resumed run trains: only those after its saved state
    real = training.train_step
    for module in (training, induction):
        monkeypatch.setattr(module, "train_step", lambda *a, **k: (steps.append(a[4]), real(*a, **k))[1])
    rng = random.Random(0)
    for k, after in enumerate(KILL_AFTER[name]):
        parent = str(tmp_path / f"killed{k}")
        staging = _killed_run(name, parent, after, rng.uniform(0.0, 0.05))
        assert not [f for f in os.listdir(parent) if not f.startswith(".")], "no run folder before it is complete"
        saved = _iteration(staging)
        assert saved >= after
        steps.clear()
        final = run_experiment(name, resume=staging, quiet=True)
        assert steps == list(range(saved, CONFIGS[name]["iterations"])), "the resumed run starts at its saved state"
        assert not os.path.exists(staging)
        summary, files = _outputs(final)
        assert files == expected[1], f"kill after iteration {after}: the final weights differ"
        assert summary == expected[0], f"kill after iteration {after}: the summary differs"


def test_a_damaged_state_is_reported_and_the_run_starts_over(tmp_path):
    state = RunState(str(tmp_path), "run")
    state.save({"iteration": 7, "x": torch.arange(3)})
    assert state.load()["iteration"] == 7
    path = tmp_path / "run.state"
    data = bytearray(path.read_bytes())
    data[-1] ^= 1  # one flipped bit in place
    path.write_bytes(bytes(data))
    with pytest.warns(RuntimeWarning, match="does not match its SHA-256 digest"):
        assert state.load() is None
    path.write_bytes(bytes(data[:40]))  # truncated
    with pytest.warns(RuntimeWarning, match="cannot be used"):
        assert state.load() is None


def test_resume_refuses_a_folder_that_is_not_an_interrupted_run(tmp_path):
    with pytest.raises(ValueError, match="--resume .* is not the folder of an interrupted run"):
        run_experiment("training", resume=str(tmp_path))
    with pytest.raises(ValueError, match="--seed and --set are not allowed"):
        run_experiment("training", resume=str(tmp_path), seed=3)


def test_the_command_line_resume_is_one_line_on_misuse(tmp_path, capsys):
    from attngeom import cli

    assert cli.main(["run", "training", "--resume", str(tmp_path)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "is not the folder of an interrupted run" in err[0]
