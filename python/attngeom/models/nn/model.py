"""A checkpoint ready to run: ``load_model(path_or_name)`` -> :class:`Model`.

One API for every supported architecture (:data:`SUPPORTED_ARCHITECTURES`): the decoders
(GPT-2, Llama, Mistral, Qwen2, Qwen3, Mixtral, DeepSeek-V2) and the BERT encoder all run
:class:`attngeom.models.Decoder` (BERT as its post-norm, bidirectional case, without
logits). ``Model.forward(token_ids)`` returns a
:class:`Forward` with logits, hidden states, attentions and the per-layer q, k, v the
attention uses. NumPy and the library's attention kernel only: no PyTorch. Weights are memory-mapped
(:meth:`Checkpoint.mapped`): loading reads only the headers, and each layer's weights are
cast to the computation dtype (bfloat16 widened) when the forward pass reaches that layer.

Padding: a 2-D batch takes ``attention_mask`` (1 = token, 0 = padding, left or right).
Padded keys are hidden from every query, and positions count real tokens only (position =
cumulative count - 1, what ``generate`` uses), so each sequence's outputs at its real tokens
equal those of the sequence run alone.
"""
from __future__ import annotations

import os
from typing import List, Optional, Tuple

import numpy as np

from ..._operands import check_token_ids
from ..io.architecture import Architecture, architecture_from_config
from ..io.checkpoint import Checkpoint
from ..io.layouts import detect_layout
from ..io.tokenizer import tokenize
from .decoder import Decoder
from .forward import Forward, plan_forward
from .heads import ModelHeads, heads_from_checkpoint


class Model:
    """A loaded checkpoint: its :class:`Architecture`, weights, heads and forward pass.

    Build with :func:`load_model`, or from a model in memory with
    :func:`attngeom.models.from_transformers` / :func:`attngeom.models.from_transformer_lens`.

    Attributes
    ----------
    arch : Architecture
        What config.json describes.
    path : str
        The folder (or file) the weights came from (for a model in memory, its class).
    folder : str
        The folder holding config.json and the tokenizer files ("" for a model in memory).

    Examples
    --------
    >>> model = ag.load_model("Qwen/Qwen3-0.6B")  # doctest: +SKIP
    >>> model.forward(np.array([1, 2, 3])).attentions.shape  # doctest: +SKIP
    (28, 16, 3, 3)
    """

    def __init__(self, ck: Checkpoint, arch: Architecture, prefix: str, heads: Optional[ModelHeads] = None):
        self.arch = arch
        self.path = str(ck.path)
        self.folder = ck.folder
        self._checkpoint = ck
        self._heads = heads
        self.decoder = Decoder.from_checkpoint(ck, arch, prefix)

    @property
    def heads(self) -> ModelHeads:
        """The per-head weights (:class:`ModelHeads`, float64), loaded on first use (or given
        by the adapter that built the Model)."""
        if self._heads is None:
            if self.arch.mla:
                raise ValueError(f"model: a {self.arch.model_type} model has multi-head latent attention, whose keys "
                                 f"pass through the latent's RMSNorm: it has no per-head W_Q, W_K, W_V (use the "
                                 f"forward pass's q, k, v)")
            self._heads = heads_from_checkpoint(self._checkpoint)
        return self._heads

    def __repr__(self) -> str:
        a = self.arch
        return (f"Model({a.model_type} from {self.path!r}: {a.n_layers} layers x {a.n_heads} heads (kv heads "
                f"{a.n_kv_heads}), d_model {a.d_model}, d_head {a.d_head}, vocabulary {a.vocab_size})")

    @property
    def n_layers(self) -> int:
        """Number of layers."""
        return self.arch.n_layers

    @property
    def max_length(self) -> Optional[int]:
        """The longest sequence an absolute position table allows (None for rotary models)."""
        return self.arch.max_positions

    def tokenize(self, text: str, *, max_length: Optional[int] = None) -> Tuple[List[int], List[str]]:
        """Token ids and token strings of ``text`` with the checkpoint's tokenizer files.

        tokenizer.json through the ``tokenizers`` package (vocab.txt WordPiece for BERT; one
        token per character for the models ``attngeom run training`` trains, from the
        vocabulary in their config.json); decoders are truncated by dropping the tail.

        Parameters
        ----------
        text : str
            The input text.
        max_length : int, optional
            Keep at most this many tokens.

        Returns
        -------
        ids : list of int
            Token ids in the model's vocabulary.
        tokens : list of str
            Token strings, one per id.

        Examples
        --------
        >>> ids, tokens = model.tokenize("The cat sat.")  # doctest: +SKIP
        """
        if self.arch.family == "bert":
            return tokenize(self.folder, text, max_length=max_length)
        vocab = self.arch.config.get("vocab")
        if self.arch.model_type == "attngeom-gpt" and isinstance(vocab, list):  # one token per character
            unknown = sorted(set(text) - set(vocab))
            if unknown:
                raise ValueError(f"text has characters outside the model's vocabulary: {''.join(unknown[:20])!r}")
            ids = [vocab.index(ch) for ch in text[:max_length]]
            return ids, [vocab[i] for i in ids]
        if not os.path.isfile(os.path.join(self.folder, "tokenizer.json")):
            raise ValueError(f"folder {self.folder!r} has no tokenizer.json; pass token ids to forward() instead")
        ids, tokens = tokenize(self.folder, text, backend="tokenizers")
        if max_length is not None:
            ids, tokens = ids[:max_length], tokens[:max_length]
        return ids, tokens

    def forward(self, token_ids, *, attention_mask=None, dtype=np.float32, keep=None, layers=None,
                logits_at=None, interventions=None) -> Forward:
        """Run the model on token ids, keeping what is asked.

        Parameters
        ----------
        token_ids : array_like of int, shape (n,) or (batch, n)
            One sequence, or a batch of equally long (padded) sequences.
        attention_mask : array_like, shape of token_ids, optional
            1 / True for real tokens, 0 / False for padding (left or right); default all
            real. Every sequence needs at least one real token.
        dtype : {np.float32, np.float64}, default np.float32
            The computation dtype (weights of any stored precision are cast to it).
        keep : str or sequence of str, optional
            The :class:`Forward` fields to compute and return (the others are None and never
            allocated): any of :data:`attngeom.models.nn.forward.KEEPABLE`. Default: every field
            but ``attention_stats`` and the block outputs, which are kept only when named.
            Without "attentions" the pass forms no (n, n) weights: ``keep=("attention_stats", "logits")`` with
            ``logits_at="last"`` analyses every head of a long document in the memory of the
            weights plus a few layer-sized arrays.
        layers : int or sequence of int, optional
            The layers whose per-layer fields are kept (default all; negative indices count
            from the end). The pass stops after the last of them unless logits or hidden
            states are kept.
        logits_at : {"last", "all"} or array_like of int, optional
            The token indices whose logits are computed ("last": each sequence's last real
            token, shape ([batch,] 1, vocab); default every token). The unembedding, a
            (vocab, d_model) product per position, is applied only there.
        interventions : sequence of Ablate, Project, Patch, Hook, optional
            Changes to the activations at named sites, applied in order as the pass runs
            (:mod:`attngeom.models.nn.interventions`); the kept fields hold the changed values.
            Without interventions the pass is bitwise the plain one.

        Returns
        -------
        Forward
            logits, hidden_states, attentions, attention_inputs, q, k, v, q_prerotary,
            k_prerotary, attention_stats, ... (shapes in :class:`Forward`; a batch axis after
            the layer axis for 2-D input). The kept fields are bitwise the same whatever else
            is kept, and at any thread count; logits at some positions only (``logits_at``)
            equal the full logits to rounding (a product of another shape).

        Raises
        ------
        ValueError
            For token ids that are not integers or lie outside 0..vocab_size-1, a mask of
            another shape or with an empty sequence, sequences beyond the position table
            (GPT-2, BERT), another dtype, an unknown field in `keep`, `layers` or `logits_at`
            out of range, and a pass whose kept fields and working arrays would not fit in the
            memory available (refused before anything is allocated, naming the field, its size
            and ``keep=``).

        Examples
        --------
        >>> f = model.forward(np.array([[0, 5, 7], [3, 4, 9]]), attention_mask=[[0, 1, 1], [1, 1, 1]])  # doctest: +SKIP
        >>> f.logits.shape  # doctest: +SKIP
        (2, 3, 100)
        >>> f = model.forward(ids, keep=("attention_stats", "logits"), logits_at="last")  # doctest: +SKIP
        >>> f.attention_stats.entropy.shape, f.logits.shape  # doctest: +SKIP
        ((28, 16, 4096), (1, 151936))
        """
        dt = np.dtype(dtype)
        if dt not in (np.dtype(np.float32), np.dtype(np.float64)):
            raise ValueError(f"dtype must be float32 or float64, got {dt}")
        try:
            ids = np.asarray(token_ids)
        except ValueError:  # ragged nested sequences
            raise ValueError("token_ids must be a non-empty (n,) or (batch, n) integer array, got a ragged "
                             "sequence") from None
        if ids.ndim not in (1, 2) or ids.size == 0 or ids.dtype.kind not in "iu":
            raise ValueError(f"token_ids must be a non-empty (n,) or (batch, n) integer array, got shape {ids.shape}, "
                             f"dtype {ids.dtype}")
        single = ids.ndim == 1
        ids = ids.reshape(1, -1) if single else ids
        V = self.arch.vocab_size
        check_token_ids("token_ids", ids, V, f" (config.json vocab_size {V})")
        if attention_mask is None:
            mask = np.ones(ids.shape, dtype=bool)
        else:
            m = np.asarray(attention_mask)
            expected = (ids.shape[1],) if single else ids.shape
            if m.shape != expected:
                raise ValueError(f"attention_mask must have token_ids' shape {np.shape(token_ids)}, got {m.shape}")
            if m.dtype.kind not in "biuf" or not np.all((m == 0) | (m == 1)):
                raise ValueError("attention_mask must hold 0/1 or booleans")
            mask = m.reshape(ids.shape).astype(bool)
            empty = np.flatnonzero(~mask.any(axis=1))
            if empty.size:
                raise ValueError(f"attention_mask: sequence {int(empty[0])} has no real token")
        positions = np.maximum(np.cumsum(mask, axis=1) - 1, 0)
        limit = self.arch.max_positions
        if limit is not None and positions.max() >= limit:
            raise ValueError(f"token_ids has {int(positions.max()) + 1} tokens in a sequence, more than the "
                             f"{limit} positions of the model's position table (config.json "
                             f"{'n_positions' if self.arch.family == 'gpt2' else 'max_position_embeddings'})")
        plan = plan_forward(self.arch, mask, dt, keep=keep, layers=layers, logits_at=logits_at,
                            interventions=interventions, single=single)
        out = self.decoder.forward(ids.astype(np.int64), mask, positions, dt, plan)
        return out.sequence(0) if single else out

    def _resume(self, ids, layer: int, h, interventions, dtype) -> Forward:
        """The logits of a pass over checked token ids (batch, n), all real, started at `layer`
        from the residual stream h (batch, n, d_model) entering it, with interventions (used
        by :func:`head_ablation_effects`, which reuses one clean pass up to each layer)."""
        mask = np.ones(ids.shape, dtype=bool)
        positions = np.broadcast_to(np.arange(ids.shape[1]), ids.shape)
        plan = plan_forward(self.arch, mask, np.dtype(dtype), keep=("logits",), layers=[layer],
                            interventions=interventions)
        return self.decoder.forward(ids.astype(np.int64), mask, positions, np.dtype(dtype), plan, resume=(layer, h))


def load_model(path, *, backend: str = "auto") -> Model:
    """Load a checkpoint for its forward pass: a folder, a file, or a cached hub model name.

    Parameters
    ----------
    path : str or path-like
        A folder with config.json and ``*.safetensors`` (sharded folders are read through
        model.safetensors.index.json), a packaged model name ("all-MiniLM-L6-v2"), or a
        Hugging Face model name ("Qwen/Qwen3-0.6B"), looked up offline in the local
        Hugging Face cache (:func:`hub_snapshot`).
    backend : {"auto", "package", "python"}, default "auto"
        The safetensors reader (as in :class:`SafetensorsFile`).

    Returns
    -------
    Model
        With :meth:`Model.forward`, :meth:`Model.tokenize` and :attr:`Model.heads`.

    Raises
    ------
    ValueError
        For an unknown architecture (listing the supported ones), a config.json that
        disagrees with the tensors' shapes (naming tensor, file and fields), missing shards,
        unsupported tensor dtypes (fp8), a missing config.json, and a model name that is not
        cached (saying where it looked and how to download it).

    Examples
    --------
    >>> model = ag.load_model("all-MiniLM-L6-v2")  # doctest: +SKIP
    >>> model.forward(np.array([101, 7592, 102])).hidden_states.shape  # doctest: +SKIP
    (7, 3, 384)
    """
    ck = Checkpoint(path, backend=backend)
    return model_from_checkpoint(ck, where=os.path.join(ck.folder, "config.json"))


def model_from_checkpoint(ck: Checkpoint, *, where: str, heads: Optional[ModelHeads] = None) -> Model:
    """:func:`load_model` of an opened :class:`Checkpoint` (a folder's, or one held in memory).

    Parameters
    ----------
    ck : Checkpoint
        The checkpoint, with its config.
    where : str
        Names the config in messages.
    heads : ModelHeads, optional
        The per-head weights :attr:`Model.heads` returns (default: read from ``ck`` on first
        use).

    Returns
    -------
    Model
        As :func:`load_model`.

    Examples
    --------
    >>> model = model_from_checkpoint(Checkpoint("model_dir"), where="model_dir/config.json")  # doctest: +SKIP
    """
    arch = architecture_from_config(ck.config, where=where)
    layout, prefix, layers = detect_layout(ck.names, "mla" if arch.mla else arch.family)
    if len(layers) != arch.n_layers:
        raise ValueError(f"{where}: num_hidden_layers is {arch.n_layers}, but the checkpoint has {len(layers)} layers")
    return Model(ck, arch, prefix, heads)
