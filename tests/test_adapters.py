"""Models in memory: ``ag.models.from_transformers`` (a transformers PreTrainedModel) and
``ag.models.from_transformer_lens`` (a TransformerLens 4.x TransformerBridge), compared with
the models' own forward passes on tiny random-init configs (nothing is downloaded)."""
import copy
import os
import subprocess
import sys

import numpy as np
import pytest

import attngeom as ag

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

from builders import LAYOUTS, VOCAB, configs, batch, max_errors, random_model, reference  # noqa: E402


def test_core_package_imports_no_torch():
    code = ("import sys, attngeom, attngeom.models; "
            "print(sorted(m for m in ('torch', 'transformers', 'transformer_lens') if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"


@pytest.mark.parametrize("layout", LAYOUTS)
def test_from_transformers_matches_the_model(layout):
    model = random_model(layout)
    m = ag.models.from_transformers(model)
    assert m.path == f"<transformers {type(model).__name__}>" and m.folder == ""
    ids, mask = batch()
    positions = np.maximum(np.cumsum(mask, 1) - 1, 0)
    f = m.forward(ids, attention_mask=mask)
    errs = max_errors(f, reference(model, ids, mask, positions, False), mask)
    print(layout, {k: f"{v:.2e}" for k, v in errs.items()})
    assert max(errs.values()) <= 1e-4, errs
    # the heads are the model's: queries_keys + softmax_attention give its attention
    H = m.heads
    one = m.forward(ids[0])
    q, k = H.queries_keys(one.attn_in[1], 1)
    i = np.arange(q.shape[-2])
    band = (i[:, None] - i[None, :]) < m.arch.sliding_window if 1 in m.arch.sliding_layers else None  # Mistral
    _, P = ag.softmax_attention(q, k, None, mask=band, causal=H.causal, return_routing=True)
    np.testing.assert_allclose(P, one.pattern[1], atol=1e-4)


def test_from_transformers_views_the_weights():
    """float32 weights are read-only views of the torch parameters (no copy); bfloat16 ones
    stay 2-byte bits, widened exactly when a layer runs."""
    model = random_model("qwen2")
    m = ag.models.from_transformers(model)
    q = m.decoder.w["layers"][0]["q"]
    param = model.model.layers[0].self_attn.q_proj.weight
    assert np.shares_memory(q, param.detach().numpy()) and not q.flags.writeable
    with torch.no_grad():  # an in-place edit of the torch model is seen through the view
        param.mul_(2.0)
    np.testing.assert_array_equal(q, param.detach().numpy().T)

    half = random_model("gpt2").to(torch.bfloat16)  # no rotary buffer, which torch would round to bfloat16 too
    mb = ag.models.from_transformers(half)
    w = mb.decoder.w["layers"][0]["up"]
    assert isinstance(w, ag.models.BFloat16Array) and not w.bits.flags.writeable
    full = copy.deepcopy(half).float()  # the same values in float32
    ids = np.arange(1, 9)
    np.testing.assert_allclose(mb.forward(ids).logits, ag.models.from_transformers(full).forward(ids).logits,
                               rtol=0, atol=1e-5)
    with torch.no_grad():
        ref = full(torch.tensor(ids[None])).logits[0].numpy()
    np.testing.assert_allclose(mb.forward(ids).logits, ref, atol=1e-4)


def test_from_transformers_bad_input():
    with pytest.raises(TypeError, match="transformers PreTrainedModel"):
        ag.models.from_transformers(object())
    cfg = transformers.PhiConfig(vocab_size=VOCAB, hidden_size=32, intermediate_size=48, num_hidden_layers=1,
                                 num_attention_heads=4)
    with pytest.raises(ValueError, match="llama"):  # the message lists the supported model types
        ag.models.from_transformers(transformers.PhiForCausalLM(cfg))
    with torch.device("meta"):
        meta = transformers.GPT2LMHeadModel(configs()["gpt2"]()[0])
    with pytest.raises(ValueError, match="meta device"):
        ag.models.from_transformers(meta)


# -- TransformerLens 4.x ------------------------------------------------------------------------
@pytest.fixture(scope="module")
def offline_tokenizer(tmp_path_factory):
    """A word-level tokenizer saved to a folder (the bridge reloads its tokenizer by path)."""
    from tokenizers import Tokenizer, models, pre_tokenizers
    tok = Tokenizer(models.WordLevel({f"t{i}": i for i in range(VOCAB)}, unk_token="t0"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    fast = transformers.PreTrainedTokenizerFast(tokenizer_object=tok, unk_token="t0", bos_token="t1",
                                                eos_token="t2", pad_token="t3")
    folder = tmp_path_factory.mktemp("tokenizer")
    fast.save_pretrained(folder)
    return transformers.AutoTokenizer.from_pretrained(folder)


def bridge_of(model, tokenizer):
    tl = pytest.importorskip("transformer_lens.model_bridge")
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    return tl.TransformerBridge.boot_transformers(f"local/{type(model).__name__}", hf_model=model,
                                                  tokenizer=tokenizer)


@pytest.mark.parametrize("layout", ["gpt2", "llama", "qwen3"])
def test_from_transformer_lens(layout, offline_tokenizer):
    model = random_model(layout)
    bridge = bridge_of(model, offline_tokenizer)
    m = ag.models.from_transformer_lens(bridge)
    own = ag.models.from_transformers(model).heads
    for name in ("W_Q", "W_K", "W_V", "W_O", "b_Q", "b_K", "b_V", "b_O"):
        a, b = getattr(m.heads, name), getattr(own, name)
        assert (a is None) == (b is None), name
        if a is not None:
            np.testing.assert_allclose(a, b, atol=1e-7, err_msg=name)  # TL layout read from the bridge
    assert (m.heads.rotary is None) == (layout == "gpt2") and (m.heads.q_norm is not None) == (layout == "qwen3")
    ids = np.array([5, 6, 7, 8, 9, 10])
    with torch.no_grad():
        logits, cache = bridge.run_with_cache(torch.tensor(ids[None]))
    f = m.forward(ids)
    np.testing.assert_allclose(f.logits, logits[0].numpy(), atol=1e-4)
    if layout == "gpt2":  # hook activations are (batch, pos, head, d_head): layout="bnhd"
        q, k, v, z = (cache[f"blocks.1.attn.hook_{x}"].numpy() for x in "qkvz")
        assert q.shape == (1, len(ids), 4, 8)
        y = ag.softmax_attention(q, k, v, causal=True, layout="bnhd")
        np.testing.assert_allclose(y, z, atol=1e-5)
        with pytest.warns(ag.LayoutWarning):
            ag.softmax_attention(q, k, v, causal=True)


def test_from_transformer_lens_bad_input(offline_tokenizer):
    pytest.importorskip("transformer_lens.model_bridge")

    class HookedTransformer:
        pass

    with pytest.raises(TypeError, match="HookedTransformer was removed in 4.x"):
        ag.models.from_transformer_lens(HookedTransformer())
    with pytest.raises(TypeError, match="TransformerBridge"):
        ag.models.from_transformer_lens(random_model("gpt2"))
    bridge = bridge_of(random_model("gpt2"), offline_tokenizer)
    bridge.process_weights()
    with pytest.raises(ValueError, match="weights were processed"):
        ag.models.from_transformer_lens(bridge)
