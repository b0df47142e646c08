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
