"""The collection order of tests/conftest.py: with several test processes the tests marked
`heavy` head the processes' shares, dealt round robin (a module marked as a whole together);
with one process the collected order is kept."""
import os

pytest_plugins = ["pytester"]

FILES = {
    "test_a": "def test_a1():\n    pass\n\ndef test_a2():\n    pass\n\ndef test_a3():\n    pass\n",
    "test_b": ("import pytest\n\n@pytest.mark.heavy\ndef test_b1():\n    pass\n\ndef test_b2():\n    pass\n\n"
               "@pytest.mark.heavy\ndef test_b3():\n    pass\n"),
    "test_c": ("import pytest\npytestmark = pytest.mark.heavy\n\ndef test_c1():\n    pass\n\n"
               "def test_c2():\n    pass\n"),
    "test_d": "def test_d1():\n    pass\n\ndef test_d2():\n    pass\n\ndef test_d3():\n    pass\n",
}


def _order(pytester, monkeypatch, workers, files=FILES):
    pytester.makeconftest(open(os.path.join(os.path.dirname(__file__), "conftest.py")).read())
    pytester.makepyfile(**files)
    if workers is None:
        monkeypatch.delenv("PYTEST_XDIST_WORKER_COUNT", raising=False)
    else:
        monkeypatch.setenv("PYTEST_XDIST_WORKER_COUNT", str(workers))
    result = pytester.runpytest_subprocess("--collect-only", "-q", "-p", "no:xdist")
    return [line.split("::")[1] for line in result.outlines if "::" in line]


def test_one_process_keeps_the_collected_order(pytester, monkeypatch):
    assert _order(pytester, monkeypatch, None) == [
        "test_a1", "test_a2", "test_a3", "test_b1", "test_b2", "test_b3", "test_c1", "test_c2",
        "test_d1", "test_d2", "test_d3"]


def test_heavy_tests_head_each_share(pytester, monkeypatch):
    # 11 tests, 2 processes: xdist gives the first 11 // 2 = 5 to one and 6 to the other. The heavy
    # groups b1, b3 and module c go round robin: b1 and c (together) to the first, b3 to the second.
    order = _order(pytester, monkeypatch, 2)
    assert order[:5] == ["test_b1", "test_c1", "test_c2", "test_a1", "test_a2"]
    assert order[5:] == ["test_b3", "test_a3", "test_b2", "test_d1", "test_d2", "test_d3"]


def test_a_module_mark_other_than_heavy_keeps_its_heavy_tests_apart(pytester, monkeypatch):
    # Module e is marked as a whole, but not heavy: its heavy tests e1 and e3 are dealt one by one.
    files = {"test_e": ("import pytest\npytestmark = pytest.mark.filterwarnings('ignore')\n\n"
                        "@pytest.mark.heavy\ndef test_e1():\n    pass\n\ndef test_e2():\n    pass\n\n"
                        "@pytest.mark.heavy\ndef test_e3():\n    pass\n\ndef test_e4():\n    pass\n")}
    assert _order(pytester, monkeypatch, 2, files) == ["test_e1", "test_e2", "test_e3", "test_e4"]
