"""The values the README's comments promise are the values its code prints: every
``print(...)  # ~<number>`` line of a Python block prints a number of that order."""
import contextlib
import io
import os
import re

ROOT = os.path.join(os.path.dirname(__file__), "..")


def test_approximate_values_in_comments_are_what_runs():
    text = open(os.path.join(ROOT, "README.md")).read()
    checked = 0
    for block in re.findall(r"```python\n(.*?)```", text, re.S):
        lines = block.splitlines()
        for i, line in enumerate(lines):
            m = re.search(r"^print\(.*#\s*~([0-9.]+e-?[0-9]+)", line)
            if not m:
                continue
            out = io.StringIO()
            with contextlib.redirect_stdout(out):
                exec(compile("\n".join(lines[:i + 1]), "README.md", "exec"), {})
            printed = float(out.getvalue().split()[-1])
            promised = float(m.group(1))
            assert promised / 10 < printed < promised * 10, (line, printed)
            checked += 1
    assert checked >= 1
