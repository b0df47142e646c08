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

import math
import os
import warnings
from typing import List, Optional, Tuple

import numpy as np

from ..._operands import check_token_ids, generator
from ...errors import ContextWarning, NonFiniteOperand
from ..io.architecture import Architecture, architecture_from_config
from ..io.checkpoint import Checkpoint
from ..io.layouts import detect_layout
from ..io.tokenizer import tokenize
from .decoder import Decoder
from .forward import Forward, keep_names, plan_forward
from .generate import generate as _generate
from .heads import ModelHeads, heads_from_checkpoint
from .products import BFLOAT16, compute_dtype


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
    >>> model.forward(np.array([1, 2, 3])).pattern.shape  # doctest: +SKIP
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
    def keep_weights(self) -> bool:
        """Keep the layers' weights across forward passes (default False).

        By default a pass casts each layer's stored weights to the computation dtype when it
        reaches the layer and, after it, releases a mapped checkpoint's pages from the resident
        set, so a pass holds about one layer of weights however large the model. With
        ``model.keep_weights = True`` (or ``load_model(..., keep_weights=True)``) the weights
        as a pass reads them are kept for the next pass of the same dtype: the float32 or
        float64 copies of the layers and of the unembedding, or in the bfloat16 mode the
        stored bfloat16 weights, whose mapped pages then stay resident. Repeated passes skip
        the casts and the page faults. It also lets the process keep the memory a pass frees
        for the next pass, which then does not fault its activations in again: glibc's malloc
        thresholds are raised for the whole process, once
        (``attngeom.models.nn.forward.retain_freed_memory``; 500 page faults a pass instead of
        302,000 for a Qwen3-0.6B-shaped float32 forward of 512 tokens on 2 threads). The first
        pass in a dtype checks that the kept weights take at most 80% of the memory available
        (``model.decoder.kept_bytes(dtype)``), and raises ValueError otherwise. Setting it to
        False drops what was kept (the malloc thresholds stay).
        """
        return self.decoder.keep_weights

    @keep_weights.setter
    def keep_weights(self, on: bool) -> None:
        self.decoder.keep_weights = on

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

    @property
    def context_length(self) -> Optional[int]:
        """The longest sequence the model knows: its position table's size, else (rotary
        models) the context it was trained on, config.json's max_position_embeddings (which
        attngeom-gpt checkpoints store too); None when the config records neither.

        Longer inputs are refused with a position table and run with a
        :class:`attngeom.errors.ContextWarning` otherwise (their attention past the trained
        context is extrapolation).
        """
        if self.arch.max_positions is not None:
            return self.arch.max_positions
        value = self.arch.config.get("max_position_embeddings")
        return value if isinstance(value, int) and not isinstance(value, bool) and value > 0 else None

    def context_warning(self, n: int, what: str = "token_ids has", *, stacklevel: int = 2) -> None:
        """Warn (:class:`attngeom.errors.ContextWarning`) when a rotary model is given a
        sequence of `n` tokens, more than the context it was trained on; nothing otherwise.
        `what` begins the message ("token_ids has", "the text has")."""
        trained = self.context_length
        if self.arch.max_positions is None and trained is not None and n > trained:
            warnings.warn(f"{what} {n} tokens, past the {trained}-token context this {self.arch.model_type} model "
                          f"was trained on (config.json max_position_embeddings): all {n} tokens are analysed, "
                          f"and attention past position {trained} is extrapolation (truncate to {trained} tokens "
                          f"to stay inside it)", ContextWarning, stacklevel=stacklevel + 1)

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
        if self.arch.tokenizer == "wordpiece":
            return tokenize(self.folder, text, max_length=max_length)
        vocab = self.arch.config.get("vocab")
        if self.arch.tokenizer == "characters":  # one token per character
            unknown = sorted(set(text) - set(vocab))
            if unknown:
                raise ValueError(f"text has characters outside the model's vocabulary: {''.join(unknown[:20])!r}")
            ids = [vocab.index(ch) for ch in text[:max_length]]
            return ids, [vocab[i] for i in ids]
        if not os.path.isfile(os.path.join(self.folder, "tokenizer.json")):
            raise ValueError(f"folder {self.folder!r} has no tokenizer.json; pass token ids to forward() instead "
                             f"(on the command line: attngeom heads --ids FILE, a file of whitespace-separated "
                             f"token ids)")
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
        dtype : {np.float32, np.float64, "bfloat16"}, default np.float32
            The computation dtype (weights of any stored precision are cast to it), or
            "bfloat16" (also ``ml_dtypes.bfloat16``): every matrix product reads its weights as
            bfloat16 (a bfloat16 checkpoint's bits as stored, no widened copy), rounds its input
            rows to bfloat16 and sums in float32 (the CPU's AMX tiles or bfloat16 dot products
            where it has them: AMX-BF16 on Intel Sapphire Rapids and later, AVX512_BF16 on AMD
            Zen 4 and later); the attention
            reads q, k, v rounded to bfloat16 with float32 scores, softmax and statistics; norms,
            rotary embedding and residual sums are float32, and so are the kept sites and logits.
        keep : str or sequence of str, optional
            The sites (:mod:`attngeom.models.nn.sites`), "logits" and "attention_stats" to
            compute and return (the others are None and never allocated), or "all" (every
            site: a cache of the whole pass, read by TransformerLens names as ``f.items()``).
            Default :data:`attngeom.models.nn.forward.KEEP_DEFAULT`: the logits, resid_pre,
            ln_final, attn_in, q, k, v (and their unrotated forms), pattern, and the router's and
            latent's sites. Without "pattern" the pass forms no (n, n) weights:
            ``keep=("attention_stats", "logits")`` with ``logits_at="last"`` analyses every
            head of a long document in the memory of the weights plus a few layer-sized arrays.
            The transformers names "hidden_states", "attentions" and "attention_inputs" work
            for one release, with a DeprecationWarning.
        layers : int or sequence of int, optional
            The layers whose per-layer sites are kept (default all; negative indices count
            from the end). The pass stops after the last of them unless the logits or
            ln_final are kept.
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
            Keyed by site (shapes in :class:`Forward`; a batch axis after the layer axis for
            2-D input): ``f.pattern``, ``f["pattern", 3]``, ``f["blocks.3.attn.hook_pattern"]``. The kept sites are bitwise the same whatever else
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

        Warns
        -----
        ContextWarning
            For a rotary model given more tokens than the context it was trained on
            (:attr:`context_length`, config.json's max_position_embeddings): the pass runs
            and the message names that length.

        Examples
        --------
        >>> f = model.forward(np.array([[0, 5, 7], [3, 4, 9]]), attention_mask=[[0, 1, 1], [1, 1, 1]])  # doctest: +SKIP
        >>> f.logits.shape  # doctest: +SKIP
        (2, 3, 100)
        >>> f = model.forward(ids, keep=("attention_stats", "logits"), logits_at="last")  # doctest: +SKIP
        >>> f.attention_stats.entropy.shape, f.logits.shape  # doctest: +SKIP
        ((28, 16, 4096), (1, 151936))
        """
        dt = self._dtype(dtype)
        ids, single = self._token_ids(token_ids)
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
                             f"{'n_positions' if 'n_positions' in self.arch.config else 'max_position_embeddings'})")
        self.context_warning(int(positions.max()) + 1)
        plan = plan_forward(self.arch, mask, compute_dtype(dt)[0], keep=keep_names(keep), layers=layers, logits_at=logits_at,
                            interventions=interventions, single=single)
        out = self.decoder.forward(ids.astype(np.int64), mask, positions, dt, plan)
        return out.sequence(0) if single else out

    def generate(self, token_ids, n_new: int, *, temperature: float = 0.0, seed=None, attention_mask=None,
                 dtype=np.float32) -> np.ndarray:
        """Continue prompts by `n_new` tokens, with a key/value cache in the NumPy forward pass.

        One pass over the prompt caches every layer's keys and values (as the attention uses
        them: rotated); each new token then computes only its own queries, keys, values and
        MLP against the cache (:meth:`attngeom.models.Decoder.step`), with positions continuing
        the prompt's and sliding-window layers seeing the last ``sliding_window`` positions.
        Its logits equal those of a full :meth:`forward` over the sequence so far (to rounding:
        about 1e-6 relative in float32, 1e-15 in float64), so greedy generation is the argmax
        of repeated full passes, token for token.

        Parameters
        ----------
        token_ids : array_like of int, shape (n,) or (batch, n)
            The prompt, or a batch of equally long prompts (no padding).
        n_new : int
            Tokens to generate, >= 1; n + n_new may not exceed the model's context (its
            position table, or config.json's max_position_embeddings for rotary models).
        temperature : float, default 0.0
            0: greedy (the argmax of the logits, ties to the lowest id); > 0: each token drawn
            from softmax(logits / temperature).
        seed : int, optional
            Seed of ``np.random.default_rng`` for the draws (temperature > 0).
        attention_mask : array_like, optional
            Only a mask of ones is accepted (padded batches are not supported).
        dtype : {np.float32, np.float64, "bfloat16"}, default np.float32
            The computation dtype (as in :meth:`forward`).

        Returns
        -------
        ndarray of int64, shape (n + n_new,) or (batch, n + n_new)
            The prompt followed by the generated tokens.

        Raises
        ------
        ValueError
            Before anything is computed, naming the argument: an encoder (BERT: no logits, not
            causal), `n_new` not an integer >= 1 or beyond the context, a negative or
            non-finite `temperature`, token ids outside the vocabulary, an attention mask with
            padding, another dtype.

        Examples
        --------
        >>> out = model.generate(np.array([1, 2, 3]), 5)  # doctest: +SKIP
        >>> out.shape  # doctest: +SKIP
        (8,)
        >>> model.generate([[1, 2], [3, 4]], 4, temperature=0.8, seed=0).shape  # doctest: +SKIP
        (2, 6)
        """
        a = self.arch
        if a.bidirectional or not self.has_unembedding:
            raise ValueError(f"generate: a {a.model_type} checkpoint is not a causal decoder with logits; it cannot "
                             f"generate")
        if isinstance(n_new, (bool, np.bool_)) or not isinstance(n_new, (int, np.integer)) or n_new < 1:
            raise ValueError(f"n_new must be an integer >= 1, got {n_new!r}")
        n_new = int(n_new)
        if isinstance(temperature, (bool, np.bool_)) or not isinstance(temperature, (int, float, np.integer,
                                                                                     np.floating)) \
                or not math.isfinite(temperature) or temperature < 0:
            raise ValueError(f"temperature must be a finite number >= 0, got {temperature!r}")
        dt = self._dtype(dtype)
        ids, single = self._token_ids(token_ids)
        if attention_mask is not None:
            m = np.asarray(attention_mask)
            if m.shape != np.shape(token_ids):
                raise ValueError(f"attention_mask must have token_ids' shape {np.shape(token_ids)}, got {m.shape}")
            if m.dtype.kind not in "biuf" or not np.all(m == 1):
                raise ValueError("attention_mask: generate does not support padding; pass equally long prompts "
                                 "without a mask")
        n = ids.shape[1]
        limit, field = a.max_positions, ("n_positions" if "n_positions" in a.config else "max_position_embeddings")
        if limit is None:
            limit = a.config.get("max_position_embeddings")
            limit = limit if isinstance(limit, int) and not isinstance(limit, bool) else None
        if limit is not None and n + n_new > limit:
            raise ValueError(f"n_new: {n} prompt tokens + {n_new} new ones exceed the model's context of {limit} "
                             f"positions (config.json {field})")
        rng = generator(seed) if temperature > 0 else None
        out = _generate(self.decoder, ids.astype(np.int64), n_new, dt, float(temperature), rng)
        return out[0] if single else out

    def to_str_tokens(self, text_or_ids) -> list:
        """The token strings of a text or of token ids, for axes and tables.

        A text is tokenized with :meth:`tokenize`; ids (and the text's ids) are decoded one id
        at a time with the checkpoint's tokenizer: tokenizer.json through the ``tokenizers``
        package (so a byte-level BPE token reads " the", as TransformerLens' to_str_tokens
        gives), vocab.txt for BERT, the config's characters for attngeom's character models.

        Parameters
        ----------
        text_or_ids : str or array_like of int, shape (n,) or (batch, n)
            A text, or token ids in the model's vocabulary.

        Returns
        -------
        list of str
            One string per token (a list of such lists for 2-D ids).

        Raises
        ------
        ValueError
            For ids outside the vocabulary (the model's or the tokenizer's), non-integer ids,
            and a folder without tokenizer files.

        Examples
        --------
        >>> model.to_str_tokens("the cat sat")  # doctest: +SKIP
        ['the', ' cat', ' sat']
        >>> model.to_str_tokens([1, 2])  # doctest: +SKIP
        ['the', 'cat']
        """
        if isinstance(text_or_ids, str):
            ids = np.asarray(self.tokenize(text_or_ids)[0], dtype=np.int64)
        else:
            ids = np.asarray(text_or_ids)
            if ids.ndim not in (1, 2) or ids.dtype.kind not in "iu":
                raise ValueError(f"text_or_ids must be a str or a (n,) or (batch, n) integer array, got shape "
                                 f"{ids.shape}, dtype {ids.dtype}")
            V = self.arch.vocab_size
            check_token_ids("text_or_ids", ids, V, f" (config.json vocab_size {V})")
        decode = self._decoder_of_ids()
        if ids.ndim == 2:
            return [[decode(int(i)) for i in row] for row in ids]
        return [decode(int(i)) for i in ids]

    def _decoder_of_ids(self):
        """A function id -> its token string, from the checkpoint's tokenizer files."""
        a = self.arch
        if a.tokenizer == "characters":
            vocab = a.config["vocab"]
            return lambda i: vocab[i]
        folder = self.folder or ""
        tj, vt = os.path.join(folder, "tokenizer.json"), os.path.join(folder, "vocab.txt")
        if os.path.isfile(tj) and (_have_tokenizers() or not (a.tokenizer == "wordpiece" and os.path.isfile(vt))):
            if not _have_tokenizers():
                raise ImportError("to_str_tokens: reading tokenizer.json needs the tokenizers package: "
                                  "pip install tokenizers")
            from tokenizers import Tokenizer

            tok = Tokenizer.from_file(tj)
            size = tok.get_vocab_size(with_added_tokens=True)

            def decode(i):
                if tok.id_to_token(i) is None:
                    raise ValueError(f"text_or_ids: id {i} is not in the tokenizer's vocabulary ({size} tokens)")
                return tok.decode([i], skip_special_tokens=False)
            return decode
        if a.tokenizer == "wordpiece" and os.path.isfile(vt):
            with open(vt, encoding="utf-8") as f:
                vocab = [line.rstrip("\n").rstrip("\r") for line in f]

            def decode(i):
                if i >= len(vocab):
                    raise ValueError(f"text_or_ids: id {i} is not in vocab.txt ({len(vocab)} tokens)")
                return vocab[i]
            return decode
        raise ValueError(f"text_or_ids: folder {folder!r} has no tokenizer files (tokenizer.json"
                         f"{' or vocab.txt' if a.tokenizer == 'wordpiece' else ''}) to decode token ids with")

    @staticmethod
    def _dtype(dtype):
        """The checked computation dtype: float32, float64 or "bfloat16" (a string)."""
        act, bf16 = compute_dtype(dtype)
        return BFLOAT16 if bf16 else act

    def _token_ids(self, token_ids):
        """Checked token ids as (batch, n) and whether one sequence was given."""
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
        return ids, single

    # -- what analyses read -------------------------------------------------------------
    @property
    def has_unembedding(self) -> bool:
        """Whether the checkpoint has an lm_head (or ties it to the embedding): False for BERT."""
        return self.decoder.has_unembedding

    @property
    def unembedding(self) -> np.ndarray:
        """W_U, shape (vocab, d_model), as stored (memory-mapped; cast it yourself): the logits
        are ``final_norm(h) @ W_U.T``. ValueError for a model without one (BERT)."""
        if not self.has_unembedding:
            raise ValueError(f"model: a {self.arch.model_type} checkpoint has no unembedding (no logits)")
        return self.decoder.w["unembed"]

    def final_norm(self, h: np.ndarray) -> np.ndarray:
        """The final norm N_f of residual streams h (..., d_model), in h's dtype: the logits are
        ``final_norm(h_L) @ unembedding.T``; on earlier layers it is the logit lens."""
        return self.decoder.final_norm(h)

    @property
    def final_norm_parameters(self) -> dict:
        """The final norm as numbers: {"kind" ("layernorm" or "rmsnorm"), "weight" (d_model,),
        "bias" (d_model,) or None, "eps"}, float64. With its scale s of a stream x frozen,
        ``final_norm(x) = (x - [mean x]) / s * weight + bias`` is linear in x (the mean is
        subtracted by LayerNorm only): what direct logit attribution uses."""
        a, w = self.arch, self.decoder.w
        if a.post_norm:
            raise ValueError(f"model: a {a.model_type} model has no final norm (post-norm: its last layer's "
                             f"LayerNorm ends it)")
        bias = w.get("norm_b")
        return {"kind": a.norm, "weight": np.asarray(w["norm_w"], np.float64),
                "bias": None if bias is None else np.asarray(bias, np.float64), "eps": float(a.norm_eps)}

    def layer_weights(self, layer: int) -> dict:
        """The stored tensors of one layer ({name: array}, (in, out) orientation, y = x W), as
        :func:`attngeom.models.io.weights.read_weights` names them (read-only views)."""
        if isinstance(layer, (bool, np.bool_)) or not isinstance(layer, (int, np.integer)) \
                or not 0 <= layer < self.arch.n_layers:
            raise ValueError(f"layer must be an integer in 0..{self.arch.n_layers - 1}, got {layer!r}")
        return dict(self.decoder.w["layers"][int(layer)])

    def run_from(self, layer: int, residual, token_ids, *, interventions=None, keep=("logits",),
                 layers=None, logits_at=None, dtype=np.float32) -> Forward:
        """The rest of a forward pass, started at `layer` from the residual stream entering it.

        A clean pass computed up to ``layer`` once can be continued many times with different
        interventions (ablation and patching sweeps): ``run_from(l, f["resid_pre", l], ids)``
        equals ``forward(ids)`` from layer l on, bitwise.

        Parameters
        ----------
        layer : int
            The first layer to run, 0 <= layer < n_layers.
        residual : array_like, shape ([batch,] n, d_model)
            The residual stream entering `layer` (``resid_pre`` of that layer).
        token_ids : array_like of int, shape ([batch,] n)
            The pass's token ids (positions and the vocabulary check); every token real.
        interventions, keep, logits_at, dtype
            As :meth:`forward`; interventions at layers before `layer` are refused.
        layers : int or sequence of int, optional
            The layers whose per-layer sites are kept, all >= `layer` (default: `layer` on).

        Returns
        -------
        Forward
            Per-layer sites of the layers run (``layers`` starts at `layer`).

        Raises
        ------
        ValueError
            For a layer out of range, a residual whose shape is not token_ids' plus d_model or
            that is not finite, kept layers or interventions before `layer`, and what
            :meth:`forward` refuses.

        Examples
        --------
        >>> clean = model.forward(ids, keep=("resid_pre", "logits"))  # doctest: +SKIP
        >>> f = model.run_from(2, clean["resid_pre", 2], ids, interventions=[Ablate("z", 2, heads=[1])])  # doctest: +SKIP
        """
        n_layers = self.arch.n_layers
        if isinstance(layer, (bool, np.bool_)) or not isinstance(layer, (int, np.integer)) or not 0 <= layer < n_layers:
            raise ValueError(f"layer must be an integer in 0..{n_layers - 1}, got {layer!r}")
        layer = int(layer)
        ids, single = self._token_ids(token_ids)
        h = np.asarray(residual)
        want = (ids.shape[1], self.arch.d_model) if single else ids.shape + (self.arch.d_model,)
        if h.shape != want:
            raise ValueError(f"residual must have shape {want} (token_ids' shape plus d_model), got {h.shape}")
        if h.dtype.kind != "f":
            raise ValueError(f"residual must be a float array, got dtype {h.dtype}")
        if not np.all(np.isfinite(h)):
            raise NonFiniteOperand("residual holds NaN or infinity")
        chosen = tuple(range(layer, n_layers)) if layers is None else layers
        dt = self._dtype(dtype)
        mask = np.ones(ids.shape, dtype=bool)
        positions = np.broadcast_to(np.arange(ids.shape[1]), ids.shape)
        plan = plan_forward(self.arch, mask, compute_dtype(dt)[0], keep=keep_names(keep, "Model.run_from()"), layers=chosen,
                            logits_at=logits_at, interventions=interventions, single=single)
        if plan.layers[0] < layer:
            raise ValueError(f"layers: {plan.layers[0]} is before the first layer run ({layer})")
        early = [i for i in plan.interventions if i < layer]
        if early:
            raise ValueError(f"interventions: one acts at layer {early[0]}, before the first layer run ({layer})")
        out = self.decoder.forward(ids.astype(np.int64), mask, positions, dt, plan,
                                   resume=(layer, h.reshape(ids.shape + (-1,))))
        return out.sequence(0) if single else out

def _have_tokenizers() -> bool:
    try:
        import tokenizers  # noqa: F401
    except ImportError:
        return False
    return True


def load_model(path, *, backend: str = "auto", keep_weights: bool = False) -> Model:
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
    keep_weights : bool, default False
        Keep the layers' weights across forward passes (:attr:`Model.keep_weights`).

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
    >>> model.forward(np.array([101, 7592, 102])).resid_pre.shape  # doctest: +SKIP
    (6, 3, 384)
    """
    ck = Checkpoint(path, backend=backend)
    model = model_from_checkpoint(ck, where=os.path.join(ck.folder, "config.json"))
    model.keep_weights = keep_weights
    return model


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
