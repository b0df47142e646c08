"""The command line under misuse: one line on stderr and exit status 2, never a traceback,
found before any computation starts; run folders are written whole or not at all (a failed
write leaves nothing that ``attngeom report`` shows as a run).

The checkpoint misuses of ``attngeom heads`` are in test_cli_heads.py.
"""
import dataclasses
import errno
import json
import os
import subprocess
import sys

import pytest

from attngeom import cli
from attngeom.experiments import EXPERIMENTS, run_identity
from attngeom.experiments._result import check_config

SMALL_IDENTITY = ["--set", "n_heads=2", "--set", "n_examples=4"]


def _never_run(config):
    raise AssertionError("the experiment ran although its arguments were invalid")


@pytest.fixture
def guarded(monkeypatch):
    """Every experiment replaced by one that fails the test if it runs."""
    for name, (config_cls, _) in list(EXPERIMENTS.items()):
        monkeypatch.setitem(EXPERIMENTS, name, (config_cls, _never_run))


@pytest.fixture
def small_demo(monkeypatch):
    """`attngeom demo` on a small identity experiment instead of the full tomography one."""
    def run(config):
        return run_identity(dataclasses.replace(config, n_heads=2, n_examples=4))

    monkeypatch.setitem(EXPERIMENTS, "tomography", (EXPERIMENTS["identity"][0], run))


@pytest.mark.parametrize("error, needle", [
    (MemoryError("Unable to allocate 572. GiB for an array with shape (100000000, 768)"), "out of memory: Unable"),
    (ImportError("the training experiment needs PyTorch: pip install 'attngeom[torch]'"), "pip install"),
])
def test_memory_and_missing_dependency_errors_are_one_line(monkeypatch, capsys, tmp_path, error, needle):
    """Sizes beyond the machine and a missing optional dependency end in one line, exit status 2."""
    def run(config):
        raise error

    monkeypatch.setitem(EXPERIMENTS, "identity", (EXPERIMENTS["identity"][0], run))
    assert cli.main(["run", "identity", "--out", str(tmp_path)]) == 2
    _one_line_error(capsys, needle)
    assert not os.listdir(tmp_path)


def _one_line_error(capsys, *needles):
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.endswith("\n") and "Traceback" not in err, err
    for needle in needles:
        assert needle in err, err
    return err


def _entries(folder):
    """Everything in folder, hidden entries included ([] when it does not exist)."""
    return sorted(os.listdir(folder)) if os.path.isdir(folder) else []


# -- bad values: rejected before the experiment runs ---------------------------------------
@pytest.mark.parametrize("experiment,args,message", [
    ("identity", ["--set", "n_examples=0"], "n_examples must be an integer >= 1, got 0"),
    ("identity", ["--set", "n_heads=-3"], "n_heads must be an integer >= 1, got -3"),
    ("identity", ["--set", "d_k=0"], "d_k must be an integer >= 1, got 0"),
    ("identity", ["--set", "n_tokens=0"], "n_tokens must be an integer >= 1, got 0"),
    ("identity", ["--seed", "-1"], "seed must be an integer >= 0, got -1"),
    ("identity", ["--set", "causal=maybe"], "--set causal: 'maybe' is not a boolean"),
    ("identity", ["--set", "causal=on"], "--set causal: 'on' is not a boolean"),
    ("identity", ["--set", "n_heads=2.5"], "--set n_heads: cannot read '2.5' as int"),
    ("identity", ["--set", "n_heads"], "--set expects key=value"),
    ("identity", ["--set", "bogus=1"], "unknown config field 'bogus'"),
    ("projection", ["--set", "sigma_min=nan"], "sigma_min must be finite, got nan"),
    ("projection", ["--set", "sigma_min=-1"], "sigma_min must be >= 0, got -1.0"),
    ("projection", ["--set", "noise=inf"], "noise must be finite, got inf"),
    ("nope", [], "unknown experiment 'nope'"),
])
def test_bad_values_are_one_line_errors(tmp_path, capsys, guarded, experiment, args, message):
    assert cli.main(["run", experiment, "--out", str(tmp_path / "runs"), *args]) == 2
    _one_line_error(capsys, f"attngeom run: {message}")
    assert _entries(tmp_path / "runs") == []


@pytest.mark.parametrize("word,value", [("true", True), ("TRUE", True), ("1", True), ("yes", True), ("Yes", True),
                                        ("false", False), ("0", False), ("no", False), ("False", False)])
def test_booleans(word, value):
    assert cli._parse_sets(EXPERIMENTS["identity"][0], [f"causal={word}"]) == {"causal": value}


def test_one_rule_for_every_config():
    """check_config: the defaults pass; a count of 0, a negative seed, a non-finite or negative
    float and a non-boolean are refused by name, in every driver's config."""
    for name, (config_cls, _) in EXPERIMENTS.items():
        config = config_cls()
        check_config(config)
        for f in dataclasses.fields(config):
            default = f.default
            if isinstance(default, str):
                continue  # names and paths: each driver checks its own (check_config has no rule)
            if isinstance(default, bool):
                bad = ["yes", 1]
            elif isinstance(default, int):
                bad = [-1, 1.0, True] + ([0] if default >= 1 else [])
            else:
                bad = [float("nan"), float("inf"), "1"] + ([-0.5] if default >= 0 else [])
            for value in bad:
                with pytest.raises(ValueError, match=f"^{f.name} must be"):
                    check_config(dataclasses.replace(config, **{f.name: value}))


# -- output locations: checked before the experiment runs ----------------------------------
def test_out_is_a_file(tmp_path, capsys, guarded):
    (tmp_path / "file").write_text("keep me")
    assert cli.main(["run", "identity", "--out", str(tmp_path / "file")]) == 2
    _one_line_error(capsys, "exists and is not a folder")
    assert cli.main(["run", "identity", "--out", str(tmp_path / "file" / "below")]) == 2
    _one_line_error(capsys, "cannot be written")
    assert cli.main(["demo", "--out", str(tmp_path / "file")]) == 2
    _one_line_error(capsys, "attngeom demo: --out", "exists and is not a folder")
    assert cli.main(["heads", str(tmp_path / "no_checkpoint"), "--out", str(tmp_path / "file")]) == 2
    _one_line_error(capsys, "attngeom heads: --out", "exists and is not a folder")  # before the checkpoint
    assert (tmp_path / "file").read_text() == "keep me" and _entries(tmp_path) == ["file"]


@pytest.mark.skipif(not os.path.isdir("/proc/self"), reason="needs Linux's /proc")
def test_out_in_proc(capsys, guarded):
    assert cli.main(["run", "identity", "--out", "/proc"]) == 2
    _one_line_error(capsys, "attngeom run: --out '/proc/identity_", "cannot be written")
    assert cli.main(["demo", "--out", "/proc/attngeom_demo"]) == 2
    _one_line_error(capsys, "cannot be written")


@pytest.mark.skipif(hasattr(os, "geteuid") and os.geteuid() == 0, reason="root writes into read-only folders")
def test_out_in_a_read_only_folder(tmp_path, capsys, guarded):
    locked = tmp_path / "locked"
    locked.mkdir()
    locked.chmod(0o555)
    try:
        assert cli.main(["run", "identity", "--out", str(locked)]) == 2
        _one_line_error(capsys, "cannot be written", "Permission denied")
        assert cli.main(["demo", "--out", str(locked / "demo")]) == 2
        _one_line_error(capsys, "cannot be written")
    finally:
        locked.chmod(0o755)
    assert _entries(locked) == []


def test_out_cannot_be_created(tmp_path, capsys, guarded, monkeypatch):
    """Whatever the file system refuses (a read-only mount refuses root too) is reported
    before the run: the staging folder is created first."""
    def refuse(path, mode=0o777, **kwargs):
        raise OSError(errno.EROFS, "Read-only file system", str(path))

    monkeypatch.setattr(os, "mkdir", refuse)
    assert cli.main(["run", "identity", "--out", str(tmp_path)]) == 2
    _one_line_error(capsys, "cannot be written", "Read-only file system")
    assert cli.main(["demo", "--out", str(tmp_path / "demo")]) == 2
    _one_line_error(capsys, "cannot be written", "Read-only file system")


def test_demo_out_holding_other_files_is_refused(tmp_path, capsys, guarded):
    (tmp_path / "mine").mkdir()
    (tmp_path / "mine" / "thesis.tex").write_text("do not delete")
    assert cli.main(["demo", "--out", str(tmp_path / "mine")]) == 2
    _one_line_error(capsys, "holds other files")
    assert _entries(tmp_path / "mine") == ["thesis.tex"]
    assert _entries(tmp_path) == ["mine"]


# -- run folders are atomic ----------------------------------------------------------------
def test_run_folder_appears_whole(tmp_path, capsys):
    pytest.importorskip("matplotlib")
    assert cli.main(["run", "identity", "--out", str(tmp_path / "runs"), *SMALL_IDENTITY]) == 0
    (name,) = _entries(tmp_path / "runs")  # no temporary folder left beside it
    folder = tmp_path / "runs" / name
    assert {"config.json", "summary.json", "summary.md", "radii.png"} <= set(_entries(folder))
    os.mkdir(tmp_path / "plain")  # the permissions of a folder made the ordinary way
    assert folder.stat().st_mode == (tmp_path / "plain").stat().st_mode
    capsys.readouterr()
    assert cli.main(["report", str(folder)]) == 0
    assert "| quantity | value | description |" in capsys.readouterr().out


def _failing_savefig(monkeypatch, fail_at=2):
    """Figure.savefig that writes part of a file and then finds the disk full, at call fail_at."""
    from matplotlib.figure import Figure

    calls = []
    original = Figure.savefig

    def savefig(self, fname, *args, **kwargs):
        calls.append(fname)
        if len(calls) >= fail_at:
            with open(fname, "wb") as f:
                f.write(b"\x89PNG partial")
            raise OSError(errno.ENOSPC, "No space left on device", str(fname))
        return original(self, fname, *args, **kwargs)

    monkeypatch.setattr(Figure, "savefig", savefig)
    return calls


def test_failed_write_leaves_no_run_folder(tmp_path, capsys, monkeypatch):
    pytest.importorskip("matplotlib")
    calls = _failing_savefig(monkeypatch)
    assert cli.main(["run", "identity", "--out", str(tmp_path / "runs"), *SMALL_IDENTITY]) == 2
    _one_line_error(capsys, "attngeom run:", "No space left on device")
    assert len(calls) == 2  # the failure came after a figure had been written
    assert _entries(tmp_path / "runs") == []  # neither a run folder nor its staging folder


def test_failed_demo_keeps_the_earlier_one(tmp_path, capsys, monkeypatch, small_demo):
    pytest.importorskip("matplotlib")
    out = tmp_path / "demo"
    assert cli.main(["demo", "--out", str(out), "--seed", "1"]) == 0
    before = {name: (out / name).read_bytes() for name in _entries(out)}
    assert "summary.json" in before
    _failing_savefig(monkeypatch)
    assert cli.main(["demo", "--out", str(out), "--seed", "2"]) == 2
    _one_line_error(capsys, "attngeom demo:", "No space left on device")
    assert {name: (out / name).read_bytes() for name in _entries(out)} == before
    assert _entries(tmp_path) == ["demo"]


def test_demo_replaces_its_earlier_output(tmp_path, capsys, small_demo):
    pytest.importorskip("matplotlib")
    out = tmp_path / "demo"
    assert cli.main(["demo", "--out", str(out), "--seed", "1"]) == 0
    (out / "stale.png").write_bytes(b"from an older version")
    assert cli.main(["demo", "--out", str(out), "--seed", "2"]) == 0
    assert "stale.png" not in _entries(out)  # replaced as a whole, not merged
    assert json.load(open(out / "config.json"))["seed"] == 2
    assert _entries(tmp_path) == ["demo"]
    (tmp_path / "empty").mkdir()
    assert cli.main(["demo", "--out", str(tmp_path / "empty")]) == 0  # an empty folder is taken
    assert "summary.json" in _entries(tmp_path / "empty")


# -- report ----------------------------------------------------------------------------------
def _fake_run(folder, **files):
    os.makedirs(folder)
    for name, content in {"config.json": "{}", "summary.json": "{}", "summary.md": "# x\n", **files}.items():
        if content is None:
            continue
        with open(os.path.join(folder, name), "wb" if isinstance(content, bytes) else "w") as f:
            f.write(content)
    return str(folder)


def test_report_on_broken_folders(tmp_path, capsys):
    assert cli.main(["report", _fake_run(tmp_path / "ok")]) == 0
    assert "# x" in capsys.readouterr().out
    bad = _fake_run(tmp_path / "binary", **{"summary.md": b"\xff\xfe\x00 not utf-8"})
    assert cli.main(["report", bad]) == 2
    _one_line_error(capsys, "summary.md' is not UTF-8 text")
    folder = _fake_run(tmp_path / "dir", **{"summary.md": None})
    os.mkdir(os.path.join(folder, "summary.md"))
    assert cli.main(["report", folder]) == 2
    _one_line_error(capsys, "is not a complete run folder: summary.md is missing or not a file")
    # what a crash used to leave: summary.json and some figures, but not everything
    partial = _fake_run(tmp_path / "partial", **{"summary.md": None, "config.json": None, "a.png": b"png"})
    assert cli.main(["report", partial]) == 2
    _one_line_error(capsys, "is not a complete run folder: config.json, summary.md are missing")
    # what a crash leaves now: only the hidden staging folder
    staging = _fake_run(tmp_path / ".identity_20260101_000000.1a2b3c4d.partial")
    assert cli.main(["report", staging]) == 2
    _one_line_error(capsys, "is not a complete run: it is the temporary folder of a run that was interrupted")
    assert cli.main(["report", str(tmp_path / "missing")]) == 2
    _one_line_error(capsys, "is not a folder")


def test_python_dash_m_exit_status(tmp_path):
    """The console entry point itself: exit status 2, one line, no traceback."""
    done = subprocess.run([sys.executable, "-m", "attngeom", "run", "identity", "--set", "n_heads=-3", "--out",
                           str(tmp_path)], capture_output=True, text=True, timeout=120)
    assert done.returncode == 2
    assert done.stderr == "attngeom run: n_heads must be an integer >= 1, got -3\n"
    assert _entries(tmp_path) == []


def test_drivers_check_their_config_when_called_from_python():
    from attngeom.experiments.identity import IdentityConfig, run_identity

    with pytest.raises(ValueError, match="n_heads must be an integer >= 1, got -3"):
        run_identity(IdentityConfig(n_heads=-3))
