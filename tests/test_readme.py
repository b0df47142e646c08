"""The README's Python example runs as written."""
import os
import re


def test_readme_example_runs():
    text = open(os.path.join(os.path.dirname(__file__), "..", "README.md")).read()
    blocks = re.findall(r"```python\n(.*?)```", text, re.S)
    assert blocks
    for block in blocks:
        exec(compile(block, "README.md", "exec"), {})
