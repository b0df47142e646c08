"""Interventions in Model.forward against transformers doing the same with forward hooks.

Zero-ablating a head's z, mean-ablating attn_out and patching resid_pre on the same GPT-2,
Llama and BERT checkpoints (1e-4 in float32; BERT's last hidden state, it has no logits).
The same against TransformerLens is tests/test_transformer_lens.py.
"""
import numpy as np
import pytest

from attngeom.models import Ablate, Patch

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")

from builders import LAYOUTS, VOCAB, model_pairs  # noqa: E402

N = 9


@pytest.fixture(scope="module")
def pairs(tmp_path_factory):
    """{layout: (Model, transformers model)} for every layout of the builders (GPT-2, the Llama
    family with its rope types, Mistral, Qwen2, Qwen3, BERT)."""
    return model_pairs(tmp_path_factory, LAYOUTS)


def _ids(seed=0, batch=2):
    return np.random.default_rng(seed).integers(0, VOCAB, (batch, N))


def _blocks(hf, layout):
    return {"gpt2": lambda: hf.transformer.h, "bert": lambda: hf.encoder.layer}.get(layout, lambda: hf.model.layers)()


def _o_proj(hf, layout, layer):
    block = _blocks(hf, layout)[layer]
    return {"gpt2": lambda: block.attn.c_proj, "bert": lambda: block.attention.output.dense}.get(
        layout, lambda: block.self_attn.o_proj)()


def _attn(hf, layout, layer):
    """The module whose output (first element) is the attention block's output after W_O."""
    block = _blocks(hf, layout)[layer]
    return {"gpt2": lambda: block.attn, "bert": lambda: block.attention.output.dense}.get(
        layout, lambda: block.self_attn)()


def _hf_logits(hf, ids, hooks):
    """The logits (BERT: the last hidden state) of transformers' forward with the hooks."""
    handles = [h() for h in hooks]
    try:
        with torch.no_grad():
            out = hf(torch.tensor(ids))
            return (out.last_hidden_state if out.get("logits") is None else out.logits).numpy()
    finally:
        for handle in handles:
            handle.remove()


def _out(f):
    """A Forward's logits, or for BERT its last hidden state."""
    return f.ln_final if f.logits is None else f.logits


@pytest.mark.parametrize("layout", LAYOUTS)
def test_zero_ablating_a_heads_z_equals_transformers(pairs, layout):
    model, hf = pairs[layout]
    ids, (layer, head), dh = _ids(), (1, 2), model.arch.d_head

    def pre(module, args):
        x = args[0].clone()
        x[..., head * dh:(head + 1) * dh] = 0
        return (x,) + tuple(args[1:])

    ref = _hf_logits(hf, ids, [lambda: _o_proj(hf, layout, layer).register_forward_pre_hook(pre)])
    f = model.forward(ids, interventions=[Ablate("z", layer, heads=[head])])
    np.testing.assert_allclose(_out(f), ref, rtol=1e-4, atol=1e-4)
    assert np.abs(_out(f) - _out(model.forward(ids))).max() > 1e-3  # the ablation matters


@pytest.mark.parametrize("layout", ["gpt2", "llama", "bert"])
def test_mean_ablating_attn_out_equals_transformers(pairs, layout):
    model, hf = pairs[layout]
    ids, layer = _ids(1), 0
    clean = model.forward(ids, keep=("attn_out", "logits", "ln_final"))
    mean = clean.attn_out[layer].mean(axis=(0, 1))

    def post(module, args, output):
        if isinstance(output, torch.Tensor):  # BERT's W_O, a Linear
            return torch.broadcast_to(torch.tensor(mean), output.shape).clone()
        return (torch.broadcast_to(torch.tensor(mean), output[0].shape).clone(),) + tuple(output[1:])

    ref = _hf_logits(hf, ids, [lambda: _attn(hf, layout, layer).register_forward_hook(post)])
    f = model.forward(ids, interventions=[Ablate("attn_out", layer, mode="mean", reference=clean)])
    np.testing.assert_allclose(_out(f), ref, rtol=1e-4, atol=1e-4)
    assert np.abs(_out(f) - _out(clean)).max() > 1e-3


@pytest.mark.parametrize("layout", ["gpt2", "llama", "bert"])
def test_patching_resid_pre_equals_transformers(pairs, layout):
    model, hf = pairs[layout]
    clean, corrupt = _ids(2), _ids(3)
    layer, positions = 1, [2, 5]
    source = model.forward(clean, keep=("resid_pre",))
    patched = source.resid_pre[layer]

    def pre(module, args, kwargs):
        key = "hidden_states" if "hidden_states" in kwargs else None
        x = (kwargs[key] if key else args[0]).clone()
        x[:, positions] = torch.tensor(patched[:, positions])
        if key:
            kwargs = dict(kwargs, hidden_states=x)
            return args, kwargs
        return (x,) + tuple(args[1:]), kwargs

    ref = _hf_logits(hf, corrupt, [lambda: _blocks(hf, layout)[layer].register_forward_pre_hook(pre, with_kwargs=True)])
    f = model.forward(corrupt, interventions=[Patch("resid_pre", layer, source, positions=positions)])
    np.testing.assert_allclose(_out(f), ref, rtol=1e-4, atol=1e-4)
    full = model.forward(corrupt, interventions=[Patch("resid_pre", layer, source)])  # every position
    np.testing.assert_allclose(_out(full), _out(model.forward(clean)), rtol=1e-5, atol=1e-5)


