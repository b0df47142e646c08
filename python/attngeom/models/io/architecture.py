"""What a checkpoint's config.json says about its network: :class:`Architecture`.

One description covers every supported family, so one decoder implementation
(:mod:`attngeom.models.nn.decoder`) runs them all:

===========  ========  =========  ==========  ========  ==========================================
model_type   family    norm       MLP         position  attention extras
===========  ========  =========  ==========  ========  ==========================================
bert         bert      LayerNorm  GELU        absolute  bidirectional, post-LN (:mod:`.bert`)
gpt2         gpt2      LayerNorm  GELU tanh   absolute  fused c_attn (Conv1D), tied lm_head
llama        llama     RMSNorm    SwiGLU      RoPE      grouped-query; rope_type llama3 / linear / yarn
mistral      llama     RMSNorm    SwiGLU      RoPE      grouped-query, sliding window
qwen2        llama     RMSNorm    SwiGLU      RoPE      q/k/v biases, sliding window per layer
qwen3        llama     RMSNorm    SwiGLU      RoPE      q_norm / k_norm (RMSNorm over d_head)
mixtral      llama     RMSNorm    MoE SwiGLU  RoPE      grouped-query; top-k routed experts (:mod:`.moe`)
deepseek_v2  llama     RMSNorm    MoE SwiGLU  RoPE      multi-head latent attention (:mod:`.mla`):
                                  + shared              compressed KV latent, decoupled RoPE keys
attngeom-    llama     LayerNorm  GELU        RoPE      what ``attngeom run training`` trains
gpt                                                     (:mod:`attngeom.torch.gpt`; softmax arm)
===========  ========  =========  ==========  ========  ==========================================

DeepSeek-V2 is read as transformers implements it: q LoRA optional (``q_lora_rank`` null
gives a plain ``q_proj``), the rotary part of queries and keys rotated in the interleaved
(complex-pair) convention (YaRN scaling, which the released checkpoints use, included: its
attention factor on the rotary part and mscale(factor, mscale_all_dim)^2 on the logit
scale), the first ``first_k_dense_replace`` layers dense, the others routed experts
(``greedy`` or ``group_limited_greedy`` top-k of the softmax, not renormalised, times
``routed_scaling_factor``) plus ``n_shared_experts`` shared experts. Refused with a
ValueError: ``norm_topk_prob`` true (transformers ignores it, DeepSeek's own code
renormalises), other ``topk_method`` values (DeepSeek-V3's ``noaux_tc``), and
num_key_value_heads different from num_attention_heads (every head has its own expanded key
and value). Rope types: default, linear, llama3 and yarn for every rotary family (dynamic,
longrope and the others are refused).

Both config formats are read: transformers >= 5 (``rope_parameters``) and the older
``rope_theta`` + ``rope_scaling``.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Optional, Tuple

from ...activation_functions import gelu, gelu_tanh, relu, silu

# config.json model_type -> family (the decoder code path)
SUPPORTED_ARCHITECTURES = {"bert": "bert", "gpt2": "gpt2", "llama": "llama", "mistral": "llama", "qwen2": "llama",
                           "qwen3": "llama", "mixtral": "llama", "deepseek_v2": "llama", "attngeom-gpt": "llama"}
TOPK_METHODS = ("greedy", "group_limited_greedy")
ROPE_TYPES = ("default", "linear", "llama3", "yarn")
#: config.json's MLP activation functions (hidden_act, GPT-2's activation_function), by name
ACTIVATION_FUNCTIONS = {"gelu": gelu, "gelu_new": gelu_tanh, "gelu_pytorch_tanh": gelu_tanh, "silu": silu, "swish": silu,
                  "relu": relu}
ACTIVATIONS = tuple(ACTIVATION_FUNCTIONS)


@dataclass(frozen=True)
class Architecture:
    """The network a config.json describes (module docstring), as the forward pass needs it.

    Attributes
    ----------
    model_type : str
        config.json's model_type ("gpt2", "llama", "mistral", "qwen2", "qwen3", "mixtral",
        "deepseek_v2", "bert").
    family : {"gpt2", "llama", "bert"}
        The code path: the tensor-name layout of :data:`attngeom.models.LAYOUTS`.
    n_layers, n_heads, n_kv_heads, d_model, d_head, vocab_size : int
        Dimensions (n_kv_heads = n_heads without grouped-query attention). For multi-head
        latent attention d_head is the query/key width qk_nope_head_dim + qk_rope_head_dim.
    norm : {"layernorm", "rmsnorm"}
        The normalisation; ``norm_eps`` its epsilon.
    activation : str
        The MLP's activation function (one of ACTIVATIONS); ``gated`` for SwiGLU-style MLPs.
    rope : dict or None
        {"rope_type", "rope_theta", and the type's parameters} for rotary models.
    qk_norm : bool
        Qwen3's per-head RMSNorm of queries and keys before the rotation.
    tie_word_embeddings : bool
        Whether the unembedding is the token embedding.
    max_positions : int or None
        Length of an absolute position table (GPT-2, BERT); None for rotary models.
    sliding_window : int or None
        Window of the layers listed in ``sliding_layers``.
    sliding_layers : tuple of int
        The layers with sliding-window attention.
    scale_by_layer : bool
        GPT-2's scale_attn_by_inverse_layer_idx; ``scale_attn`` its scale_attn_weights.
    config : dict
        The parsed config.json.
    n_experts, experts_per_token : int
        Mixture-of-experts MLPs (Mixtral, DeepSeek-V2): num_local_experts (n_routed_experts)
        and num_experts_per_tok (the k of the top-k router); 0 for dense MLPs.
    mla : dict or None
        Multi-head latent attention (DeepSeek-V2, :mod:`.mla`): {"q_lora_rank" (None for a
        plain q_proj), "kv_lora_rank", "qk_nope_head_dim", "qk_rope_head_dim", "v_head_dim"}.
    dense_layers : tuple of int
        The layers of a mixture-of-experts model with a dense MLP (DeepSeek-V2's first
        first_k_dense_replace layers).
    shared_experts : int
        Shared experts every token passes through (DeepSeek-V2's n_shared_experts).
    router_normalized : bool
        Whether the top-k weights are renormalised to sum to 1 (Mixtral) or kept as softmax
        probabilities (DeepSeek-V2).
    routed_scaling_factor : float
        Factor of the routed experts' weights (DeepSeek-V2).
    expert_groups : tuple of two int or None
        (n_group, topk_group) of DeepSeek-V2's group-limited greedy router.
    d_ff : int
        The width of the dense MLP's hidden layer (intermediate_size, GPT-2's n_inner or
        4 d_model); 0 for attention-only models.
    post_norm : bool
        Post-norm layers (BERT): the embedding, and each block's sum with the stream, are
        normed; attention and the MLP read the stream itself. Pre-norm models norm what each
        block reads and end with a final norm.
    bidirectional : bool
        Every token attends to every token (BERT); decoders attend causally.
    token_types : int
        The rows of a token-type (segment) embedding added to the input (BERT's
        type_vocab_size); 0 for none.
    tokenizer : {"tokenizers", "wordpiece", "characters"}
        How text becomes tokens: tokenizer.json, BERT's vocab.txt WordPiece with [CLS] and
        [SEP], or one token per character of the vocabulary in config.json (the models
        ``attngeom run training`` trains).

    Examples
    --------
    >>> from attngeom.models import architecture_from_config
    >>> a = architecture_from_config({"model_type": "llama", "hidden_size": 32, "num_attention_heads": 4,
    ...                               "num_hidden_layers": 2, "vocab_size": 100})
    >>> a.family, a.d_head, a.rope["rope_type"]
    ('llama', 8, 'default')
    """

    model_type: str
    family: str
    n_layers: int
    n_heads: int
    n_kv_heads: int
    d_model: int
    d_head: int
    vocab_size: int
    norm: str
    norm_eps: float
    activation: str
    gated: bool
    rope: Optional[dict]
    qk_norm: bool
    tie_word_embeddings: bool
    max_positions: Optional[int]
    sliding_window: Optional[int] = None
    sliding_layers: Tuple[int, ...] = ()
    scale_attn: bool = True
    scale_by_layer: bool = False
    config: dict = field(default_factory=dict, repr=False, compare=False)
    n_experts: int = 0
    experts_per_token: int = 0
    mla: Optional[dict] = None
    dense_layers: Tuple[int, ...] = ()
    shared_experts: int = 0
    router_normalized: bool = True
    routed_scaling_factor: float = 1.0
    expert_groups: Optional[Tuple[int, int]] = None
    d_ff: int = 0
    post_norm: bool = False
    bidirectional: bool = False
    token_types: int = 0
    tokenizer: str = "tokenizers"

    @property
    def moe_layers(self) -> Tuple[int, ...]:
        """The layers with routed experts (empty for dense models)."""
        return tuple(i for i in range(self.n_layers) if i not in self.dense_layers) if self.n_experts else ()

    @property
    def rotary_dim(self) -> int:
        """The width the rotary embedding rotates: d_head, or qk_rope_head_dim under MLA."""
        return self.mla["qk_rope_head_dim"] if self.mla else self.d_head


def _int(cfg, where, *keys, default=None):
    for k in keys:
        v = cfg.get(k)
        if v is not None:
            if isinstance(v, bool) or not isinstance(v, int) or v < 1:
                raise ValueError(f"{where}: field {k!r} must be a positive integer, got {v!r}")
            return v
    if default is not None:
        return default
    raise ValueError(f"{where}: missing field {' / '.join(repr(k) for k in keys)}")


def _rope(cfg, where) -> dict:
    params = cfg.get("rope_parameters")
    if params is None:  # transformers < 5: rope_theta + rope_scaling
        params = dict(cfg.get("rope_scaling") or {})
        params["rope_theta"] = cfg.get("rope_theta", 10000.0)
    params = dict(params)
    if any(isinstance(v, dict) for v in params.values()):
        raise ValueError(f"{where}: per-layer-type rope_parameters are not supported, got {params!r}")
    kind = params.get("rope_type", params.get("type", "default"))
    if kind not in ROPE_TYPES:
        raise ValueError(f"{where}: rope_type {kind!r} is not supported (supported: {', '.join(ROPE_TYPES)})")
    params["rope_type"] = kind
    params.pop("type", None)
    if params.get("partial_rotary_factor", 1.0) != 1.0:
        raise ValueError(f"{where}: partial_rotary_factor {params['partial_rotary_factor']} is not supported")
    needs = {"linear": ("factor",), "llama3": ("factor", "low_freq_factor", "high_freq_factor"),
             "yarn": ("factor",)}.get(kind, ())
    for key in needs:
        if isinstance(params.get(key), bool) or not isinstance(params.get(key), (int, float)):
            raise ValueError(f"{where}: rope_type {kind!r} needs a number {key!r} in rope_parameters, got {params!r}")
    if kind == "yarn" and cfg.get("original_max_position_embeddings") is not None:  # transformers' priority
        params["original_max_position_embeddings"] = cfg["original_max_position_embeddings"]
    if kind in ("llama3", "yarn") and params.get("original_max_position_embeddings") is None:
        params["original_max_position_embeddings"] = cfg.get("max_position_embeddings")
    if kind in ("llama3", "yarn"):
        old = params["original_max_position_embeddings"]
        if isinstance(old, bool) or not isinstance(old, (int, float)) or old <= 0:
            raise ValueError(f"{where}: rope_type {kind!r} needs a positive original_max_position_embeddings "
                             f"(or max_position_embeddings), got {old!r}")
    for key in ("attention_factor", "mscale", "mscale_all_dim", "beta_fast", "beta_slow"):
        value = params.get(key)
        if value is not None and (isinstance(value, bool) or not isinstance(value, (int, float))
                                  or not math.isfinite(value) or value < 0):
            raise ValueError(f"{where}: rope_parameters {key!r} must be a non-negative number, got {value!r}")
    theta = params.get("rope_theta")
    if not isinstance(theta, (int, float)) or theta <= 1:
        raise ValueError(f"{where}: rope_theta must be a number > 1, got {theta!r}")
    return params


def _deepseek_v2(cfg, where, n_layers) -> dict:
    """The MLA and routed-expert fields of a DeepSeek-V2 config (module docstring)."""
    q_lora = cfg.get("q_lora_rank")
    mla = {"q_lora_rank": None if q_lora is None else _int(cfg, where, "q_lora_rank"),
           **{k: _int(cfg, where, k) for k in ("kv_lora_rank", "qk_nope_head_dim", "qk_rope_head_dim", "v_head_dim")}}
    if mla["qk_rope_head_dim"] % 2:
        raise ValueError(f"{where}: qk_rope_head_dim must be even (rotary pairs), got {mla['qk_rope_head_dim']}")
    n_experts = _int(cfg, where, "n_routed_experts", "num_local_experts")
    top_k = _int(cfg, where, "num_experts_per_tok")
    if top_k > n_experts:
        raise ValueError(f"{where}: num_experts_per_tok = {top_k} exceeds n_routed_experts = {n_experts}")
    if cfg.get("norm_topk_prob"):
        raise ValueError(f"{where}: norm_topk_prob = true is not supported for deepseek_v2 (transformers ignores "
                         f"it, DeepSeek's reference code renormalises the top-k weights)")
    method = cfg.get("topk_method", "greedy")
    if method not in TOPK_METHODS:
        raise ValueError(f"{where}: topk_method {method!r} is not supported (supported: {', '.join(TOPK_METHODS)})")
    groups = None
    if method == "group_limited_greedy":
        groups = (_int(cfg, where, "n_group"), _int(cfg, where, "topk_group"))
        if n_experts % groups[0] or groups[1] > groups[0] or top_k > groups[1] * (n_experts // groups[0]):
            raise ValueError(f"{where}: n_group = {groups[0]} must divide n_routed_experts = {n_experts}, "
                             f"topk_group = {groups[1]} must be <= n_group, and the kept groups must hold "
                             f"num_experts_per_tok = {top_k} experts")
    first_dense = cfg.get("first_k_dense_replace", 0)
    if isinstance(first_dense, bool) or not isinstance(first_dense, int) or first_dense < 0:
        raise ValueError(f"{where}: field 'first_k_dense_replace' must be a non-negative integer, got {first_dense!r}")
    shared = cfg.get("n_shared_experts") or 0
    if isinstance(shared, bool) or not isinstance(shared, int) or shared < 0:
        raise ValueError(f"{where}: field 'n_shared_experts' must be a non-negative integer, got {shared!r}")
    scale = cfg.get("routed_scaling_factor", 1.0)
    if isinstance(scale, bool) or not isinstance(scale, (int, float)) or not math.isfinite(scale):
        raise ValueError(f"{where}: field 'routed_scaling_factor' must be a finite number, got {scale!r}")
    _int(cfg, where, "moe_intermediate_size")
    return dict(mla=mla, n_experts=n_experts, experts_per_token=top_k,
                dense_layers=tuple(range(min(first_dense, n_layers))), shared_experts=shared,
                router_normalized=False, routed_scaling_factor=float(scale), expert_groups=groups)


def architecture_from_config(config: dict, *, where: str = "config.json") -> Architecture:
    """Parse a Hugging Face config.json into an :class:`Architecture`.

    Parameters
    ----------
    config : dict
        The parsed config.json.
    where : str, default "config.json"
        How error messages name the file.

    Returns
    -------
    Architecture
        The network's description.

    Raises
    ------
    ValueError
        For a model_type outside SUPPORTED_ARCHITECTURES (the message lists them), an
        unsupported rope type or activation, and missing or invalid dimension fields.

    Examples
    --------
    >>> from attngeom.models import architecture_from_config
    >>> architecture_from_config({"model_type": "gpt2", "n_embd": 32, "n_head": 4, "n_layer": 2,
    ...                           "vocab_size": 100}).activation
    'gelu_new'
    """
    if not isinstance(config, dict) or not config:
        raise ValueError(f"path: {where}: a config.json is needed to run a model's forward pass (none was found)")
    model_type = config.get("model_type")
    if model_type not in SUPPORTED_ARCHITECTURES:
        arch = config.get("architectures")
        raise ValueError(f"{where}: model_type {model_type!r}{f' (architectures {arch})' if arch else ''} is not "
                         f"supported; supported model types: {', '.join(SUPPORTED_ARCHITECTURES)}")
    family = SUPPORTED_ARCHITECTURES[model_type]
    n_layers = _int(config, where, "num_hidden_layers", "n_layer")
    n_heads = _int(config, where, "num_attention_heads", "n_head")
    d_model = _int(config, where, "hidden_size", "n_embd")
    vocab = _int(config, where, "vocab_size")
    n_kv = _int(config, where, "num_key_value_heads", default=n_heads)
    if n_heads % n_kv:
        raise ValueError(f"{where}: num_key_value_heads = {n_kv} must divide num_attention_heads = {n_heads}")
    d_head = _int(config, where, "head_dim", default=d_model // n_heads)
    if "head_dim" not in config and d_model % n_heads:
        raise ValueError(f"{where}: hidden_size {d_model} is not a multiple of num_attention_heads {n_heads}")
    if family == "gpt2":
        act = config.get("activation_function", "gelu_new")
        common = dict(norm="layernorm", norm_eps=float(config.get("layer_norm_epsilon", 1e-5)), activation=act,
                      gated=False, rope=None, qk_norm=False,
                      tie_word_embeddings=bool(config.get("tie_word_embeddings", True)),
                      max_positions=_int(config, where, "n_positions", "max_position_embeddings", default=1024),
                      scale_attn=bool(config.get("scale_attn_weights", True)),
                      scale_by_layer=bool(config.get("scale_attn_by_inverse_layer_idx", False)),
                      d_ff=_int(config, where, "n_inner", default=4 * d_model))
    elif family == "bert":
        act = config.get("hidden_act", "gelu")
        if config.get("position_embedding_type", "absolute") != "absolute":
            raise ValueError(f"{where}: position_embedding_type {config['position_embedding_type']!r} is not "
                             f"supported (BERT's absolute position table is)")
        common = dict(norm="layernorm", norm_eps=float(config.get("layer_norm_eps", 1e-12)), activation=act,
                      gated=False, rope=None, qk_norm=False, tie_word_embeddings=True,
                      max_positions=_int(config, where, "max_position_embeddings", default=512),
                      d_ff=_int(config, where, "intermediate_size", default=4 * d_model), post_norm=True,
                      bidirectional=True, token_types=_int(config, where, "type_vocab_size", default=2),
                      tokenizer="wordpiece")
    elif model_type == "attngeom-gpt":  # attngeom.torch.gpt: pre-LN, 4x GELU MLP, rotate-half RoPE, no biases
        act = "gelu"
        learned = config.get("positions", "rope") == "learned"  # a position table instead of RoPE
        common = dict(norm="layernorm", norm_eps=1e-5, activation=act, gated=False,
                      rope=None if learned else {"rope_type": "default", "rope_theta": 10000.0}, qk_norm=False,
                      tie_word_embeddings=False,
                      max_positions=_int(config, where, "max_position_embeddings") if learned else None,
                      d_ff=4 * d_model if config.get("mlp", True) else 0,
                      tokenizer="characters" if isinstance(config.get("vocab"), list) else "tokenizers")
    else:
        act = config.get("hidden_act", "silu")
        window = config.get("sliding_window")
        layer_types = config.get("layer_types")
        if layer_types is not None:
            if len(layer_types) != n_layers:
                raise ValueError(f"{where}: layer_types has {len(layer_types)} entries, num_hidden_layers is {n_layers}")
            sliding = tuple(i for i, t in enumerate(layer_types) if t == "sliding_attention")
        elif model_type == "qwen2":
            first = config.get("max_window_layers", n_layers)
            sliding = tuple(range(first, n_layers)) if config.get("use_sliding_window") else ()
        else:
            sliding = tuple(range(n_layers)) if window is not None else ()
        if sliding and (not isinstance(window, int) or window < 1):
            raise ValueError(f"{where}: sliding_window must be a positive integer for the layers {list(sliding)}, "
                             f"got {window!r}")
        common = dict(norm="rmsnorm", norm_eps=float(config.get("rms_norm_eps", 1e-6)), activation=act, gated=True,
                      rope=_rope(config, where), qk_norm=model_type == "qwen3",
                      tie_word_embeddings=bool(config.get("tie_word_embeddings", False)), max_positions=None,
                      sliding_window=window if sliding else None, sliding_layers=sliding,
                      d_ff=_int(config, where, "intermediate_size", default=4 * d_model))
    if model_type == "mixtral":
        n_experts = _int(config, where, "num_local_experts")
        top_k = _int(config, where, "num_experts_per_tok")
        if top_k > n_experts:
            raise ValueError(f"{where}: num_experts_per_tok = {top_k} exceeds num_local_experts = {n_experts}")
        common.update(n_experts=n_experts, experts_per_token=top_k)
    if model_type == "deepseek_v2":
        if n_kv != n_heads:
            raise ValueError(f"{where}: num_key_value_heads = {n_kv} must equal num_attention_heads = {n_heads} "
                             f"under multi-head latent attention (every head expands its own key and value)")
        common.update(_deepseek_v2(config, where, n_layers))
        d_head = common["mla"]["qk_nope_head_dim"] + common["mla"]["qk_rope_head_dim"]
    if act not in ACTIVATIONS:
        raise ValueError(f"{where}: activation {act!r} is not supported (supported: {', '.join(ACTIVATIONS)})")
    return Architecture(model_type=model_type, family=family, n_layers=n_layers, n_heads=n_heads, n_kv_heads=n_kv,
                        d_model=d_model, d_head=d_head, vocab_size=vocab, config=dict(config), **common)
