"""Token activations for the data diagnostics: saved .npy files, or a text run through the model.

Activations are the input of each layer's attention, stacked over layers:
(n_layers, n_seq, n, d_model). For post-LN BERT that is the previous layer's output; for
pre-LN models (GPT-2, Llama) it is the output of the layer norm before attention.
"""
from __future__ import annotations

import os
import re
import warnings
from typing import List, Optional, Tuple

import numpy as np

from ..._operands import check_finite, choice
from ...errors import ContextWarning
from ..io.checkpoint import Checkpoint
from ..io.jsonfile import read_json_object
from ..io.layouts import detect_layout
from ..io.tokenizer import tokenize
from ..nn.bert import BertEncoder
from ..nn.model import Model
from ..nn.products import compute_dtype
from .prompt import resolve_model


def load_activations(folder, n_layers: int, d_model: int) -> np.ndarray:
    """Read activations saved as .npy, for the data diagnostics of Laplace-Radon s.12.1.

    ValueError for missing layers and wrong shapes; :class:`attngeom.errors.NonFiniteOperand`
    (a ValueError) for NaN or infinite values.

    Parameters
    ----------
    folder : str or path-like
        Either one file ``activations.npy`` of shape (n_layers, n, d_model) or
        (n_layers, n_seq, n, d_model), or one file per layer ``layer_<i>.npy``
        (i = 0 .. n_layers - 1) of shape (n, d_model) or (n_seq, n, d_model).
    n_layers : int
        Number of layers expected.
    d_model : int
        Width expected.

    Returns
    -------
    ndarray, shape (n_layers, n_seq, n, d_model)
        float64 activations.

    Examples
    --------
    >>> import os
    >>> from attngeom.models import load_activations
    >>> os.makedirs("acts", exist_ok=True)
    >>> for i in range(2):
    ...     np.save(f"acts/layer_{i}.npy", np.ones((5, 4)))
    >>> load_activations("acts", n_layers=2, d_model=4).shape
    (2, 1, 5, 4)
    """
    folder = os.fspath(folder)
    if not os.path.isdir(folder):
        raise ValueError(f"activations must be a folder of .npy files, got {folder!r}")
    single = os.path.join(folder, "activations.npy")
    if os.path.isfile(single):
        x = np.load(single, allow_pickle=False)
        if x.ndim == 3:
            x = x[:, None]
        if x.ndim != 4:
            raise ValueError(f"{single!r} must have shape ({n_layers}, [n_seq,] n, {d_model}), got {x.shape}")
    else:
        files = {int(m.group(1)): f for f in os.listdir(folder) if (m := re.fullmatch(r"layer_(\d+)\.npy", f))}
        missing = [i for i in range(n_layers) if i not in files]
        if missing:
            raise ValueError(f"activations folder {folder!r} needs activations.npy or layer_0.npy .. "
                             f"layer_{n_layers - 1}.npy; missing layers {missing}")
        layers = []
        for i in range(n_layers):
            a = np.load(os.path.join(folder, files[i]), allow_pickle=False)
            layers.append(a[None] if a.ndim == 2 else a)
        shapes = {a.shape for a in layers}
        if len(shapes) != 1 or layers[0].ndim != 3:
            raise ValueError(f"layer_<i>.npy must all have one shape ([n_seq,] n, {d_model}), got {sorted(shapes)}")
        x = np.stack(layers)
    if x.shape[0] != n_layers or x.shape[-1] != d_model or x.shape[-2] == 0:
        raise ValueError(f"activations must have shape ({n_layers}, n_seq, n, {d_model}), got {x.shape}")
    if x.dtype.kind not in "fiu":
        raise ValueError(f"activations must be real numbers, got dtype {x.dtype}")
    x = x.astype(np.float64)
    check_finite("activations", x)
    return x


def _sentence_max_length(folder) -> Optional[int]:
    """max_seq_length of a sentence-transformers model (sentence_bert_config.json), if any."""
    path = os.path.join(folder, "sentence_bert_config.json")
    if not os.path.exists(path):
        return None
    value = read_json_object(path).get("max_seq_length")
    if value is None:
        return None
    if type(value) is not int or value < 2:
        raise ValueError(f"{path!r}: field 'max_seq_length' must be an integer >= 2, got {value!r}")
    return value


def text_activations(checkpoint, text: str, *, max_length: Optional[int] = None,
                     encoder: Optional[BertEncoder] = None, n_heads: Optional[int] = None,
                     model=None, dtype=np.float64) -> Tuple[np.ndarray, List[str]]:
    """Run ``text`` through the library's NumPy forward pass (BERT or a decoder).

    The inputs of every layer's attention, for the data diagnostics of Laplace-Radon s.12.1.
    BERT runs :class:`BertEncoder`, with the text truncated to max_length, by default the
    model's own limit (sentence_bert_config.json's max_seq_length when present, as
    sentence-transformers does, else the number of positions). Decoders (GPT-2, Llama,
    Mistral, Qwen2, Qwen3) run :meth:`Model.forward` (float64 unless ``dtype`` says
    otherwise) on the tokenizer.json tokens
    (truncated to max_length, else to GPT-2's position table); the activations are the
    normed residual stream each attention reads, at positions 0..n-1, which is what
    :meth:`ModelHeads.diagnostics` rotates its queries and keys with.

    Parameters
    ----------
    checkpoint : Model or str or path-like
        A checkpoint (file, folder, packaged-model or cached hub name) whose folder holds
        tokenizer.json (or vocab.txt for BERT), or a loaded :class:`Model` of one (then also
        the decoder that runs, as ``model``).
    text : str
        The input text.
    max_length : int, optional
        Truncation length in tokens. A text longer than the model's own limit (BERT's
        max_seq_length or position table, GPT-2's position table) is truncated to it with a
        :class:`attngeom.errors.ContextWarning` naming that length and the tokens analysed;
        a text past a rotary model's trained context (config.json's
        max_position_embeddings) is analysed whole, with a ContextWarning.
    encoder : BertEncoder, optional
        A loaded encoder to reuse (BERT only).
    n_heads : int, optional
        Needed without config.json.
    model : Model or str or path-like, optional
        A loaded decoder (:func:`load_model` of the same checkpoint) to reuse, so that many
        texts do not read the weights again (decoders only; a path is loaded, as
        :func:`attngeom.models.analysis.prompt.resolve_model` does).
    dtype : {np.float64, np.float32, "bfloat16"}, default np.float64
        The decoder's forward dtype (:meth:`Model.forward`); the activations come back in
        float64, float32 and float32 (bfloat16 products, float32 residual stream). BERT's
        encoder runs in float64 only: another dtype is a ValueError.

    Returns
    -------
    x : ndarray, shape (n_layers, 1, n, d_model)
        The input of every layer's attention.
    tokens : list of str
        The n token strings.

    Examples
    --------
    >>> from attngeom.models import text_activations
    >>> x, tokens = text_activations("all-MiniLM-L6-v2", "The cat sat.")  # needs the models extra
    >>> x.shape, tokens
    ((6, 1, 6, 384), ['[CLS]', 'the', 'cat', 'sat', '.', '[SEP]'])
    """
    if isinstance(checkpoint, Model):
        if model is not None:
            raise ValueError("model: checkpoint is already a Model; give one or the other")
        model, checkpoint = checkpoint, checkpoint.folder or checkpoint.path
    ck = Checkpoint(checkpoint)
    layout, _, _ = detect_layout(ck.names)
    if layout.name == "bert" and compute_dtype(dtype) != (np.dtype(np.float64), False):
        raise ValueError(f"dtype {dtype!r}: BERT's encoder runs in float64 only (dtype applies to decoders)")
    if layout.name != "bert":
        if max_length is not None and int(max_length) < 1:
            raise ValueError(f"max_length must be >= 1, got {max_length}")
        model = resolve_model(model if model is not None else checkpoint)
        ids, tokens = model.tokenize(text)
        if not ids:
            raise ValueError("the text has no tokens")
        if max_length is not None and len(ids) > int(max_length):  # asked for: no warning
            ids, tokens = ids[:int(max_length)], tokens[:int(max_length)]
        elif model.max_length is not None and len(ids) > model.max_length:
            warnings.warn(f"the text has {len(ids)} tokens and the {model.arch.model_type} model's position table "
                          f"{model.max_length} positions: analysed its first {model.max_length} tokens",
                          ContextWarning, stacklevel=2)
            ids, tokens = ids[:model.max_length], tokens[:model.max_length]
        model.context_warning(len(ids), "the text has", stacklevel=2)
        with warnings.catch_warnings():  # said once, above, about the text
            warnings.simplefilter("ignore", ContextWarning)
            out = model.forward(np.asarray(ids, dtype=np.int64), dtype=dtype, keep=("attn_in",))
        return out.attn_in[:, None], tokens
    enc = encoder if encoder is not None else BertEncoder.from_checkpoint(checkpoint, n_heads=n_heads)
    if max_length is not None and int(max_length) < 2:
        raise ValueError(f"max_length must be >= 2 ([CLS] and [SEP]), got {max_length}")
    sentence = _sentence_max_length(ck.folder)
    default = sentence or enc.max_length
    limit = min(default if max_length is None else int(max_length), enc.max_length)
    ids, tokens = tokenize(ck.folder, text)
    if len(ids) > limit:
        if max_length is None or int(max_length) > enc.max_length:  # not the length asked for: say so
            why = (f"the model's max_seq_length, {sentence} (sentence_bert_config.json, where sentence-transformers "
                   f"truncates; its position table holds {enc.max_length}: max_length up to {enc.max_length} "
                   f"analyses more)" if limit == sentence and sentence < enc.max_length else
                   f"the {enc.max_length} positions of the model's position table")
            warnings.warn(f"the text has {len(ids)} tokens: analysed its first {limit} ([CLS] ... [SEP]), "
                          f"truncated to {why}", ContextWarning, stacklevel=2)
        ids, tokens = tokenize(ck.folder, text, max_length=limit)
    out = enc.forward(np.asarray(ids, dtype=np.int64))
    return out.hidden_states[:-1, None], tokens


def split_texts(text: str, *, by: str = "paragraph") -> List[str]:
    """Split a corpus into texts: one text per paragraph (paragraphs separated by blank lines),
    or one per line.

    The rule of ``attngeom heads --text FILE`` and ``attngeom corpus --corpus FILE`` (their
    ``--split`` option). ``by="paragraph"``: a line holding only whitespace ends a
    paragraph; the lines of a paragraph are joined with single spaces (wrapped prose stays
    one text); empty paragraphs are dropped; a file without blank lines is one text.
    ``by="line"``: every non-empty line, stripped, is a text (one document a line).

    Parameters
    ----------
    text : str
        The contents of a text file.
    by : {"paragraph", "line"}, default "paragraph"
        The unit of a text.

    Returns
    -------
    list of str
        The texts, in order.

    Examples
    --------
    >>> from attngeom.models import split_texts
    >>> split_texts("The cat sat.\\nIt purred.\\n\\n  \\nA dog ran.\\n")
    ['The cat sat. It purred.', 'A dog ran.']
    >>> split_texts("The cat sat.\\nIt purred.\\n\\n  \\nA dog ran.\\n", by="line")
    ['The cat sat.', 'It purred.', 'A dog ran.']
    """
    if not isinstance(text, str):
        raise TypeError(f"text must be a str, got {type(text).__name__}")
    choice("by", by, ("paragraph", "line"), "'paragraph' or 'line'")
    text = text.replace("\r\n", "\n")
    if by == "line":
        return [line.strip() for line in text.splitlines() if line.strip()]
    paragraphs = re.split(r"\n[ \t\r\f\v]*\n", text)
    return [" ".join(line.strip() for line in p.splitlines() if line.strip()) for p in paragraphs if p.strip()]
