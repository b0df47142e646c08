"""Token activations for the data diagnostics: saved .npy files, or a text run through BERT.

Activations are the input of each layer's attention, stacked over layers:
(n_layers, n_seq, n, d_model). For post-LN BERT that is the previous layer's output; for
pre-LN models (GPT-2, Llama) it is the output of the layer norm before attention.
"""
from __future__ import annotations

import os
import re
from typing import List, Optional, Tuple

import numpy as np

from .bert import BertEncoder
from .heads import Checkpoint
from .layouts import detect_layout
from .tokenizer import tokenize


def load_activations(folder, n_layers: int, d_model: int) -> np.ndarray:
    """Read activations saved as .npy: returns (n_layers, n_seq, n, d_model) float64.

    folder : either one file ``activations.npy`` of shape (n_layers, n, d_model) or
    (n_layers, n_seq, n, d_model), or one file per layer ``layer_<i>.npy`` (i = 0 ..
    n_layers - 1) of shape (n, d_model) or (n_seq, n, d_model). ValueError for missing
    layers, wrong shapes or non-finite values.

    Example: ``x = load_activations("acts", heads.n_layers, heads.d_model)``
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
    if not np.all(np.isfinite(x)):
        raise ValueError("activations contain NaN or infinite values")
    return x


def _sentence_max_length(folder) -> Optional[int]:
    """max_seq_length of a sentence-transformers model (sentence_bert_config.json), if any."""
    import json

    path = os.path.join(folder, "sentence_bert_config.json")
    if os.path.isfile(path):
        with open(path) as f:
            value = json.load(f).get("max_seq_length")
        return int(value) if value else None
    return None


def text_activations(checkpoint, text: str, *, max_length: Optional[int] = None,
                     encoder: Optional[BertEncoder] = None, n_heads: Optional[int] = None) -> Tuple[np.ndarray, List[str]]:
    """Run ``text`` through the library's NumPy BERT forward pass.

    checkpoint : a BERT-layout checkpoint (file, folder or packaged-model name) whose folder
    holds tokenizer.json or vocab.txt. Returns (x, tokens): x (n_layers, 1, n, d_model) the
    input of every layer's attention, tokens the n token strings. The text is truncated to
    max_length, by default the model's own limit (sentence_bert_config.json's
    max_seq_length when present, as sentence-transformers does, else the number of
    positions). n_heads : needed without config.json. ValueError for other layouts (save
    activations as .npy and use :func:`load_activations`).

    Example: ``x, tokens = text_activations("all-MiniLM-L6-v2", "The cat sat on the mat.")``
    """
    ck = Checkpoint(checkpoint)
    layout, _, _ = detect_layout(ck.names)
    if layout.name != "bert":
        raise ValueError(f"the NumPy forward pass covers the bert layout, this checkpoint is {layout.name}; "
                         f"save activations as .npy (one layer_<i>.npy per layer) and pass them instead")
    enc = encoder if encoder is not None else BertEncoder.from_checkpoint(checkpoint, n_heads=n_heads)
    if max_length is not None and int(max_length) < 2:
        raise ValueError(f"max_length must be >= 2 ([CLS] and [SEP]), got {max_length}")
    default = _sentence_max_length(ck.folder) or enc.max_length
    limit = min(default if max_length is None else int(max_length), enc.max_length)
    ids, tokens = tokenize(ck.folder, text, max_length=limit)
    out = enc.forward(np.asarray(ids, dtype=np.int64))
    return out.hidden_states[:-1, None], tokens
