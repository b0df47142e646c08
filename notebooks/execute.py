"""Run notebooks top to bottom at the small size and store their outputs (``make notebooks``).

    python notebooks/execute.py notebooks/*.ipynb

Each notebook runs in a fresh kernel with ATTNGEOM_SMALL=1 (smaller sizes, same code) inside a
temporary folder, so files a notebook writes do not land in the repository. Figures are kept
as the inline backend renders them, so a reader browsing the repository sees them. The test
suite (tests/test_notebooks.py) executes the same notebooks again and checks that the stored
outputs come from one complete run.
"""
import os
import sys
import tempfile

import nbclient
import nbformat


def execute(path: str) -> None:
    nb = nbformat.read(path, as_version=4)
    env_backup = dict(os.environ)
    os.environ["ATTNGEOM_SMALL"] = "1"
    os.environ.pop("MPLBACKEND", None)  # the kernel's inline backend renders the figures
    try:
        with tempfile.TemporaryDirectory() as tmp:
            client = nbclient.NotebookClient(nb, timeout=900, kernel_name="python3", record_timing=False,
                                             resources={"metadata": {"path": tmp}})
            client.execute()
    finally:
        os.environ.clear()
        os.environ.update(env_backup)
    nbformat.write(nb, path)
    print(f"executed {path}")


if __name__ == "__main__":
    paths = sys.argv[1:]
    if not paths:
        sys.exit(__doc__)
    for p in paths:
        execute(p)
