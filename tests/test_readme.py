"""The README's examples run as written: every Python block (and those of docs/guide.md) is
executed, and every `attngeom ...` shell line is a valid command of the CLI."""
import dataclasses
import os
import re
import shlex

import pytest

ROOT = os.path.join(os.path.dirname(__file__), "..")
DOCUMENTS = ["README.md", os.path.join("docs", "guide.md")]


def _blocks(document, language):
    text = open(os.path.join(ROOT, document)).read()
    return re.findall(rf"```{language}\n(.*?)```", text, re.S)


@pytest.mark.parametrize("document", DOCUMENTS)
def test_python_blocks_run(document):
    blocks = _blocks(document, "python")
    assert blocks
    for block in blocks:
        exec(compile(block, document, "exec"), {})


def test_shell_lines_are_valid_commands():
    from attngeom.cli import build_parser
    from attngeom.experiments import EXPERIMENTS

    lines = [line.split("#")[0].strip() for document in DOCUMENTS for language in ("sh", "bash")
             for block in _blocks(document, language) for line in block.splitlines()]
    commands = [shlex.split(line) for line in lines if line.startswith("attngeom ")]
    assert commands
    parser = build_parser()
    for words in commands:
        args = parser.parse_args(words[1:])  # exits (SystemExit) on an unknown command or option
        if args.command == "run":
            assert args.experiment in EXPERIMENTS, words
            fields = {f.name for f in dataclasses.fields(EXPERIMENTS[args.experiment][0])}
            for item in args.set or []:  # --set keys are fields of the experiment's config
                assert item.split("=", 1)[0] in fields, (words, item)


@pytest.mark.heavy
def test_induction_recipe_runs_verbatim(tmp_path, monkeypatch, capsys):
    """Section 3's two commands, word for word: the run forms the circuit (its summary reports the
    phase change and the heads), and `attngeom heads` on its checkpoint leads with them."""
    pytest.importorskip("torch")
    pytest.importorskip("matplotlib")
    import glob
    import json

    from attngeom.cli import main

    text = open(os.path.join(ROOT, "README.md")).read()
    lines = [line.split("#")[0].strip() for block in re.findall(r"```sh\n(.*?)```", text, re.S)
             for line in block.splitlines()]
    run = next(line for line in lines if line.startswith("attngeom run induction"))
    heads = next(line for line in lines if line.startswith("attngeom heads runs/induction_<time>"))
    monkeypatch.chdir(tmp_path)
    assert main(shlex.split(run)[1:]) == 0
    (folder,) = glob.glob("runs/induction_*")
    summary = json.load(open(os.path.join(folder, "summary.json")))["summary"]
    assert summary["phase_change_found_2layer"] == 1
    assert 600 <= summary["phase_change_step_2layer"] <= 1000
    assert summary["final_induction_score_2layer"] > 0.6
    md = open(os.path.join(folder, "summary.md")).read()
    verdict = next(line for line in md.splitlines() if line.startswith("- 2layer, seed 0:"))
    assert "phase change at step" in verdict and "the circuit: L0H" in verdict and "(induction)" in verdict
    induction_head = re.search(r"L1H(\d) \(induction\)", verdict).group(1)
    # notes.txt: a text in the model's characters, with repeats an induction head can complete
    with open("notes.txt", "w") as f:
        f.write("The cat sat on the mat. The cat sat on the mat.\n\nTo be or not to be. To be or not to be.\n")
    assert main(shlex.split(heads.replace("<time>", folder.split("induction_")[1]))[1:]) == 0
    report = open("heads_report/report.html").read()
    first = report[:report.index("Where each head looks")]  # the first screen: the title and the leads
    assert f"Induction head: L1H{induction_head}" in first
    import attngeom as ag

    model = ag.load_model(os.path.join(folder, "checkpoints", "2layer", "seed0", "step001200"))
    scores = ag.models.induction_scores(model)  # the default probe fits the trained context: the run's number
    assert scores.induction.max() == pytest.approx(summary["final_induction_score_2layer"], abs=1e-9)
    assert "4 sequences of 32 distinct random tokens repeated 2 times" in first
    assert "4 sequences of 32 distinct random tokens repeated twice" in md

