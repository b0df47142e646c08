"""What the analyses run a model on: the model argument and a prompt.

Every analysis of :mod:`attngeom.models.analysis` takes its model one way: a ``model``
argument that is a :class:`Model` or anything :func:`load_model` reads (a checkpoint folder
or file, a packaged or cached model name), turned into a :class:`Model` by
:func:`resolve_model`, the one resolver. The analyses that read weights only
(:func:`attngeom.weight_spectra`, :func:`attngeom.models.head_report`) also take the
per-head weights (:class:`ModelHeads`) and use :func:`resolve_heads`, which gives a Model's
heads and reads a checkpoint's heads without the rest of its weights. Where they run the
model they take a ``prompt``: a text (tokenized with the checkpoint's tokenizer files) or
token ids, which :func:`encode_prompt` turns into (token ids, token strings). The errors
name the argument.
"""
from __future__ import annotations

import os
from typing import List, Optional, Tuple

import numpy as np

from ..._operands import check_token_ids, count
from ..nn.heads import ModelHeads, load_heads
from ..nn.model import Model, load_model


def resolve_model(model) -> Model:
    """The :class:`Model` a ``model`` argument stands for.

    Parameters
    ----------
    model : Model or str or path-like
        A loaded model, or a checkpoint folder / file / model name for :func:`load_model`.

    Returns
    -------
    Model
        The model (loaded when a path was given).

    Raises
    ------
    TypeError
        For anything else.
    ValueError
        When the checkpoint cannot be loaded (the message starts with ``model:``).

    Examples
    --------
    >>> from attngeom.models.analysis.prompt import resolve_model
    >>> resolve_model(3)
    Traceback (most recent call last):
    ...
    TypeError: model must be an attngeom.models.Model or a checkpoint path, got int
    """
    if isinstance(model, Model):
        return model
    _check_path(model, "an attngeom.models.Model")
    try:
        return load_model(model)
    except (ValueError, OSError) as exc:
        raise ValueError(f"model: cannot load {os.fspath(model)!r}: {exc}") from exc


def resolve_heads(model, *, n_heads: Optional[int] = None) -> ModelHeads:
    """The per-head weights a ``model`` argument of a weights-only analysis stands for.

    Parameters
    ----------
    model : ModelHeads or Model or str or path-like
        Heads, a loaded model (its :attr:`Model.heads`), or a checkpoint folder / file / model
        name, whose heads :func:`load_heads` reads (without the rest of its weights).
    n_heads : int, optional
        For a checkpoint without config.json (as :func:`load_heads`).

    Returns
    -------
    ModelHeads
        The heads.

    Raises
    ------
    TypeError
        For anything else.
    ValueError
        What :func:`load_heads` refuses (the message names the checkpoint).

    Examples
    --------
    >>> from attngeom.models.analysis.prompt import resolve_heads
    >>> resolve_heads(3)
    Traceback (most recent call last):
    ...
    TypeError: model must be an attngeom.models.ModelHeads, a Model or a checkpoint path, got int
    """
    if isinstance(model, ModelHeads):
        return model
    if isinstance(model, Model):
        return model.heads
    _check_path(model, "an attngeom.models.ModelHeads, a Model")
    return load_heads(model, n_heads=n_heads)


def _check_path(model, objects: str) -> None:
    if not isinstance(model, (str, os.PathLike)):
        raise TypeError(f"model must be {objects} or a checkpoint path, got {type(model).__name__}")


def token_strings(model, ids) -> Optional[List[str]]:
    """The token strings of token ids, from the checkpoint's tokenizer.json (or vocab.txt).

    Parameters
    ----------
    model : Model or str or path-like
        The model whose tokenizer files decode the ids (:func:`resolve_model`).
    ids : array_like of int
        Token ids (any shape; flattened).

    Returns
    -------
    list of str or None
        One string per id, or None when the checkpoint has no tokenizer files (or the
        ``tokenizers`` package is missing for tokenizer.json).

    Examples
    --------
    >>> from attngeom.models import packaged_model_path, token_strings
    >>> token_strings(packaged_model_path(), [101, 4937])  # needs the models extra
    ['[CLS]', 'cat']
    """
    flat = [int(i) for i in np.asarray(ids).ravel()]
    folder = resolve_model(model).folder
    tj, vocab = os.path.join(folder, "tokenizer.json"), os.path.join(folder, "vocab.txt")
    if os.path.isfile(tj):
        try:
            from tokenizers import Tokenizer
        except ImportError:
            Tokenizer = None
        if Tokenizer is not None:
            tok = Tokenizer.from_file(tj)
            return [tok.id_to_token(i) if tok.id_to_token(i) is not None else f"<{i}>" for i in flat]
    if os.path.isfile(vocab):
        with open(vocab, encoding="utf-8") as f:
            table = [line.rstrip("\n").rstrip("\r") for line in f]
        return [table[i] if 0 <= i < len(table) else f"<{i}>" for i in flat]
    return None


def encode_prompt(model, prompt, *, max_length: Optional[int] = None) -> Tuple[np.ndarray, Optional[List[str]]]:
    """Token ids and token strings of a prompt given as text or as token ids.

    Parameters
    ----------
    model : Model or str or path-like
        The model (its tokenizer files tokenize text and decode ids; :func:`resolve_model`).
    prompt : str or array_like of int, shape (n,)
        A text, or token ids in 0..vocab_size-1.
    max_length : int, optional
        Keep at most this many tokens.

    Returns
    -------
    ids : ndarray of int64, shape (n,)
        The token ids.
    tokens : list of str or None
        Their strings (None without tokenizer files).

    Raises
    ------
    ValueError
        For empty or non-integer token ids, ids outside the vocabulary, and text for a
        checkpoint without tokenizer files (messages name ``prompt``); a max_length that is
        not a positive integer.

    Examples
    --------
    >>> from attngeom.models import packaged_model_path
    >>> from attngeom.models.analysis.prompt import encode_prompt
    >>> encode_prompt(packaged_model_path(), "The cat")  # needs the models extra
    (array([ 101, 1996, 4937,  102]), ['[CLS]', 'the', 'cat', '[SEP]'])
    """
    model = resolve_model(model)
    count("max_length", max_length, 1, allow_none=True)
    if isinstance(prompt, str):
        if not prompt.strip():
            raise ValueError("prompt must be a non-empty text or token ids, got an empty text")
        try:
            ids, tokens = model.tokenize(prompt, max_length=max_length)
        except (ValueError, ImportError) as exc:
            raise ValueError(f"prompt: cannot tokenize the text: {exc}") from exc
        return np.asarray(ids, dtype=np.int64), list(tokens)
    if isinstance(prompt, (bytes, dict)) or prompt is None:
        raise TypeError(f"prompt must be a text or token ids, got {type(prompt).__name__}")
    try:
        ids = np.asarray(prompt)
    except (ValueError, TypeError) as exc:
        raise TypeError(f"prompt must be a text or token ids: {exc}") from exc
    if ids.ndim != 1 or ids.size == 0 or ids.dtype.kind not in "iu":
        raise ValueError(f"prompt must be a text or a non-empty (n,) integer array of token ids, got shape "
                         f"{ids.shape}, dtype {ids.dtype}")
    check_token_ids("prompt: token ids", ids, model.arch.vocab_size)
    if max_length is not None:
        ids = ids[:max_length]
    ids = ids.astype(np.int64)
    return ids, token_strings(model, ids)


def prompt_pair(model, clean_ids, corrupt_ids) -> Tuple[np.ndarray, np.ndarray]:
    """A clean and a corrupted prompt as (batch, n) token ids of one shape, in the vocabulary.

    Parameters
    ----------
    model : Model
        The model (its vocabulary).
    clean_ids, corrupt_ids : array_like of int, shape (n,) or (batch, n)
        The two prompts.

    Returns
    -------
    clean_ids, corrupt_ids : ndarray of int64, shape (batch, n)

    Raises
    ------
    ValueError
        For prompts of different shapes, not 1-D or 2-D integer arrays, or outside the
        vocabulary (naming the argument).

    Examples
    --------
    >>> from attngeom.models.analysis.prompt import prompt_pair
    >>> prompt_pair(model, [1, 2, 3], [[1, 5, 3]])[1].shape  # doctest: +SKIP
    (1, 3)
    """
    out = []
    for name, ids in (("clean_ids", clean_ids), ("corrupt_ids", corrupt_ids)):
        ids = np.asarray(ids)
        if ids.ndim not in (1, 2) or ids.size == 0 or ids.dtype.kind not in "iu":
            raise ValueError(f"{name} must be a non-empty (n,) or (batch, n) integer array, got shape {ids.shape}, "
                             f"dtype {ids.dtype}")
        check_token_ids(name, ids, model.arch.vocab_size)
        out.append((ids[None] if ids.ndim == 1 else ids).astype(np.int64))
    if out[0].shape != out[1].shape:
        raise ValueError(f"clean_ids and corrupt_ids must have one shape, got {out[0].shape} and {out[1].shape}")
    return out[0], out[1]
