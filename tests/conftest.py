import os
import sys

import numpy as np
import pytest

sys.path.insert(0, os.path.dirname(__file__))

# Tolerances: float64 kernels agree with the float64 references to a few ulps times the
# condition of the problem; float32 kernels accumulate in float32.
TOL = {np.float64: 1e-12, np.float32: 2e-5}


@pytest.fixture
def rng():
    return np.random.default_rng(1234)


def rel_err(a, b):
    a, b = np.asarray(a), np.asarray(b)
    return float(np.max(np.abs(a - b)) / max(np.max(np.abs(b)), 1e-300))


# -- order -------------------------------------------------------------------------------------
# `make test` runs the suite in several processes (pytest-xdist, --dist worksteal). Each process
# first takes a contiguous share of the collected tests (the first len // n, then the rest split
# alike), and one that runs out takes over the tail of the longest queue. A test that trains a
# model or executes a notebook takes up to minutes: started late it runs alone while the others
# wait, and several in a row on one process are the run's critical path. So the tests marked
# `heavy` are dealt round robin to the heads of the processes' shares (a module marked as a whole
# stays together: its module-scoped fixture trains once), and each process starts with them.
# Every process computes the same order (it depends only on the collection and the worker count),
# and one process keeps the collected order.
HEAVY = "heavy: trains a model, executes a notebook or builds the docs (tens of seconds to minutes); started first"


def pytest_configure(config):
    config.addinivalue_line("markers", HEAVY)


def heavy_first(items, workers):
    """items reordered so that each of `workers` contiguous shares starts with its round-robin
    part of the heavy groups (tests/conftest.py, order)."""
    groups, light = {}, []
    for item in items:
        marker = item.get_closest_marker("heavy")
        if marker is None:
            light.append(item)
        else:  # a module marked heavy as a whole (pytestmark) stays together
            marks = getattr(item.module, "pytestmark", []) if item.module is not None else []
            marks = marks if isinstance(marks, (list, tuple)) else [marks]
            whole_module = any(getattr(mark, "name", None) == "heavy" for mark in marks)
            groups.setdefault(item.module.__name__ if whole_module else item.nodeid, []).append(item)
    heavy = [[] for _ in range(workers)]
    for index, group in enumerate(groups.values()):
        heavy[index % workers].extend(group)
    out, remaining = [], len(items)
    for worker in range(workers):
        size = remaining // (workers - worker)
        take = max(size - len(heavy[worker]), 0)
        out += heavy[worker] + light[:take]
        light = light[take:]
        remaining -= size
    return out + light


@pytest.hookimpl(trylast=True)  # after pytest's own reordering by fixture scope
def pytest_collection_modifyitems(items):
    workers = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1"))
    if workers > 1:
        items[:] = heavy_first(items, workers)


# -- the skip budget ---------------------------------------------------------------------------
# Under CI=true a test that skips fails the run unless tests/allowed_skips.txt names it: a
# skip never hides lost coverage (a dependency dropped from the test extra, a module that
# stopped importing). Each line of that file is "<node id pattern> | <reason>" (fnmatch
# patterns against pytest's node ids, e.g. "tests/test_isa.py::test_levels*"); '#' starts a
# comment. An environment built for one purpose (make sanitize's, which has no PyTorch) names
# its own further file in ATTNGEOM_ALLOWED_SKIPS (paths separated by os.pathsep).
ALLOWED_SKIPS = os.path.join(os.path.dirname(__file__), "allowed_skips.txt")
_skipped = []


def allowed_skips(path=ALLOWED_SKIPS):
    """[(pattern, reason)] of the allowed-skips file."""
    out = []
    with open(path) as f:
        for number, line in enumerate(f, 1):
            line = line.split("#", 1)[0].strip()
            if not line:
                continue
            pattern, sep, reason = (part.strip() for part in line.partition("|"))
            if not sep or not pattern or not reason:
                raise ValueError(f"{path}:{number}: expected '<node id pattern> | <reason>', got {line!r}")
            out.append((pattern, reason))
    return out


def unexpected_skips(nodeids, allowed):
    """The node ids no pattern of `allowed` matches."""
    import fnmatch

    return [n for n in nodeids if not any(fnmatch.fnmatchcase(n, p) for p, _ in allowed)]


def _ci():
    return os.environ.get("CI", "").lower() in ("1", "true", "yes")


def pytest_collectreport(report):
    if report.skipped:  # a module-level importorskip
        _skipped.append((report.nodeid, str(report.longrepr)))


def pytest_runtest_logreport(report):
    if report.skipped and not hasattr(report, "wasxfail"):
        reason = report.longrepr[-1] if isinstance(report.longrepr, tuple) else str(report.longrepr)
        _skipped.append((report.nodeid, reason))


def pytest_sessionfinish(session, exitstatus):
    if not _ci() or session.config.option.collectonly:
        return
    allowed = allowed_skips()
    for extra in filter(None, os.environ.get("ATTNGEOM_ALLOWED_SKIPS", "").split(os.pathsep)):
        allowed += allowed_skips(extra)
    bad = unexpected_skips([n for n, _ in _skipped], allowed)
    session.config._skip_budget = (len(_skipped), [(n, r) for n, r in _skipped if n in bad])
    if bad and session.exitstatus == 0:
        session.exitstatus = pytest.ExitCode.TESTS_FAILED


def pytest_terminal_summary(terminalreporter):
    budget = getattr(terminalreporter.config, "_skip_budget", None)
    if budget is None:
        return
    count, bad = budget
    write = terminalreporter.write_line
    if bad:
        write(f"skip budget: {len(bad)} of {count} skipped tests are not allowed by tests/allowed_skips.txt (CI=true "
              f"fails on them):", red=True)
        for nodeid, reason in bad:
            write(f"  {nodeid}: {reason}", red=True)
    else:
        write(f"skip budget: {count} skipped, every one allowed")
