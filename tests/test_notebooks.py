"""Every notebook in notebooks/ runs top to bottom without error, at its small config.

Notebooks read ATTNGEOM_SMALL=1 in their first code cell and shrink their sizes (the same code
runs); they are stored without outputs.
"""
import glob
import os

import pytest

NOTEBOOKS = sorted(glob.glob(os.path.join(os.path.dirname(__file__), "..", "notebooks", "*.ipynb")))


@pytest.mark.parametrize("path", NOTEBOOKS, ids=os.path.basename)
def test_notebook_runs(path, tmp_path, monkeypatch):
    nbformat = pytest.importorskip("nbformat")
    nbclient = pytest.importorskip("nbclient")
    nb = nbformat.read(path, as_version=4)
    monkeypatch.setenv("ATTNGEOM_SMALL", "1")  # inherited by the kernel
    monkeypatch.setenv("MPLBACKEND", "Agg")
    nbclient.NotebookClient(nb, timeout=600, kernel_name="python3", resources={"metadata": {"path": str(tmp_path)}}).execute()


@pytest.mark.parametrize("path", NOTEBOOKS, ids=os.path.basename)
def test_notebook_stored_without_outputs(path):
    nbformat = pytest.importorskip("nbformat")
    nb = nbformat.read(path, as_version=4)
    for i, cell in enumerate(nb.cells):
        if cell.cell_type == "code":
            assert not cell.outputs and cell.execution_count is None, f"cell {i} of {os.path.basename(path)} has outputs"


def test_there_are_notebooks():
    assert NOTEBOOKS
