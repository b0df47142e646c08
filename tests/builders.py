"""Shared builders of the model tests: tiny random-init checkpoints of every supported layout,
built from ``transformers`` config classes and saved with save_pretrained (nothing is
downloaded), and their transformers reference forward. The padded batch and the word-level
tokenizer are tests/checkpoints.py's (re-exported here), shared with the tests that need no
transformers.

Test modules import from here, never from one another.
"""
import contextlib
import zlib

import numpy as np
import pytest

from checkpoints import RANDOM_VOCAB as VOCAB, random_batch as batch, with_tokenizer  # noqa: F401

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

N = 7


def configs():
    tf = transformers
    small = dict(vocab_size=VOCAB, hidden_size=32, intermediate_size=48, num_hidden_layers=2, num_attention_heads=4)
    return {
        "gpt2": lambda: (tf.GPT2Config(vocab_size=VOCAB, n_embd=32, n_layer=2, n_head=4, n_positions=16,
                                       bos_token_id=0, eos_token_id=0), tf.GPT2LMHeadModel),
        "llama": lambda: (tf.LlamaConfig(**small, num_key_value_heads=2, max_position_embeddings=64,
                                         rope_theta=500.0), tf.LlamaForCausalLM),
        "llama3": lambda: (tf.LlamaConfig(**small, num_key_value_heads=1, tie_word_embeddings=True,
                                          rope_scaling={"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
                                                        "high_freq_factor": 4.0,
                                                        "original_max_position_embeddings": 16},
                                          max_position_embeddings=64), tf.LlamaForCausalLM),
        "llama_yarn": lambda: (tf.LlamaConfig(**small, num_key_value_heads=2,
                                              rope_scaling={"rope_type": "yarn", "factor": 4.0, "beta_fast": 8.0,
                                                            "original_max_position_embeddings": 16},
                                              max_position_embeddings=64), tf.LlamaForCausalLM),
        "mistral": lambda: (tf.MistralConfig(**small, num_key_value_heads=2, sliding_window=4), tf.MistralForCausalLM),
        "qwen2": lambda: (tf.Qwen2Config(**small, num_key_value_heads=2, tie_word_embeddings=True), tf.Qwen2ForCausalLM),
        "qwen3": lambda: (tf.Qwen3Config(**small, num_key_value_heads=2, head_dim=16), tf.Qwen3ForCausalLM),
        "bert": lambda: (tf.BertConfig(vocab_size=VOCAB, hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
                                       intermediate_size=48, max_position_embeddings=16), tf.BertModel),
    }


LAYOUTS = list(configs())


@contextlib.contextmanager
def float64_everywhere():
    """Inside transformers, every explicit float32 upcast (torch.float32, torch.float,
    Tensor.float()) becomes float64, so a double() model computes in float64 throughout."""
    saved = torch.float32, torch.float, torch.Tensor.float
    torch.float32 = torch.float = torch.float64
    torch.Tensor.float = torch.Tensor.double
    try:
        yield
    finally:
        torch.float32, torch.float, torch.Tensor.float = saved


def randomize(model, seed):
    """Weights of order one (transformers' init, std 0.02, makes every attention near uniform)."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("norm.weight") or "ln_" in name or "LayerNorm.weight" in name:
                p.copy_(1 + 0.2 * torch.randn(p.shape, generator=g))
            elif p.ndim == 1:
                p.copy_(0.2 * torch.randn(p.shape, generator=g))
            else:
                p.copy_(0.3 * torch.randn(p.shape, generator=g))
    return model


_BUILT = {}


def random_model(layout, seed=0):
    """The transformers model of that layout with randomize's weights, the same in every process:
    the weights' seed comes from the layout's name by CRC-32 (str hashes change per process)."""
    config, cls = configs()[layout]()
    config._attn_implementation = "eager"
    torch.manual_seed(seed)
    return randomize(cls(config), seed=zlib.crc32(layout.encode()) % 1000).eval()


def build(layout, folder, dtype="float32"):
    """A saved random checkpoint of that layout and the transformers model it came from."""
    model = random_model(layout)
    if dtype == "float64":
        model = model.double()
        with float64_everywhere():  # rotary frequencies recomputed in float64
            for m in model.modules():
                if hasattr(m, "inv_freq"):
                    if not hasattr(m, "config"):
                        pytest.skip("this transformers version's rotary module cannot be rebuilt in float64")
                    m.__init__(m.config)
    model.save_pretrained(folder, safe_serialization=True)
    return model


def model_pairs(tmp_path_factory, layouts):
    """{layout: (attngeom Model, transformers model)} of build(layout) for each layout, each in a
    folder of its own."""
    from attngeom.models import load_model

    out = {}
    for layout in layouts:
        folder = tmp_path_factory.mktemp(layout)
        hf = build(layout, folder)
        out[layout] = (load_model(folder), hf)
    return out


def reference(model, ids, mask, positions, float64):
    kw = dict(input_ids=torch.tensor(ids), attention_mask=torch.tensor(mask.astype(np.int64)),
              position_ids=torch.tensor(positions), output_hidden_states=True, output_attentions=True)
    ctx = float64_everywhere() if float64 else contextlib.nullcontext()
    with torch.no_grad(), ctx:
        out = model(**kw)
    logits = getattr(out, "logits", None)
    return (None if logits is None else logits.numpy(), np.stack([h.numpy() for h in out.hidden_states]),
            np.stack([a.numpy() for a in out.attentions]))


def transformers_hidden(f) -> np.ndarray:
    """transformers' hidden states of a Forward: every layer's resid_pre, then ln_final (the output)."""
    return np.concatenate([f.resid_pre, f.ln_final[None]])


def max_errors(f, ref, mask):
    logits, hidden, attn = ref
    errs = {"hidden": np.abs(transformers_hidden(f) - hidden)[:, mask].max()}
    if logits is not None:
        errs["logits"] = np.abs(f.logits - logits)[mask].max()
    a = np.abs(f.pattern - attn)  # (L, b, H, n, n): real query rows, real key columns
    errs["attentions"] = max(a[:, s][:, :, mask[s]][:, :, :, mask[s]].max() for s in range(mask.shape[0]))
    return errs


# -- mixture-of-experts and latent-attention checkpoints (transformers builds them) ------------
KV_LORA, ROPE, NOPE, V_DIM, HEADS = 6, 4, 8, 6, 4


def deepseek_config(**changes):
    """A small DeepSeek-V2 config (MLA with q LoRA, dense first layer, routed + shared experts)."""
    import transformers

    cfg = dict(vocab_size=VOCAB, hidden_size=32, intermediate_size=48, num_hidden_layers=2, num_attention_heads=HEADS,
               q_lora_rank=12, kv_lora_rank=KV_LORA, qk_nope_head_dim=NOPE, qk_rope_head_dim=ROPE,
               v_head_dim=V_DIM, n_routed_experts=4, num_experts_per_tok=2, n_shared_experts=1,
               moe_intermediate_size=16, first_k_dense_replace=1, routed_scaling_factor=1.5,
               max_position_embeddings=64, rope_parameters={"rope_type": "default", "rope_theta": 500.0})
    cfg.update(changes)
    config = transformers.DeepseekV2Config(**cfg)
    config._attn_implementation = "eager"
    config._experts_implementation = "eager"  # the per-expert loop (grouped_mm has no float64)
    return config


def deepseek(folder, dtype="float32", **changes):
    """A saved random DeepSeek-V2 checkpoint and the transformers model it came from."""
    import torch
    import transformers

    torch.manual_seed(0)
    model = randomize(transformers.DeepseekV2ForCausalLM(deepseek_config(**changes)), seed=7).eval()
    if dtype == "float64":
        model = model.double()
        with float64_everywhere():  # rotary frequencies recomputed in float64
            for m in model.modules():
                if hasattr(m, "inv_freq"):
                    m.__init__(m.config)
    if folder is not None:
        model.save_pretrained(folder, safe_serialization=True)
    return model


def mixtral(folder, *, top_k=2, dtype="float32", planted=False):
    """A random Mixtral checkpoint (4 experts); with ``planted``, layer 0 routes token v to
    expert v mod 4 alone: embeddings e_(v mod 32), no attention output, router rows e_j."""
    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    config = transformers.MixtralConfig(vocab_size=97, hidden_size=32, intermediate_size=48, num_hidden_layers=2,
                                        num_attention_heads=4, num_key_value_heads=2, num_local_experts=4,
                                        num_experts_per_tok=top_k, rope_theta=500.0)
    config._attn_implementation = "eager"
    config._experts_implementation = "eager"  # the per-expert loop (grouped_mm has no float64)
    torch.manual_seed(0)
    model = randomize(transformers.MixtralForCausalLM(config), seed=5).eval()
    if planted:
        with torch.no_grad():
            model.model.embed_tokens.weight.copy_(torch.eye(32)[torch.arange(97) % 32])
            layer = model.model.layers[0]
            layer.self_attn.o_proj.weight.zero_()
            layer.post_attention_layernorm.weight.fill_(1.0)
            router = [m for name, m in layer.named_modules() if name.endswith("gate") and hasattr(m, "weight")][0]
            router.weight.copy_(5.0 * (torch.arange(4)[:, None] == torch.arange(32)[None] % 4).float())
    if dtype == "float64":
        model = model.double()
        with float64_everywhere():
            for m in model.modules():
                if hasattr(m, "inv_freq"):
                    m.__init__(m.config)
    model.save_pretrained(folder, safe_serialization=True)
    return model
