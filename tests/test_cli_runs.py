"""``attngeom run`` as a user meets it: the help lists every experiment with what it does,
Ctrl-C and SIGTERM stop a run with one line (a training run's keeps its staging folder and
says how to resume it), and warnings are one line each without a source line."""
import glob
import os
import signal
import subprocess
import sys
import time
import warnings

import pytest

from attngeom import cli
from attngeom.experiments import EXPERIMENTS


def test_run_help_lists_the_experiments(capsys):
    with pytest.raises(SystemExit):
        cli.main(["run", "--help"])
    out = capsys.readouterr().out
    for name in EXPERIMENTS:
        line = next((l for l in out.splitlines() if l.strip().startswith(name + " ")), None)
        assert line is not None, name
        assert len(line.split(None, 1)[1]) > 20  # with a one-line description
    assert "Induction heads forming in training" in out and "small character GPTs" in out
    top = cli.build_parser().format_help()
    assert "synthetic" not in top.split("run ", 1)[1].splitlines()[0]


@pytest.mark.parametrize("error, status, word", [(KeyboardInterrupt, 130, "interrupted"),
                                                 (cli._Terminated, 143, "terminated (SIGTERM)")])
def test_interrupted_command_is_one_line(monkeypatch, capsys, error, status, word):
    def stop(args):
        raise error()

    monkeypatch.setattr(cli, "_config", stop)
    assert cli.main(["config"]) == status
    assert capsys.readouterr().err == f"attngeom config: {word}\n"


def test_sigterm_handler_is_restored():
    before = signal.getsignal(signal.SIGTERM)
    cli.main(["list"])
    assert signal.getsignal(signal.SIGTERM) is before


def test_warnings_are_one_line(monkeypatch, capsys):
    def warn(args):
        warnings.warn("something to know", UserWarning)
        return 0

    monkeypatch.setattr(cli, "_config", warn)
    assert cli.main(["config"]) == 0
    assert capsys.readouterr().err == "attngeom config: warning: something to know\n"


TRAINING = ["variants=standard", "iterations=100000", "eval_every=5", "seeds=1", "timing=False", "corpus=markov",
            "markov_chars=5000", "d_model=16", "context=8", "batch=8", "eval_windows=8", "geometry_batch=8",
            "checkpoints=False"]


@pytest.mark.parametrize("sig, status", [(signal.SIGINT, 130), (signal.SIGTERM, 143)])
def test_signal_stops_a_training_run_with_one_line(tmp_path, sig, status):
    """The run is started as a user would, in its own process group (Ctrl-C signals the whole
    group); once its first state is saved the signal arrives: stderr is the one resume line,
    the staging folder stays and the exit status is 128 + the signal."""
    pytest.importorskip("torch")
    pytest.importorskip("matplotlib")
    out = tmp_path / "runs"
    cmd = [sys.executable, "-m", "attngeom", "run", "training", "--out", str(out)]
    for item in TRAINING:
        cmd += ["--set", item]
    # SIGINT as a terminal leaves it: a test run started in the background (`make test &`) ignores
    # SIGINT, and an ignored signal stays ignored in children, where Python then never raises
    # KeyboardInterrupt
    p = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True,
                         preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    try:
        deadline = time.monotonic() + 120
        while not glob.glob(str(out / ".*.partial" / "state" / "*")):
            assert p.poll() is None and time.monotonic() < deadline, p.communicate()
            time.sleep(0.05)
        os.killpg(p.pid, sig)
        stdout, stderr = p.communicate(timeout=60)
    finally:
        if p.poll() is None:
            p.kill()
    assert p.returncode == status, stderr
    (staging,) = glob.glob(str(out / ".*.partial"))
    assert stderr == (f"attngeom run training: interrupted; `attngeom run training --resume {staging}` continues it "
                      f"from the last saved state\n")
    assert os.path.isdir(os.path.join(staging, "state")) and os.listdir(out) == [os.path.basename(staging)]


def test_context_warnings_are_capped(monkeypatch, capsys):
    from attngeom.errors import ContextWarning

    def warn(args):
        for i in range(cli.CONTEXT_WARNINGS + 4):
            warnings.warn(f"text {i} is long", ContextWarning)
        return 0

    monkeypatch.setattr(cli, "_config", warn)
    assert cli.main(["config"]) == 0
    lines = capsys.readouterr().err.splitlines()
    assert len(lines) == cli.CONTEXT_WARNINGS + 1 and lines[0] == "attngeom config: warning: text 0 is long"
    assert lines[-1] == "attngeom config: warning: further warnings about the model's context are not shown"
