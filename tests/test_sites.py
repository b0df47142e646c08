"""The one site gate (attngeom.models.nn.sites): every site of every family can be kept, read
by either spelling of its name and intervened on; an identity intervention leaves the pass
bitwise as it was, and a changed value changes what follows. The transformers names of the
old fields still work, with a DeprecationWarning naming the new one."""
import re

import numpy as np
import pytest

from attngeom.models import Ablate, Hook, Patch, load_model
from attngeom.models.nn.forward import KEEPABLE
from attngeom.models.nn.sites import GLOBAL_SITES, HEAD_SITES, SITES, full_name, model_sites, parse_site

from checkpoints import RANDOM_LAYOUTS, random_batch as batch, random_checkpoint

NUMPY_LAYOUTS = ("gpt2", "llama", "mistral", "qwen2", "qwen3", "bert")


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    return {layout: load_model(random_checkpoint(layout, tmp_path_factory.mktemp(layout)))
            for layout in NUMPY_LAYOUTS}


def _moe_and_mla(tmp_path):
    """A random Mixtral and a random DeepSeek-V2 (MLA, dense then routed layers), saved by
    transformers."""
    pytest.importorskip("transformers")
    from builders import deepseek, mixtral

    mixtral(tmp_path / "mixtral")
    deepseek(tmp_path / "deepseek")
    return {"mixtral": load_model(tmp_path / "mixtral"), "deepseek_v2": load_model(tmp_path / "deepseek")}


def test_every_site_has_one_full_name_and_one_short_name():
    names = [full_name(s, 3) for s in SITES]
    assert len(set(names)) == len(SITES)
    for site, name in zip(SITES, names):
        layer = None if site in GLOBAL_SITES else 3
        assert parse_site(name) == (site, layer)
        assert parse_site((site, layer)) == (site, layer) == parse_site(site, layer)
    assert full_name("z", 3) == "blocks.3.attn.hook_z" and full_name("q", 0) == "blocks.0.attn.hook_rot_q"
    assert full_name("q_prerotary", 0) == "blocks.0.attn.hook_q" and full_name("ln_final") == "ln_final.hook_out"
    for bad, message in [("blocks.3.attn.hook_zz", "unknown site 'blocks.3.attn.hook_zz'"), ("zz", "unknown site"),
                         (3, "must be a site name")]:
        with pytest.raises(ValueError, match=message):
            parse_site(bad)
    with pytest.raises(ValueError, match="names layer 3, but layer 2 was given"):
        parse_site("blocks.3.attn.hook_z", 2)


def _check_cache(model, f, b, n):
    """Every site the model has is kept, with its documented shape, read three ways."""
    a = model.arch
    widths = {"mlp_post": a.d_ff, "router_logits": a.n_experts}
    if a.mla:
        widths.update(kv_latent=a.mla["kv_lora_rank"], rope_keys=a.mla["qk_rope_head_dim"])
    have = model_sites(a)
    for site in SITES:
        value = getattr(f, site)
        if site not in have:
            assert value is None, site
            continue
        assert value is not None, site
        if site in GLOBAL_SITES:
            assert value.shape == (b, n, a.d_model), site
            assert f[full_name(site)] is value and f[site] is value
            continue
        layers = [i for i in range(a.n_layers) if site != "router_logits" or i in a.moe_layers]
        assert len(value) == len(layers), site
        if site == "pattern":
            assert value.shape[1:] == (b, a.n_heads, n, n)
        elif site in HEAD_SITES:
            assert value.shape[1:4] == (b, a.n_heads, n), site
        else:
            assert value.shape[1:] == (b, n, widths.get(site, a.d_model)), site
        for i, layer in enumerate(layers):
            np.testing.assert_array_equal(f[full_name(site, layer)], value[i])
            np.testing.assert_array_equal(f[site, layer], value[i])
    assert list(f.keys())[0] == full_name("embed")
    assert len(list(f.keys())) == sum(1 if s in GLOBAL_SITES else len(getattr(f, s)) for s in have)


@pytest.mark.parametrize("layout", NUMPY_LAYOUTS)
def test_a_cache_of_every_site(models, layout):
    model = models[layout]
    ids, mask = batch()
    f = model.forward(ids, attention_mask=mask, keep="all")
    _check_cache(model, f, *ids.shape)
    with pytest.raises(KeyError, match="'z' was not kept at layer 1"):
        model.forward(ids, attention_mask=mask, keep="z", layers=[0])["z", 1]
    with pytest.raises(KeyError, match="'z' was not kept"):
        model.forward(ids, attention_mask=mask, keep="logits" if layout != "bert" else "pattern")["z", 0]
    assert "blocks.0.hook_nothing" not in f and "z" in f and ("z", 0) in f  # no site: False, as for a dict
    with pytest.raises(ValueError, match=r"Forward\[...\]: unknown site 'blocks.0.hook_nothing'"):
        f["blocks.0.hook_nothing"]


def _output(f):
    return f.logits if f.logits is not None else f.ln_final


def _intervention_sites(model):
    return [(s, None if s in GLOBAL_SITES else layer) for s in model_sites(model.arch)
            for layer in ([None] if s in GLOBAL_SITES else
                          [i for i in range(model.n_layers) if s != "router_logits" or i in model.arch.moe_layers][-1:])]


def _uneven(x):
    return x * (1 + 0.5 * np.cos(np.arange(x.shape[-1])))


def _check_interventions(model, ids, mask):
    """Identity hooks at every site leave the output bitwise as it was (pattern: the heads'
    outputs are then P v formed in NumPy, equal to rounding); scaling a site's coordinates
    unevenly changes the output (an even scale would pass through a norm unchanged); either
    spelling of the site gives the same pass."""
    plain = _output(model.forward(ids, attention_mask=mask, keep=("logits", "ln_final")))
    top = np.abs(plain).max()
    for site, layer in _intervention_sites(model):
        same = _output(model.forward(ids, attention_mask=mask, keep=("logits", "ln_final"),
                                     interventions=[Hook(site, layer, lambda x: x)]))
        if site == "pattern":
            np.testing.assert_allclose(same, plain, rtol=0, atol=1e-5 * top, err_msg=site)
        else:
            np.testing.assert_array_equal(same, plain, err_msg=site)
        half = [Hook(site, layer, _uneven)]
        changed = _output(model.forward(ids, attention_mask=mask, keep=("logits", "ln_final"), interventions=half))
        assert np.abs(changed - plain).max() > 1e-4 * top, site
        by_name = [Hook(full_name(site) if layer is None else full_name(site, layer), fn=_uneven)]
        np.testing.assert_array_equal(_output(model.forward(ids, attention_mask=mask, keep=("logits", "ln_final"),
                                                            interventions=by_name)), changed)


@pytest.mark.parametrize("layout", NUMPY_LAYOUTS)
def test_every_site_can_be_intervened_on(models, layout):
    ids, mask = batch()
    _check_interventions(models[layout], ids, mask)


def test_moe_and_mla_sites(tmp_path):
    """Mixtral's router and DeepSeek-V2's latent, rotary key and router sites are kept and
    intervened on like every other site."""
    ids, mask = batch()
    for name, model in _moe_and_mla(tmp_path).items():
        f = model.forward(ids, attention_mask=mask, keep="all")
        _check_cache(model, f, *ids.shape)
        _check_interventions(model, ids, mask)


def test_kept_values_are_the_intervened_ones_and_patches_take_either_name(models):
    model = models["llama"]
    ids, mask = batch()
    f = model.forward(ids, attention_mask=mask, keep=("z", "mlp_post", "resid_mid"),
                      interventions=[Ablate("blocks.1.attn.hook_z", heads=[2]), Ablate(("mlp_post", 0))])
    assert np.all(f["z", 1][:, 2] == 0) and np.abs(f["z", 1][:, 1]).max() > 0
    assert np.all(f["blocks.0.mlp.hook_post"] == 0)
    source = model.forward(ids, attention_mask=mask, keep=("resid_mid", "logits"))
    patched = model.forward(ids, attention_mask=mask, keep=("logits",),
                            interventions=[Patch("blocks.0.hook_resid_mid", source=source)])
    np.testing.assert_array_equal(patched.logits, source.logits)  # the whole stream patched: the same pass


def test_bad_sites_are_one_line_errors(models):
    model = models["gpt2"]
    ids = np.arange(5)
    cases = [(Ablate("nothing", 0), "interventions[0] (Ablate): site: unknown site 'nothing'"),
             (Ablate("embed", 0), "interventions[0] (Ablate at 'embed', layer 0): layer: the site 'embed' has no layer"),
             (Ablate("z"), "interventions[0] (Ablate at 'z'): layer must be an integer in 0..1, got None"),
             (Ablate("blocks.1.attn.hook_z", 0), "names layer 1, but layer 0 was given"),
             (Ablate("router_logits", 0), "a gpt2 model has no site 'router_logits'"),
             (Hook("z", 0), "fn must be callable"), (Patch("z", 0), "source must be a Forward")]
    for iv, message in cases:
        with pytest.raises((ValueError, TypeError), match=re.escape(message)) as info:
            model.forward(ids, interventions=[iv])
        assert "\n" not in str(info.value)
    qwen = models["qwen3"]
    with pytest.raises(ValueError, match="has no site 'pos_embed'"):
        qwen.forward(ids, interventions=[Ablate("pos_embed")])


def test_the_transformers_names_warn_and_still_work(models):
    model = models["qwen3"]
    ids, mask = batch()
    new = model.forward(ids, attention_mask=mask, keep=("resid_pre", "ln_final", "pattern", "attn_in"))
    with pytest.warns(DeprecationWarning) as record:
        old = model.forward(ids, attention_mask=mask, keep=("hidden_states", "attentions", "attention_inputs"))
    assert sorted(str(w.message) for w in record) == [
        f"Model.forward(): the keep name {old!r} is deprecated, use {new!r}" for old, new in
        (("attention_inputs", "attn_in"), ("attentions", "pattern"), ("hidden_states", "resid_pre and ln_final"))]
    for field, site in (("attentions", "pattern"), ("attention_inputs", "attn_in")):
        with pytest.warns(DeprecationWarning, match=f"Forward: the field '{field}' is deprecated, use '{site}'"):
            np.testing.assert_array_equal(getattr(old, field), getattr(new, site))
    with pytest.warns(DeprecationWarning, match="the field 'hidden_states' is deprecated, use 'resid_pre"):
        hidden = old.hidden_states
    np.testing.assert_array_equal(hidden, np.concatenate([new.resid_pre, new.ln_final[None]]))
    assert hidden.shape == (model.n_layers + 1,) + ids.shape + (model.arch.d_model,)


def test_keepable_is_the_sites_the_logits_and_the_statistics():
    assert KEEPABLE == ("logits",) + SITES + ("attention_stats",)
    assert set(RANDOM_LAYOUTS) >= set(NUMPY_LAYOUTS)


def family_branches(root) -> list:
    """(file, line) of every comparison of an architecture's family name in the forward pass's
    package: its steps are chosen by Architecture fields (post_norm, bidirectional, d_ff, ...)."""
    import pathlib

    found = []
    for path in sorted(pathlib.Path(root).glob("*.py")):
        for number, line in enumerate(path.read_text().splitlines(), 1):
            if re.search(r"\bfamily\s*(==|!=)|(==|!=)\s*\S*\.family\b", line):
                found.append((path.name, number))
    return found


def test_the_forward_has_no_family_name_branches(tmp_path):
    import attngeom.models.nn as nn

    assert family_branches(nn.__path__[0]) == []
    planted = tmp_path / "planted.py"
    planted.write_text('if a.family == "bert":\n    pass\nok = arch.post_norm\nif "gpt2" != arch.family:\n    pass\n')
    assert family_branches(tmp_path) == [("planted.py", 1), ("planted.py", 4)]



@pytest.fixture(scope="module")
def wide_mlp_models(tmp_path_factory):
    """Random GPT-2, Llama (grouped queries) and Qwen3 checkpoints whose MLPs are wide enough
    (256 hidden units) for their products to be split into several column units."""
    torch = pytest.importorskip("torch")
    tf = pytest.importorskip("transformers")
    small = dict(vocab_size=97, hidden_size=64, intermediate_size=256, num_hidden_layers=2, num_attention_heads=4,
                 num_key_value_heads=2)
    made = {"gpt2": tf.GPT2LMHeadModel(tf.GPT2Config(vocab_size=97, n_embd=64, n_layer=2, n_head=4, n_inner=256)),
            "llama": tf.LlamaForCausalLM(tf.LlamaConfig(**small)),
            "qwen3": tf.Qwen3ForCausalLM(tf.Qwen3Config(**small, head_dim=16))}
    models = {}
    for layout, model in made.items():
        torch.manual_seed(0)
        folder = tmp_path_factory.mktemp("wide_" + layout)
        model.eval().save_pretrained(folder)
        models[layout] = load_model(folder)
    return models


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
@pytest.mark.parametrize("layout", ["gpt2", "llama", "qwen3"])
def test_keeping_or_hooking_the_block_sites_leaves_the_bits(wide_mlp_models, layout, dtype):
    """The MLP's input and hidden units, the blocks' outputs (attn_out, mlp_out) and the heads'
    outputs (z) kept, hooked with the identity or patched from the pass's own cache give the
    plain pass's logits bitwise, on batches whose products are split by columns (>= 32
    tokens) and on shorter ones, in float32 and in the bfloat16 mode (where the plain pass's
    output products add the residual stream as they finish, and a pass that forms attn_out or
    mlp_out adds it after them; the attention writes z token-major unless z is changed)."""
    model = wide_mlp_models[layout]
    for shape in [(3, 12), (2, 5)]:
        ids = np.random.default_rng(1).integers(0, model.arch.vocab_size, shape)
        plain = model.forward(ids, keep=("logits",), dtype=dtype).logits
        cache = model.forward(ids, keep=("logits", "mlp_in", "mlp_post", "resid_pre", "attn_out", "mlp_out", "z"),
                              dtype=dtype)
        np.testing.assert_array_equal(cache.logits, plain)
        for iv in [Hook("mlp_in", 0, lambda x: x), Hook("mlp_post", 1, lambda x: x), Patch("mlp_in", 1, cache),
                   Patch("mlp_post", 0, cache), Patch("resid_pre", 1, cache), Hook("attn_out", 0, lambda x: x),
                   Hook("mlp_out", 1, lambda x: x), Patch("z", 1, cache), Hook("z", 0, lambda x: x.copy())]:
            out = model.forward(ids, keep=("logits",), interventions=[iv], dtype=dtype).logits
            np.testing.assert_array_equal(out, plain, err_msg=f"{shape} {iv}")
