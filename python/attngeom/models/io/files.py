"""Where a checkpoint's files are: sharded folders and the Hugging Face cache.

* A folder with ``model.safetensors.index.json`` is read as its index says: exactly the
  shards its ``weight_map`` lists (a stray ``*.safetensors`` next to them is not mixed in;
  a listed shard that is missing is a ValueError naming it). Without an index every
  ``*.safetensors`` of the folder is one part of the checkpoint.
* A model name ``org/name`` (optionally ``org/name@revision``) is looked up offline in the
  Hugging Face hub cache, ``models--org--name/snapshots/<commit>/`` under ``HF_HUB_CACHE``,
  else ``HF_HOME/hub``, else ``~/.cache/huggingface/hub`` (the snapshot ``refs/main`` names,
  else the newest). Nothing is downloaded: when the model is not cached the error says
  where it looked and how to fetch the files.
"""
from __future__ import annotations

import glob
import json
import os
import re
from typing import List, Optional

INDEX = "model.safetensors.index.json"


def weight_files(folder) -> List[str]:
    """The safetensors files that make up the checkpoint in ``folder``.

    Parameters
    ----------
    folder : str or path-like
        A checkpoint folder.

    Returns
    -------
    list of str
        The shards listed by model.safetensors.index.json (in their numbered order), or
        every ``*.safetensors`` of the folder when there is no index.

    Raises
    ------
    ValueError
        For an index that is not JSON or has no ``weight_map``, a listed shard that is
        missing (named), and a folder without safetensors files.

    Examples
    --------
    >>> import os
    >>> from attngeom.models import write_safetensors
    >>> from attngeom.models.io.files import weight_files
    >>> os.makedirs("ckpt", exist_ok=True)
    >>> _ = write_safetensors("ckpt/model.safetensors", {"w": np.ones(2, np.float32)})
    >>> [os.path.basename(f) for f in weight_files("ckpt")]
    ['model.safetensors']
    """
    folder = os.fspath(folder)
    index = os.path.join(folder, INDEX)
    if os.path.isfile(index):
        weight_map = read_index(index)
        files = sorted(set(weight_map.values()))
        missing = [f for f in files if not os.path.isfile(os.path.join(folder, f))]
        if missing:
            raise ValueError(f"{index!r} lists shards that are missing: {', '.join(missing)}; download the "
                             f"complete checkpoint")
        return [os.path.join(folder, f) for f in files]
    files = sorted(glob.glob(os.path.join(folder, "*.safetensors")))
    if not files:
        raise ValueError(f"path {folder!r} is a folder without *.safetensors files")
    return files


def read_index(path) -> dict:
    """The ``weight_map`` {tensor name: shard file} of a model.safetensors.index.json.

    Parameters
    ----------
    path : str or path-like
        The index file.

    Returns
    -------
    dict of str to str
        Tensor name -> shard file name (relative to the index's folder).

    Examples
    --------
    >>> import json
    >>> from attngeom.models.io.files import read_index
    >>> _ = open("index.json", "w").write(json.dumps({"weight_map": {"w": "a.safetensors"}}))
    >>> read_index("index.json")
    {'w': 'a.safetensors'}
    """
    path = os.fspath(path)
    try:
        with open(path) as f:
            data = json.load(f)
    except json.JSONDecodeError as exc:
        raise ValueError(f"{path!r} is not valid JSON: {exc}") from None
    weight_map = data.get("weight_map") if isinstance(data, dict) else None
    if not isinstance(weight_map, dict) or not all(isinstance(k, str) and isinstance(v, str) and v
                                                   and os.path.basename(v) == v for k, v in weight_map.items()):
        raise ValueError(f"{path!r} needs a 'weight_map' of tensor names to shard file names in its folder")
    return weight_map


def hub_cache_dirs() -> List[str]:
    """The folders searched for Hugging Face cached models, in order.

    Returns
    -------
    list of str
        ``HF_HUB_CACHE`` if set, else ``HF_HOME/hub`` (``HF_HOME`` defaulting to
        ``XDG_CACHE_HOME/huggingface`` or ``~/.cache/huggingface``).

    Examples
    --------
    >>> from attngeom.models.io.files import hub_cache_dirs
    >>> len(hub_cache_dirs()) >= 1
    True
    """
    if os.environ.get("HF_HUB_CACHE"):
        return [os.environ["HF_HUB_CACHE"]]
    home = os.environ.get("HF_HOME") or os.path.join(
        os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache"), "huggingface")
    return [os.path.join(home, "hub")]


_NAME = re.compile(r"^[A-Za-z0-9][\w.\-]*/[\w.\-]+(@[\w.\-/]+)?$")


def looks_like_model_name(spec: str) -> bool:
    """Whether ``spec`` has the form of a hub model name, ``org/name`` or ``org/name@revision``.

    Parameters
    ----------
    spec : str
        A checkpoint argument.

    Returns
    -------
    bool
        True for "Qwen/Qwen3-0.6B"-like strings.

    Examples
    --------
    >>> from attngeom.models.io.files import looks_like_model_name
    >>> looks_like_model_name("Qwen/Qwen3-0.6B"), looks_like_model_name("model.safetensors")
    (True, False)
    """
    return bool(_NAME.match(str(spec)))


def hub_snapshot(name: str) -> Optional[str]:
    """The folder of a locally cached Hugging Face model, or None when it is not cached.

    Parameters
    ----------
    name : str
        "org/name" or "org/name@revision" (a branch or tag under refs/, or a commit).

    Returns
    -------
    str or None
        ``<cache>/models--org--name/snapshots/<commit>``.

    Examples
    --------
    >>> from attngeom.models.io.files import hub_snapshot
    >>> hub_snapshot("nobody/no-such-model") is None
    True
    """
    repo, _, revision = str(name).partition("@")
    for cache in hub_cache_dirs():
        root = os.path.join(cache, "models--" + repo.replace("/", "--"))
        snaps = os.path.join(root, "snapshots")
        if not os.path.isdir(snaps):
            continue
        ref = revision or "main"
        ref_file = os.path.join(root, "refs", ref)
        commit = open(ref_file).read().strip() if os.path.isfile(ref_file) else ref
        if os.path.isdir(os.path.join(snaps, commit)):
            return os.path.join(snaps, commit)
        if revision:
            continue
        found = [os.path.join(snaps, s) for s in os.listdir(snaps) if os.path.isdir(os.path.join(snaps, s))]
        if found:
            return max(found, key=os.path.getmtime)
    return None


def hub_not_found_message(name: str) -> str:
    """The error text for a model name that is not cached: where it looked, how to get it.

    Parameters
    ----------
    name : str
        The model name.

    Returns
    -------
    str
        The message.

    Examples
    --------
    >>> from attngeom.models.io.files import hub_not_found_message
    >>> "hf download" in hub_not_found_message("org/name")
    True
    """
    repo, _, revision = str(name).partition("@")
    where = ", ".join(os.path.join(c, "models--" + repo.replace("/", "--")) for c in hub_cache_dirs())
    rev = f" --revision {revision}" if revision else ""
    return (f"model {name!r} is not a local path and is not in the Hugging Face cache (looked in {where}); "
            f"nothing is downloaded here: fetch it with `hf download {repo}{rev}` (or `huggingface-cli download "
            f"{repo}{rev}`, pip install huggingface_hub), or pass the folder holding its config.json and "
            f"*.safetensors")
