"""The skip budget of tests/conftest.py: under CI=true a skip that tests/allowed_skips.txt does
not name fails the run; a named one, or any skip without CI, does not."""
import os

import pytest

from conftest import ALLOWED_SKIPS, allowed_skips, unexpected_skips

pytest_plugins = ["pytester"]

PLANTED = """
import pytest
pytest.importorskip("a_module_that_is_not_installed")


def test_lost():
    pass
"""


def _run(pytester, monkeypatch, ci, allowed=""):
    pytester.makeconftest(open(os.path.join(os.path.dirname(__file__), "conftest.py")).read())
    (pytester.path / "allowed_skips.txt").write_text(allowed)
    pytester.makepyfile(test_planted=PLANTED, test_kept="def test_kept():\n    pass\n")
    monkeypatch.setenv("CI", "true" if ci else "")
    return pytester.runpytest_subprocess("-p", "no:cacheprovider")


def test_a_planted_skip_fails_under_ci(pytester, monkeypatch):
    result = _run(pytester, monkeypatch, ci=True)
    assert result.ret == pytest.ExitCode.TESTS_FAILED
    result.stdout.fnmatch_lines(["*skip budget: 1 of 1 skipped tests are not in tests/allowed_skips.txt*",
                                 "*test_planted.py*a_module_that_is_not_installed*"])


def test_an_allowed_skip_and_a_local_run_pass(pytester, monkeypatch):
    allowed = "test_planted.py | the planted module is absent on purpose\n"
    result = _run(pytester, monkeypatch, ci=True, allowed=allowed)
    assert result.ret == pytest.ExitCode.OK
    result.stdout.fnmatch_lines(["*skip budget: 1 skipped, every one allowed*"])
    assert _run(pytester, monkeypatch, ci=False).ret == pytest.ExitCode.OK


def test_the_allowed_list_is_well_formed(tmp_path):
    entries = allowed_skips(ALLOWED_SKIPS)
    assert entries and all(len(reason) > 20 for _, reason in entries)  # each with its reason
    assert unexpected_skips(["tests/test_cli.py::test_out_in_a_read_only_folder", "tests/test_x.py"], entries) \
        == ["tests/test_x.py"]
    bad = tmp_path / "bad.txt"
    bad.write_text("tests/test_x.py\n")
    with pytest.raises(ValueError, match="bad.txt:1: expected '<node id pattern> \\| <reason>'"):
        allowed_skips(bad)
