"""The interactive head view (ag.models.head_view) and report.html's leads, in a real browser.

The view's data are the forward pass's: the weights of its window equal Forward.pattern and
its statistics the streaming ones. In headless Chromium (Debian's chromium and chromedriver,
driven by Selenium: nothing is downloaded when the test runs) the page is opened, a token
hovered, a layer and head chosen, and the weights the page shows are read back and compared
with Forward.pattern to 1e-6, with no console error. The browser tests skip where Chromium,
its driver or Selenium is missing (tests/allowed_skips.txt; `.ci/run` installs them).
"""
import json
import os
import shutil
import time

import numpy as np
import pytest

import attngeom as ag
from attngeom.models import head_report, head_view, load_model

from checkpoints import random_checkpoint

CHROMIUM = next((p for p in (shutil.which("chromium"), shutil.which("chromium-browser"),
                             shutil.which("chromium-headless-shell")) if p), None)
DRIVER = shutil.which("chromedriver")


@pytest.fixture(scope="module")
def qwen3(tmp_path_factory):
    return load_model(random_checkpoint("qwen3", tmp_path_factory.mktemp("qwen3") / "m"))


def _pattern(model, ids):
    P = model.forward(np.asarray(ids), keep=("pattern",)).pattern
    return P[:, 0] if P.ndim == 5 else P


def test_view_holds_the_forward_pass(qwen3):
    ids = np.random.default_rng(0).integers(0, 97, 40)
    view = head_view(qwen3, ids)
    P = _pattern(qwen3, ids)
    assert view.routing.shape == P.shape == (2, 4, 40, 40)
    np.testing.assert_array_equal(view.routing, P)
    st = qwen3.forward(ids, keep=("attention_stats",)).attention_stats
    for k in ("entropy", "sink_weight", "mean_distance"):
        np.testing.assert_allclose(view.stats[k], np.asarray(getattr(st, k)).reshape(2, 4, 40), atol=1e-6)
        np.testing.assert_allclose(view.means[k], np.asarray(getattr(st, k)).reshape(2, 4, 40).mean(-1), atol=1e-6)
    assert not view.outside.any()
    inner = head_view(qwen3, ids, window=(10, 30))  # a window inside the text: its rows, its keys, the rest apart
    np.testing.assert_allclose(inner.routing, P[:, :, 10:30, 10:30], atol=1e-6)
    np.testing.assert_allclose(inner.outside, P[:, :, 10:30, :10].sum(-1), atol=1e-6)
    assert "40 tokens" in repr(view) and "<script" in view._repr_html_()
    with pytest.raises(ValueError, match="window must satisfy"):
        head_view(qwen3, ids, window=(30, 50))
    for bad, says in [(dict(window=(1.9, 5.9)), r"window\[0\] must be an integer >= 0, got 1.9"),
                      (dict(window=(1, 2, 3)), "window must be a token count or \\(start, stop\\)"),
                      (dict(max_length=-1), "max_length must be an integer >= 1, got -1"),
                      (dict(max_length=0), "max_length must be an integer >= 1, got 0")]:
        with pytest.raises(ValueError, match=says):  # not truncated, not the last token dropped
            head_view(qwen3, ids, **bad)


def test_view_of_4k_tokens_stays_small(qwen3, tmp_path):
    """Long texts: streaming statistics of every query, weights of a window: a few MB at 4,096 tokens."""
    ids = np.random.default_rng(1).integers(0, 97, 4096)
    t0 = time.perf_counter()
    view = head_view(qwen3, ids)
    seconds = time.perf_counter() - t0
    size = os.path.getsize(view.save(tmp_path / "view.html"))
    assert view.stop - view.start == 256 and len(view.tokens) == 4096
    assert size < 3_000_000, size
    st = qwen3.forward(ids, keep=("attention_stats",)).attention_stats
    np.testing.assert_allclose(view.means["entropy"], np.asarray(st.entropy).reshape(2, 4, -1).mean(-1), atol=1e-5)
    np.testing.assert_array_equal(view.routing, _pattern(qwen3, ids[:256])[..., :256, :256])
    print(f"head view of 4096 tokens: {size / 1e6:.2f} MB in {seconds:.2f} s")


# -- in the browser -------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def browser():
    if CHROMIUM is None or DRIVER is None:
        pytest.skip("no chromium and chromedriver on PATH (Debian: apt-get install chromium chromium-driver)")
    webdriver = pytest.importorskip("selenium.webdriver", reason="selenium is not installed (the test extra)")
    from selenium.webdriver.chrome.service import Service

    options = webdriver.ChromeOptions()
    options.binary_location = CHROMIUM
    for a in ("--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage", "--window-size=1280,900"):
        options.add_argument(a)
    options.set_capability("goog:loggingPrefs", {"browser": "ALL"})
    driver = webdriver.Chrome(service=Service(DRIVER), options=options)
    yield driver
    driver.quit()


def _hover_and_read(driver, root, layer, head, query):
    """Choose the layer and head, hover the query's token; the weights the page shows, by key."""
    from selenium.webdriver.common.action_chains import ActionChains
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import Select

    view = driver.find_element(By.CSS_SELECTOR, root)
    Select(view.find_element(By.CSS_SELECTOR, "select.hv-layer")).select_by_value(str(layer))
    Select(view.find_element(By.CSS_SELECTOR, "select.hv-head")).select_by_value(str(head))
    tokens = view.find_elements(By.CSS_SELECTOR, "span.hv-tok")
    ActionChains(driver).move_to_element(tokens[query]).perform()
    shown = [float(t.get_attribute("data-w")) for t in tokens]
    side = view.find_element(By.CSS_SELECTOR, ".hv-side").text
    return np.array(shown), side, tokens


def _no_console_errors(driver):
    errors = [e for e in driver.get_log("browser") if e["level"] in ("SEVERE", "ERROR")]
    assert not errors, errors


def test_head_view_in_the_browser(browser, qwen3, tmp_path):
    ids = np.random.default_rng(2).integers(0, 97, 30)
    path = head_view(qwen3, ids).save(tmp_path / "view.html")
    browser.get("file://" + os.path.abspath(path))
    P = _pattern(qwen3, ids)
    for layer, head, query in ((0, 0, 29), (1, 2, 17), (1, 3, 5)):
        shown, side, tokens = _hover_and_read(browser, ".attngeom-head-view", layer, head, query)
        assert len(tokens) == 30
        np.testing.assert_allclose(shown, P[layer, head, query], atol=1e-6)
        assert f"L{layer}H{head}, query {query}" in side and "entropy" in side and "sink weight" in side
    _no_console_errors(browser)


def test_report_in_the_browser(browser, tmp_path):
    """report.html of a model with a planted induction circuit: its first screen names the induction
    head, and its embedded head view shows the forward pass's weights."""
    model = load_model(ag.models.planted_induction_model(tmp_path / "planted"))
    ids = np.array([0, 5, 6, 7, 8, 5, 6, 7, 8, 5])
    x = model.forward(ids, keep=("attn_in",), dtype=np.float64).attn_in
    scores = ag.models.induction_scores(model, seq_len=10, bos=0)
    report = head_report(model.heads, x, tokens=[str(i) for i in ids], scores=scores)
    report.view = head_view(model, ids)
    report.save(tmp_path / "report")
    browser.get("file://" + str(tmp_path / "report" / "report.html"))
    from selenium.webdriver.common.by import By

    first = browser.find_element(By.CSS_SELECTOR, ".leads")
    assert "Induction head: L1H0" in first.text and first.location["y"] < 400
    P = _pattern(model, ids)
    shown, side, _ = _hover_and_read(browser, "#head-view", 1, 0, 6)
    np.testing.assert_allclose(shown, P[1, 0, 6], atol=1e-6)
    assert shown[3] == pytest.approx(1.0, abs=1e-3)  # the induction head reads the token after the earlier 6
    _no_console_errors(browser)
    heads = json.load(open(tmp_path / "report" / "heads.json"))
    row = next(r for r in heads["heads"] if (r["layer"], r["head"]) == (1, 0))
    assert row["induction_score"] == pytest.approx(scores.induction[1, 0])
    assert {"induction_score", "previous_token_score", "duplicate_token_score"} <= set(heads["fields"])


def test_cli_detail_heads_and_map_text(tmp_path, capsys):
    """`attngeom heads --detail-heads L.H,... --map-text K`: the heads drawn, the text drawn (maps
    and head view), the criterion stated; the table's induction-family scores for a decoder."""
    torch = pytest.importorskip("torch")
    pytest.importorskip("matplotlib")
    from attngeom.cli import main
    from attngeom.torch.gpt import GPT, save_checkpoint

    vocab = list(" .abcdefghijklmnopqrstuvwxyz")
    torch.manual_seed(0)
    folder = save_checkpoint(GPT(len(vocab), 16, 2, 2, 32, mlp=False, positions="rope"), tmp_path / "gpt",
                             vocab=vocab)
    (tmp_path / "notes.txt").write_text("a cat sat on a mat.\n\nthe dog ran. the dog ran.\n")
    out = tmp_path / "report"
    assert main(["heads", str(folder), "--text", str(tmp_path / "notes.txt"), "--detail-heads", "1.0,0.1",
                 "--map-text", "1", "--out", str(out)]) == 0
    heads = json.load(open(out / "heads.json"))
    s = heads["summary"]
    assert s["chosen"] == [[1, 0], [0, 1]] and s["criterion"] == "--detail-heads" and s["map_text"] == 1
    assert {"induction_score", "previous_token_score", "duplicate_token_score",
            "direct_logit_attribution"} <= set(heads["heads"][0])
    page = (out / "report.html").read_text()
    assert "Text 1: hover" in page and "Drawn in detail: L1H0, L0H1 (--detail-heads)" in page
    data = json.loads(page.split("id='head-view-data'>")[1].split("</script>")[0])
    assert "".join(data["tokens"]) == "the dog ran. the dog ran."
    assert (out / "attention_L1_H0.png").exists() and not (out / "attention_L0_H0.png").exists()
    capsys.readouterr()
    assert main(["heads", str(folder), "--text", str(tmp_path / "notes.txt"), "--map-text", "2",
                 "--out", str(tmp_path / "bad")]) == 2
    assert "--map-text 2: there are 2 texts" in capsys.readouterr().err
    # without --detail-heads or --effects: the best induction, previous-token and duplicate-token heads
    assert main(["heads", str(folder), "--text", str(tmp_path / "notes.txt"), "--out", str(tmp_path / "r2")]) == 0
    s = json.load(open(tmp_path / "r2" / "heads.json"))["summary"]
    assert s["criterion"] == "the best induction, previous-token and duplicate-token heads"
    # an untrained model: the highest induction score is named, and no head is called an induction head
    assert any(line.startswith("No induction head: the highest induction score is L") for line in s["leads"])
    assert not any(line.startswith("Induction head") for line in s["leads"])


def test_cli_report_of_an_encoder_holds_its_view(tmp_path):
    """A BERT encoder's report.html embeds the head view of its (bidirectional) pass too."""
    pytest.importorskip("matplotlib")
    from attngeom.cli import main

    folder = random_checkpoint("bert", tmp_path / "bert")
    ids = [2, 11, 5, 7, 11, 5, 3]
    (tmp_path / "ids.txt").write_text(" ".join(map(str, ids)))
    assert main(["heads", folder, "--ids", str(tmp_path / "ids.txt"), "--out", str(tmp_path / "r")]) == 0
    page = (tmp_path / "r" / "report.html").read_text()
    data = json.loads(page.split("id='head-view-data'>")[1].split("</script>")[0])
    assert data["causal"] is False and data["n"] == len(ids)
    import base64

    shown = np.frombuffer(base64.b64decode(data["routing"]), "<f4").reshape(2, 4, 7, 7)
    np.testing.assert_allclose(shown, _pattern(load_model(folder), ids), atol=1e-6)
