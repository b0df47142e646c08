"""The package's import structure (docs/architecture.md, "Layers"): no module imports another module's private
names. Private infrastructure modules exist to be imported: the operand layer, the docstring
fragments, the compiled core, its configuration, durable (atomic, checksummed) files, the
short array summaries of result reprs, and the
experiment drivers' shared result, progress and resume helpers.
Benchmarks use the public API (and the core for their GEMM ceiling), never private helpers."""
from __future__ import annotations

import ast
import pathlib

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[1]
# The sources; where the tests run from a copy of tests/ (make test-wheel), the installed package.
PACKAGE = ROOT / "python" / "attngeom"
if not PACKAGE.is_dir():
    import attngeom

    PACKAGE = pathlib.Path(attngeom.__file__).resolve().parent
_HOME = PACKAGE.parent


def _rel(path: pathlib.Path) -> pathlib.Path:
    """A source's path as the repository names it (python/attngeom/...)."""
    if path.is_relative_to(_HOME):
        return pathlib.Path("python") / path.relative_to(_HOME)
    return path.relative_to(ROOT) if path.is_relative_to(ROOT) else path

INFRASTRUCTURE = {
    "attngeom._operands",
    "attngeom._operands.validation",
    "attngeom._operands.broadcast",
    "attngeom._operands.float_range",
    "attngeom._operands.layouts",
    "attngeom._docstrings",
    "attngeom._core",
    "attngeom._config",
    "attngeom._durable",
    "attngeom._deprecation",
    "attngeom._summary",
    "attngeom.experiments._result",
    "attngeom.experiments._progress",
    "attngeom.experiments._resume",
}


def _module_name(path: pathlib.Path) -> str:
    if path.is_relative_to(PACKAGE):
        parts = ("attngeom",) + path.relative_to(PACKAGE).with_suffix("").parts
        return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
    return "benchmarks." + path.stem


def _package_of(path: pathlib.Path, name: str) -> str:
    return name if path.name == "__init__.py" else name.rpartition(".")[0]


def _resolve(path: pathlib.Path, name: str, node: ast.ImportFrom) -> str:
    if node.level == 0:
        return node.module or ""
    base = _package_of(path, name).split(".")
    base = base[: len(base) - (node.level - 1)]
    return ".".join(base + ([node.module] if node.module else []))


def _private(part: str) -> bool:
    return part.startswith("_") and not (part.startswith("__") and part.endswith("__"))


def _violations(path: pathlib.Path) -> list:
    """(line, what) for every import of a private name or module that is not infrastructure."""
    name = _module_name(path)
    out = []
    for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
        if isinstance(node, ast.ImportFrom):
            source = _resolve(path, name, node)
            targets = [(source, alias.name) for alias in node.names]
        elif isinstance(node, ast.Import):
            targets = [(alias.name.rpartition(".")[0], alias.name.rpartition(".")[2]) for alias in node.names]
        else:
            continue
        for source, imported in targets:
            if not source.startswith("attngeom"):
                continue
            full = f"{source}.{imported}" if source else imported
            if full in INFRASTRUCTURE or source in INFRASTRUCTURE:
                continue  # infrastructure modules and names from them
            private_module = any(_private(p) for p in source.split("."))
            if private_module or _private(imported):
                out.append((node.lineno, f"from {source} import {imported}"))
    return out


def _sources():
    files = sorted(PACKAGE.rglob("*.py")) + sorted((ROOT / "benchmarks").glob("*.py"))
    return [f for f in files if "__pycache__" not in f.parts]


@pytest.mark.parametrize("path", _sources(), ids=lambda p: str(_rel(p)))
def test_no_module_imports_another_modules_private_names(path):
    bad = _violations(path)
    assert not bad, f"{_rel(path)} imports private names: " + "; ".join(
        f"line {line}: {what}" for line, what in bad)


def test_the_checker_catches_private_imports(tmp_path):
    pkg = tmp_path / "python" / "attngeom"
    pkg.mkdir(parents=True)
    bad = pkg / "bad.py"
    bad.write_text("from .attention import _helper\nfrom ._operands import operand\nfrom . import _core\n"
                   "from .experiments._timing import median_time\n")
    global PACKAGE
    saved = PACKAGE
    PACKAGE = pkg
    try:
        found = [what for _, what in _violations(bad)]
    finally:
        PACKAGE = saved
    assert found == ["from attngeom.attention import _helper",
                     "from attngeom.experiments._timing import median_time"]


def _module_imports(path: pathlib.Path) -> set:
    """The attngeom modules `path` imports, at any level (lazy imports inside functions too)."""
    name = _module_name(path)
    out = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom):
            source = _resolve(path, name, node)
            for alias in node.names:
                sub = f"{source}.{alias.name}"
                out.add(sub if _is_module(sub) or sub in INFRASTRUCTURE else source)
        elif isinstance(node, ast.Import):
            out.update(alias.name for alias in node.names)
    return {m for m in out if m.startswith("attngeom") and m != name}


def _is_module(name: str) -> bool:
    rel = pathlib.Path(*name.split(".")[1:])
    return (PACKAGE / rel).with_suffix(".py").exists() or (PACKAGE / rel / "__init__.py").exists()


def test_no_import_cycles():
    """The modules of the package form a DAG (packages' __init__ files, which only re-export,
    are left out as sources of edges)."""
    graph = {_module_name(p): _module_imports(p) for p in sorted(PACKAGE.rglob("*.py"))
             if p.name != "__init__.py" and "__pycache__" not in p.parts}
    state, stack = {}, []

    def visit(node):
        state[node] = "open"
        stack.append(node)
        for nxt in sorted(graph.get(node, ())):
            if state.get(nxt) == "open":
                cycle = stack[stack.index(nxt):] + [nxt]
                pytest.fail("import cycle: " + " -> ".join(cycle))
            if nxt not in state:
                visit(nxt)
        stack.pop()
        state[node] = "done"

    for node in sorted(graph):
        if node not in state:
            visit(node)


MODEL_LAYERS = ("io", "nn", "analysis")  # attngeom.models' layers, each importing only those before it


def _model_layer(module: str):
    """The models layer of a module name ("io", "nn", "analysis"), None outside them."""
    parts = module.split(".")
    return parts[2] if parts[:2] == ["attngeom", "models"] and len(parts) > 2 and parts[2] in MODEL_LAYERS else None


def _layer_violations(path: pathlib.Path) -> list:
    """The attngeom.models modules `path` imports from a layer above its own (or the package)."""
    layer = _model_layer(_module_name(path))
    allowed = MODEL_LAYERS[: MODEL_LAYERS.index(layer) + 1]
    return sorted(m for m in _module_imports(path)
                  if m.startswith("attngeom.models") and _model_layer(m) not in allowed)


def _model_sources():
    return [p for p in sorted((PACKAGE / "models").rglob("*.py")) if "__pycache__" not in p.parts
            and p != PACKAGE / "models" / "__init__.py"]


@pytest.mark.parametrize("path", _model_sources(), ids=lambda p: str(_rel(p)))
def test_models_layers_import_only_the_layers_before_them(path):
    """io (formats, checkpoints) imports nothing of nn or analysis; nn (the transformer) imports
    io; analysis imports io and nn. Only attngeom.models/__init__.py re-exports all three."""
    assert _model_layer(_module_name(path)) is not None, f"{_rel(path)} is in no layer of {MODEL_LAYERS}"
    bad = _layer_violations(path)
    assert not bad, f"{_rel(path)} imports a later layer: {', '.join(bad)}"


def test_the_checker_catches_layer_violations(tmp_path):
    global PACKAGE
    for sub in MODEL_LAYERS:
        (tmp_path / "models" / sub).mkdir(parents=True)
        (tmp_path / "models" / sub / "m.py").write_text("")
    bad = tmp_path / "models" / "nn" / "bad.py"
    bad.write_text("from ..io.m import a\nfrom . import m\n\ndef f():\n    from ..analysis import m\n")
    saved, PACKAGE = PACKAGE, tmp_path
    try:
        found = _layer_violations(bad)
    finally:
        PACKAGE = saved
    assert found == ["attngeom.models.analysis.m"]


ANALYSIS = PACKAGE / "models" / "analysis"


def _analysis_violations(source: str, name: str, package: bool = False) -> list:
    """(line, what) for every reach of an analysis module (source, module `name`) into nn's
    internals: an attribute ``x._name`` (single underscore; ``self`` and ``cls`` excepted), the
    decoder object (``x.decoder``: nn's own; analyses use Model's public methods), and a private
    name or module imported from attngeom.models.nn."""
    out = []
    base = name.split(".") if package else name.split(".")[:-1]
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Attribute):
            owner = node.value.id if isinstance(node.value, ast.Name) else None
            if _private(node.attr) and owner not in ("self", "cls"):
                out.append((node.lineno, f"private attribute .{node.attr}"))
            elif node.attr == "decoder":
                out.append((node.lineno, "the decoder (.decoder)"))
        elif isinstance(node, ast.ImportFrom):
            if node.level == 0:
                source_module = node.module or ""
            else:
                source_module = ".".join(base[: len(base) - (node.level - 1)] + ([node.module] if node.module else []))
            if not source_module.startswith("attngeom.models.nn"):
                continue
            for alias in node.names:
                if _private(alias.name) or any(_private(p) for p in source_module.split(".")):
                    out.append((node.lineno, f"from {source_module} import {alias.name}"))
    return out


@pytest.mark.parametrize("path", [p for p in sorted(ANALYSIS.rglob("*.py")) if "__pycache__" not in p.parts],
                         ids=lambda p: str(_rel(p)))
def test_analysis_uses_only_the_public_api_of_nn(path):
    """attngeom.models.analysis reaches the transformer through Model's public methods and
    nn's public names only (Model.run_from, final_norm, unembedding, layer_weights, ...): no
    private attribute, no decoder object, no private import."""
    bad = _analysis_violations(path.read_text(), _module_name(path), path.name == "__init__.py")
    assert not bad, f"{_rel(path)} reaches into nn's internals: " + "; ".join(
        f"line {line}: {what}" for line, what in bad)


def test_the_checker_catches_private_access_from_analysis():
    source = ("from ..nn.forward import _plan, check_layers\n"
              "from ..nn import _secret\n"
              "from attngeom.models.nn._impl import thing\n"
              "from ..io._private import fine_here\n"
              "class A:\n"
              "    def f(self, model, h):\n"
              "        self._cache = cls_free = model.forward(h)\n"
              "        out = model._resume(0, h)\n"
              "        w = model.decoder.w['unembed']\n"
              "        return model.__class__, out.__dict__, w\n")
    found = _analysis_violations(source, "attngeom.models.analysis.bad")
    assert sorted(found) == [(1, "from attngeom.models.nn.forward import _plan"),
                             (2, "from attngeom.models.nn import _secret"),
                             (3, "from attngeom.models.nn._impl import thing"),
                             (8, "private attribute ._resume"),
                             (9, "the decoder (.decoder)")]


STREAM_HEADERS = ("<iostream>", "<sstream>", "<fstream>", "<istream>", "<ostream>", "<locale>", "<iomanip>")


def test_the_core_uses_no_stream_or_locale_objects():
    """Messages format numbers with snprintf, never a string stream. A compiler whose
    libstdc++ is linked statically (a GCC 13.3 build seen on a 16-core Xeon) puts a second copy
    of the locale machinery into every core module; the process already holds the shared
    libstdc++, the facet ids of the two copies disagree, and `ostringstream << double` jumped
    into codecvt<char16_t>::do_length: a segmentation fault in every Gaussian and Cauchy call
    (their range check formatted sigma or gamma) and in every range refusal."""
    bad = []
    for path in sorted((ROOT / "cpp").rglob("*.[ch]pp")):
        for number, line in enumerate(path.read_text().splitlines(), 1):
            code = line.split("//")[0]
            if any(h in code for h in STREAM_HEADERS) or "std::cout" in code or "stringstream" in code:
                bad.append(f"{_rel(path)}:{number}: {line.strip()}")
    assert not bad, "stream or locale objects in the core:\n" + "\n".join(bad)


TESTS = ROOT / "tests"


def _test_file_imports(path: pathlib.Path) -> list:
    """(line, module) for every import, at any level, of another test file (test_*.py)."""
    test_files = {p.stem for p in TESTS.glob("test_*.py")}
    out = []
    for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
        if isinstance(node, ast.ImportFrom):
            names = [node.module or ""] + [f"{node.module or ''}.{alias.name}" for alias in node.names]
        elif isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        else:
            continue
        out += [(node.lineno, n.strip(".")) for n in names if n.rpartition(".")[2] in test_files]
    return out


def test_no_test_file_imports_another():
    """Shared builders, references and checks live in the helper modules (tests/*.py that are
    neither test files nor conftest); a test file imports only those."""
    bad = [f"{p.name}:{line}: {module}" for p in sorted(TESTS.glob("*.py")) for line, module in _test_file_imports(p)]
    assert not bad, "test files importing test files:\n" + "\n".join(bad)


def test_the_checker_catches_test_file_imports(tmp_path):
    bad = tmp_path / "test_bad.py"
    bad.write_text("import builders\nfrom test_attention import x\nfrom tests import test_mla\n\n"
                   "def f():\n    import tests.test_cli\n")
    assert sorted(_test_file_imports(bad)) == [(2, "test_attention"), (3, "tests.test_mla"), (6, "tests.test_cli")]


def test_models_corpus_and_the_version_load_on_first_use():
    """``import attngeom`` leaves real models, corpus runs and importlib.metadata unloaded (half
    its import time); the lazy names answer with the objects of their modules, ``dir`` and
    ``from attngeom import *`` see them, and an unknown name is an AttributeError."""
    import os
    import subprocess
    import sys

    import attngeom

    code = ("import sys, attngeom; print(sorted(m for m in ('attngeom.models', 'attngeom.corpus', "
            "'importlib.metadata', 'email') if m in sys.modules))")
    env = dict(os.environ, PYTHONPATH=str(pathlib.Path(attngeom.__file__).resolve().parents[1]))
    out = subprocess.run([sys.executable, "-c", code], check=True, capture_output=True, text=True, env=env).stdout
    assert out.strip() == "[]"
    import attngeom.corpus
    import attngeom.models
    from importlib import metadata

    assert attngeom.__version__ == metadata.version("attngeom")
    for name, (module, attribute) in attngeom._LAZY.items():
        expected = sys.modules[f"attngeom.{module}"]
        assert getattr(attngeom, name) is (expected if attribute is None else getattr(expected, attribute))
        assert name in dir(attngeom)
    assert set(attngeom._LAZY) <= set(attngeom.__all__) | {"models", "corpus"}
    space: dict = {}
    exec("from attngeom import *", space)
    assert space["Model"] is attngeom.models.Model and space["corpus_statistics"] is attngeom.corpus.corpus_statistics
    with pytest.raises(AttributeError, match="has no attribute 'no_such_name'"):
        attngeom.no_such_name
