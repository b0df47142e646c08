"""The documentation a user reads is checked like code.

* numpydoc's validation over every public function (``attngeom.__all__`` and the public
  functions of :mod:`attngeom.plotting` and :mod:`attngeom.models`): a docstring exists
  (GL08), has a summary (SS01), documents every parameter (PR01), no parameter that does not
  exist (PR02), each with a description (PR07), a Returns section (RT01) and an Examples
  section (EX01).
* Every docstring example in the package runs as a doctest and its printed output is
  compared.
* The API reference (``make docs``) builds with Sphinx without a warning.
* Docstring text shared through ``attngeom._docstrings`` is filled in everywhere: no
  ``%(name)s`` placeholder is left in a docstring.
"""
import doctest
import importlib
import inspect
import os
import pathlib
import pkgutil
import re
import subprocess
import sys

import numpy as np
import pytest

import attngeom as ag

CHECKS = ("GL08", "SS01", "PR01", "PR02", "PR07", "RT01", "EX01")
ROOT = os.path.join(os.path.dirname(__file__), "..")


def public_functions():
    out = {}
    for name in ag.__all__:
        obj = getattr(ag, name)
        if inspect.isfunction(obj):
            out[f"attngeom.{name}"] = obj
    for mod in (ag.plotting, ag.models):
        names = getattr(mod, "__all__", None) or [n for n in vars(mod) if not n.startswith("_")]
        for name in names:
            obj = getattr(mod, name)
            if inspect.isfunction(obj) and obj.__module__.startswith(mod.__name__):
                out[f"{mod.__name__}.{name}"] = obj
    return out


PUBLIC = public_functions()

# Not yet converted to numpydoc. Each entry is a strict xfail: the test fails as soon as the
# docstring passes, so the entry must then be removed. Empty: every public function passes.
PENDING: set = set()


def _params(names):
    return [pytest.param(q, marks=pytest.mark.xfail(strict=True, reason="docstring not yet converted"))
            if q in PENDING else q for q in sorted(names)]


# Functions the validation must reach, from each place PUBLIC gathers them: if one drops out
# of __all__ (or the gathering breaks), its docstring would go unchecked.
REQUIRED = {"attngeom.softmax_attention", "attngeom.softmax_attention_backward", "attngeom.kernel_attention",
            "attngeom.random_feature_attention", "attngeom.sampled_attention", "attngeom.path_expansion",
            "attngeom.singular_values", "attngeom.radon", "attngeom.iradon", "attngeom.iradon_sart",
            "attngeom.stable_density", "attngeom.whiten", "attngeom.show_config",
            "attngeom.models.load_model", "attngeom.models.head_report", "attngeom.models.logit_lens",
            "attngeom.plotting.attention_heatmap", "attngeom.plotting.head_spectra"}


def test_the_validation_covers_the_documented_api():
    """PUBLIC, the functions numpydoc validates, holds the required names and every function of
    attngeom.__all__, and each of its functions is in the API reference (docs/api.rst): its
    module under ``automodule`` or the function under ``autofunction``."""
    assert REQUIRED <= set(PUBLIC), sorted(REQUIRED - set(PUBLIC))
    in_all = {f"attngeom.{n}" for n in ag.__all__ if inspect.isfunction(getattr(ag, n))}
    assert in_all <= set(PUBLIC), sorted(in_all - set(PUBLIC))
    api = pathlib.Path(ROOT, "docs", "api.rst").read_text()
    modules = set(re.findall(r"^\.\. automodule:: (\S+)", api, re.M))
    functions = set(re.findall(r"^\.\. autofunction:: (\S+)", api, re.M))
    undocumented = [q for q, f in PUBLIC.items() if f.__module__ not in modules and q not in functions]
    assert not undocumented, f"validated but not in docs/api.rst: {undocumented}"


def test_pending_list_names_public_functions():
    assert PENDING <= set(PUBLIC)  # noqa: C0325 (kept so a future entry must be a real name)


@pytest.mark.parametrize("qualname", _params(PUBLIC))
def test_numpydoc_validation(qualname):
    validate = pytest.importorskip("numpydoc.validate").validate
    func = PUBLIC[qualname]
    # by the defining module: ``attngeom.random_features`` names a module and a function
    result = validate(f"{func.__module__}.{func.__qualname__}")
    errors = [f"{code}: {msg}" for code, msg in result["errors"] if code in CHECKS]
    assert not errors, f"{qualname}:\n" + "\n".join(errors)


def package_modules():
    names = ["attngeom"]
    for info in pkgutil.walk_packages(ag.__path__, "attngeom."):
        # The compiled cores hold no doctests, and importing a level this CPU lacks (say
        # _core_avx512 on an AVX2 machine) is an illegal instruction: attngeom._core picks one.
        if info.name.endswith("__main__") or info.name.startswith("attngeom._core_"):
            continue
        names.append(info.name)
    return names


def _import(module):
    """The module; attngeom.torch (the one module that needs an optional dependency, PyTorch)
    is skipped where torch is not installed."""
    if module == "attngeom.torch" or module.startswith("attngeom.torch."):
        pytest.importorskip("torch", reason="attngeom.torch needs PyTorch")
    return importlib.import_module(module)


@pytest.mark.parametrize("module", package_modules())
def test_doctests(module, monkeypatch, tmp_path):
    monkeypatch.setenv("MPLBACKEND", "Agg")
    monkeypatch.chdir(tmp_path)  # examples that write files write them here
    mod = _import(module)
    runner = doctest.DocTestRunner(optionflags=doctest.ELLIPSIS | doctest.NORMALIZE_WHITESPACE)
    report = []
    # examples that read the packaged real model run only where it is installed (`make test`
    # installs the models extra, so there they always run)
    have_model = ag.models.packaged_model_path() is not None
    with np.printoptions(precision=4, suppress=True):
        for test in doctest.DocTestFinder().find(mod, module, globs={"np": np, "ag": ag}):
            needs_model = "all-MiniLM-L6-v2" in (test.docstring or "") or "packaged_model_path()" in (test.docstring or "")
            if test.examples and _own(test, mod) and (have_model or not needs_model):
                runner.run(test, out=report.append)
    try:
        import matplotlib.pyplot as plt
        plt.close("all")
    except ImportError:
        pass
    assert runner.failures == 0, "".join(report)


def _own(test, mod):
    """Doctests of objects defined in this module (not of names it imports)."""
    return test.filename is None or os.path.abspath(test.filename) == os.path.abspath(mod.__file__)


def test_every_public_function_has_a_running_example():
    """EX01 asks for an Examples section; this asks that it holds a doctest."""
    finder = doctest.DocTestFinder()
    missing = [q for q, f in PUBLIC.items()
               if q not in PENDING and not any(t.examples for t in finder.find(f, q))]
    assert not missing, missing


@pytest.mark.heavy
def test_api_reference_builds_without_warnings(tmp_path):
    pytest.importorskip("sphinx")
    pytest.importorskip("numpydoc")
    proc = subprocess.run([sys.executable, "-m", "sphinx", "-W", "--keep-going", "-E", "-q", "-b", "html",
                           os.path.join(ROOT, "docs"), str(tmp_path / "html")], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr[-5000:]
    assert (tmp_path / "html" / "api.html").exists()


PLACEHOLDER = re.compile(r"^\s*%\(\w+\)s\s*$", re.MULTILINE)


def _documented(module):
    """(qualified name, docstring) of the module and of every function, class and method it defines."""
    yield module.__name__, module.__doc__
    for name, obj in vars(module).items():
        if getattr(obj, "__module__", None) != module.__name__ or not (inspect.isfunction(obj) or inspect.isclass(obj)):
            continue
        yield f"{module.__name__}.{name}", obj.__doc__
        if inspect.isclass(obj):
            for attr, member in vars(obj).items():
                member = member.fget if isinstance(member, property) else member
                if inspect.isfunction(member):
                    yield f"{module.__name__}.{name}.{attr}", member.__doc__


@pytest.mark.parametrize("module", package_modules())
def test_docstring_fragments_are_filled(module):
    """A shared fragment (``%(name)s`` on a line of its own) left in a docstring means its
    function lacks the filling decorator: numpydoc would read the placeholder as a parameter."""
    mod = _import(module)
    unfilled = [name for name, doc in _documented(mod) if doc and PLACEHOLDER.search(doc)]
    assert not unfilled, unfilled


def test_docstring_fragment_filling():
    from attngeom._docstrings import filler

    @filler(answer="x : int\n    The answer.")
    def f(x):
        """Summary.

        Parameters
        ----------
        %(answer)s

        Returns 100%% of %(answer)s inline, untouched.
        """

    assert "        x : int\n            The answer.\n" in f.__doc__
    assert "100%% of %(answer)s inline" in f.__doc__
    with pytest.raises(KeyError, match="missing"):
        filler()(type("C", (), {"__doc__": "A.\n\n    %(missing)s\n"}))


CITATION = re.compile(r'docs/(\w+\.md), "([^"]+)"')


def test_cited_sections_exist():
    """Docstrings, comments and tests cite the design notes as ``docs/<file>.md, "<section>"``:
    the file and a heading of that name exist."""
    cited = []
    for folder in ("python", "tests", "cpp", "benchmarks"):
        for path in sorted(pathlib.Path(ROOT, folder).rglob("*")):
            if path.suffix in (".py", ".hpp", ".cpp"):
                cited += [(path.name, *m.groups()) for m in CITATION.finditer(path.read_text())]
    assert cited
    missing = []
    for where, document, section in cited:
        path = pathlib.Path(ROOT, "docs", document)
        headings = re.findall(r"^#+ (.+)$", path.read_text(), re.MULTILINE) if path.exists() else []
        if section not in headings:
            missing.append(f'{where}: docs/{document}, "{section}"')
    assert not missing, missing
