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


def _run(pytester, monkeypatch, ci, allowed="", extra=None):
    pytester.makeconftest(open(os.path.join(os.path.dirname(__file__), "conftest.py")).read())
    (pytester.path / "allowed_skips.txt").write_text(allowed)
    pytester.makepyfile(test_planted=PLANTED, test_kept="def test_kept():\n    pass\n")
    monkeypatch.setenv("CI", "true" if ci else "")
    if extra is None:
        monkeypatch.delenv("ATTNGEOM_ALLOWED_SKIPS", raising=False)
    else:
        (pytester.path / "extra_skips.txt").write_text(extra)
        monkeypatch.setenv("ATTNGEOM_ALLOWED_SKIPS", str(pytester.path / "extra_skips.txt"))
    return pytester.runpytest_subprocess("-p", "no:cacheprovider")


def test_a_planted_skip_fails_under_ci(pytester, monkeypatch):
    result = _run(pytester, monkeypatch, ci=True)
    assert result.ret == pytest.ExitCode.TESTS_FAILED
    result.stdout.fnmatch_lines(["*skip budget: 1 of 1 skipped tests are not allowed by tests/allowed_skips.txt*",
                                 "*test_planted.py*a_module_that_is_not_installed*"])


def test_an_allowed_skip_and_a_local_run_pass(pytester, monkeypatch):
    allowed = "test_planted.py | the planted module is absent on purpose\n"
    result = _run(pytester, monkeypatch, ci=True, allowed=allowed)
    assert result.ret == pytest.ExitCode.OK
    result.stdout.fnmatch_lines(["*skip budget: 1 skipped, every one allowed*"])
    assert _run(pytester, monkeypatch, ci=False).ret == pytest.ExitCode.OK


def test_an_environment_names_its_own_further_skips(pytester, monkeypatch):
    # make sanitize's environment (no PyTorch) adds tests/allowed_skips_sanitize.txt this way
    extra = "test_planted.py | this environment lacks the planted module on purpose\n"
    assert _run(pytester, monkeypatch, ci=True, extra=extra).ret == pytest.ExitCode.OK
    other = "test_other.py | a pattern that matches nothing planted here\n"
    assert _run(pytester, monkeypatch, ci=True, extra=other).ret == pytest.ExitCode.TESTS_FAILED


def test_the_sanitizer_list_allows_only_what_that_environment_lacks():
    entries = allowed_skips(os.path.join(os.path.dirname(__file__), "allowed_skips_sanitize.txt"))
    assert entries and all(len(reason) > 20 for _, reason in entries)
    torch_free = ["tests/test_attention_backward.py::test_softmax_backward_equals_finite_differences",
                  "tests/test_radon.py::test_sart_against_scikit_image"]
    assert unexpected_skips(torch_free, entries) == torch_free  # only the PyTorch comparisons may skip
    assert unexpected_skips(["tests/test_variants_backward.py::test_whiten_backward_matches_torch_autograd[True]"],
                            entries) == []


def test_the_allowed_list_is_well_formed(tmp_path):
    entries = allowed_skips(ALLOWED_SKIPS)
    assert entries and all(len(reason) > 20 for _, reason in entries)  # each with its reason
    assert unexpected_skips(["tests/test_cli.py::test_out_in_a_read_only_folder", "tests/test_x.py"], entries) \
        == ["tests/test_x.py"]
    bad = tmp_path / "bad.txt"
    bad.write_text("tests/test_x.py\n")
    with pytest.raises(ValueError, match="bad.txt:1: expected '<node id pattern> \\| <reason>'"):
        allowed_skips(bad)
