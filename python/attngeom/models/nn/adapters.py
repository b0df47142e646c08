"""Models already in memory: a ``transformers`` PreTrainedModel or a TransformerLens bridge.

* :func:`from_transformers` wraps a Hugging Face model (GPT-2, Llama, Mistral, Qwen2, Qwen3, Mixtral, DeepSeek-V2,
  BERT) as a :class:`Model`: its state dict and ``config.to_dict()`` go through the same
  path as a checkpoint folder (:func:`load_model`), the tensors viewed, not copied
  (bfloat16 kept as its bits and widened one layer at a time, as for a memory-mapped file).
* :func:`from_transformer_lens` does the same for a TransformerLens 4.x
  ``TransformerBridge`` (the wrapped Hugging Face model), with :attr:`Model.heads` read from
  the bridge's stacked weights in the TransformerLens layout (``bridge.W_Q`` ...).

Both import nothing at module import: torch is only touched through the tensors handed in,
so ``import attngeom`` never imports torch, transformers or transformer_lens.
"""
from __future__ import annotations

import numpy as np

from ..io.checkpoint import Checkpoint
from ..io.safetensors import BFloat16Array
from .heads import ModelHeads, heads_from_checkpoint
from .model import Model, model_from_checkpoint


def _numpy_view(name: str, tensor):
    """A torch tensor as a read-only NumPy array sharing its memory (a copy only for tensors
    off the CPU); bfloat16 as a :class:`BFloat16Array` over its bits."""
    t = tensor.detach()
    if t.device.type == "meta":
        raise ValueError(f"tensor {name!r} is on the meta device (no values): load the model with its weights")
    if t.device.type != "cpu":
        t = t.cpu()
    if str(t.dtype) == "torch.bfloat16":
        import torch  # present: the tensor is a torch tensor

        bits = t.view(torch.int16).numpy().view(np.uint16)
        bits.flags.writeable = False
        return BFloat16Array(bits)
    try:
        a = t.numpy()
    except TypeError as exc:  # fp8 and other dtypes NumPy cannot hold
        raise ValueError(f"tensor {name!r} has dtype {t.dtype}, which is not supported (float32, float16, "
                         f"bfloat16, float64): {exc}") from None
    a = a.view()
    a.flags.writeable = False
    return a


_WRAPPED = "._original_component"  # what a TransformerBridge inserts into the names of the modules it wraps


def _state_dict_checkpoint(model, source: str) -> Checkpoint:
    """The model's state dict and config as a :class:`Checkpoint` held in memory, under the
    Hugging Face names (a TransformerBridge's wrapper segments removed, first name kept)."""
    if not (hasattr(model, "state_dict") and hasattr(getattr(model, "config", None), "to_dict")):
        raise TypeError(f"model must be a transformers PreTrainedModel (with state_dict() and config.to_dict()), "
                        f"got {type(model).__name__}")
    tensors = {}
    for name, t in model.state_dict().items():
        if name.startswith(_WRAPPED[1:] + "."):
            continue
        tensors.setdefault(name.replace(_WRAPPED, ""), (name, t))
    tensors = {clean: _numpy_view(name, t) for clean, (name, t) in tensors.items()}
    return Checkpoint.from_tensors(tensors, model.config.to_dict(), source=source)


def from_transformers(model) -> Model:
    """A :class:`Model` of a ``transformers`` model in memory (no files, no copy of the weights).

    The state dict and ``model.config.to_dict()`` are read as :func:`load_model` reads a
    checkpoint folder, so the same architectures are supported (GPT-2, Llama, Mistral,
    Qwen2, Qwen3, BERT; an unsupported ``model_type`` raises ValueError listing them) and
    ``forward`` reproduces the model's logits, hidden states and attentions. The arrays are
    read-only views of the tensors' memory: changing the torch model's weights in place
    changes this Model's (tensors off the CPU are copied). :attr:`Model.heads` gives the
    per-head weights (:class:`ModelHeads`, RoPE and q/k norms included). There are no
    tokenizer files: pass token ids to :meth:`Model.forward`.

    Parameters
    ----------
    model : transformers.PreTrainedModel
        E.g. ``GPT2LMHeadModel``, ``LlamaForCausalLM``, ``Qwen3ForCausalLM``, ``BertModel``.

    Returns
    -------
    Model
        With ``path`` "<transformers ClassName>".

    Raises
    ------
    TypeError
        For an object without ``state_dict()`` and ``config.to_dict()``.
    ValueError
        For an unsupported architecture, a config that disagrees with the tensors (as
        :func:`load_model`), tensors on the meta device and dtypes NumPy cannot hold (fp8).

    Examples
    --------
    >>> hf = transformers.AutoModelForCausalLM.from_pretrained("Qwen/Qwen3-0.6B")  # doctest: +SKIP
    >>> m = ag.models.from_transformers(hf)  # doctest: +SKIP
    >>> m.forward(np.array([1, 2, 3])).logits.shape  # doctest: +SKIP
    (3, 151936)
    """
    source = f"<transformers {type(model).__name__}>"
    return model_from_checkpoint(_state_dict_checkpoint(model, source), where=f"{source}.config")


def _tl_stack(bridge, name: str):
    """bridge.<name> (a stacked TransformerLens weight) as a float64 array, or None when the
    model has no such parameter (TransformerLens raises AttributeError for bias-free models)."""
    try:
        t = getattr(bridge, name)
    except AttributeError:
        return None
    return None if t is None else np.asarray(t.detach().to("cpu").double().numpy())


def from_transformer_lens(bridge) -> Model:
    """A :class:`Model` of a TransformerLens 4.x ``TransformerBridge``, heads read in its layout.

    The forward pass is that of the wrapped Hugging Face model (``bridge.original_model``,
    through :func:`from_transformers`), which is what an unprocessed bridge computes.
    :attr:`Model.heads` holds the bridge's stacked weights in the TransformerLens layout,
    ``bridge.W_Q``, ``W_K``, ``W_V`` (n_layers, n_heads, d_model, d_head), ``W_O`` (n_layers,
    n_heads, d_head, d_model) and the biases where the model has them, grouped key/value
    heads repeated for their query heads, with the rotary embedding and Qwen3's q/k norms of
    the wrapped model. Activations from the bridge's hooks (``blocks.{l}.attn.hook_q``, of
    shape (batch, pos, head, d_head)) go into the attention functions with
    ``layout="bnhd"``.

    Parameters
    ----------
    bridge : transformer_lens.model_bridge.TransformerBridge
        An unprocessed bridge, e.g. from ``TransformerBridge.boot_transformers(name)`` or
        ``boot_transformers(name, hf_model=model, tokenizer=tokenizer)``.

    Returns
    -------
    Model
        With ``path`` "<transformers ClassName>" of the wrapped model.

    Raises
    ------
    TypeError
        For a HookedTransformer (TransformerLens 3.x, removed in 4.x) or another object.
    ValueError
        For a bridge whose weights were processed (``process_weights`` or
        ``enable_compatibility_mode``: folded layer norms and centred weights are no longer
        the Hugging Face model's, so the forward pass would differ), a non-torch bridge
        (vLLM), and a bridge whose stacked weights disagree in shape with its model's.

    Examples
    --------
    >>> from transformer_lens.model_bridge import TransformerBridge  # doctest: +SKIP
    >>> m = ag.models.from_transformer_lens(TransformerBridge.boot_transformers("gpt2"))  # doctest: +SKIP
    >>> m.heads.W_Q.shape  # doctest: +SKIP
    (12, 12, 768, 64)
    """
    kind = type(bridge).__name__
    if kind == "HookedTransformer":
        raise TypeError("from_transformer_lens takes a TransformerLens 4.x TransformerBridge; HookedTransformer was "
                        "removed in 4.x (boot one with TransformerBridge.boot_transformers(name), or pass its Hugging "
                        "Face model to from_transformers)")
    processed = getattr(bridge, "_weights_processed", None)
    if not all(hasattr(type(bridge), a) for a in ("W_Q", "W_K", "W_V", "W_O")) or processed is None:
        raise TypeError(f"bridge must be a TransformerLens 4.x TransformerBridge, got {kind}")
    if processed:
        raise ValueError("this TransformerBridge's weights were processed (process_weights / enable_compatibility_mode "
                         "folds layer norms and centres weights), so they are no longer the Hugging Face model's; "
                         "boot a fresh bridge without processing")
    try:
        hf = bridge.original_model
    except AttributeError as exc:
        raise ValueError(f"this TransformerBridge has no local torch model ({exc})") from None
    source = f"<transformers {type(hf).__name__}>"
    ck = _state_dict_checkpoint(hf, source)
    own = heads_from_checkpoint(ck)  # rotary embedding, q/k norms, config, from the wrapped model
    w = {name: _tl_stack(bridge, name) for name in ("W_Q", "W_K", "W_V", "W_O", "b_Q", "b_K", "b_V", "b_O")}
    group = own.n_heads // own.n_kv_heads
    for name in ("W_K", "W_V", "b_K", "b_V"):
        if w[name] is not None and w[name].shape[1] == own.n_kv_heads and group > 1:
            w[name] = np.repeat(w[name], group, axis=1)  # query head h reads kv head h // group
    for name in ("W_Q", "W_K", "W_V", "W_O", "b_Q", "b_K", "b_V", "b_O"):
        expected = getattr(own, name)
        got = w[name]
        if (expected is None) != (got is None) or (got is not None and got.shape != expected.shape):
            raise ValueError(f"bridge.{name} has shape {None if got is None else got.shape}, but the wrapped model's "
                             f"{name} has {None if expected is None else expected.shape}")
    heads = ModelHeads(w["W_Q"], w["W_K"], w["W_V"], w["W_O"], w["b_Q"], w["b_K"], w["b_V"], w["b_O"], own.layout,
                       own.causal, own.n_kv_heads, path=f"<TransformerLens bridge of {type(hf).__name__}>",
                       config=own.config, rotary=own.rotary, q_norm=own.q_norm, k_norm=own.k_norm,
                       norm_eps=own.norm_eps)
    return model_from_checkpoint(ck, where=f"{source}.config", heads=heads)
