"""One checkpoint: its safetensors files (a file, a folder of shards, or tensors in memory) and
its config.json, read lazily: :class:`Checkpoint`.

Where the files are (sharded folders, the Hugging Face cache) is :mod:`.files`; packaged
models are :mod:`.packaged`; the tensor-name maps of each family are :mod:`.layouts`.
"""
from __future__ import annotations

import os
from typing import Dict, Optional

import numpy as np

from .files import INDEX, read_index, weight_files
from .jsonfile import read_json_object
from .packaged import resolve_checkpoint
from .safetensors import SafetensorsFile

_CONFIG_KEYS = {
    "n_layers": ("num_hidden_layers", "n_layer"),
    "n_heads": ("num_attention_heads", "n_head"),
    "d_model": ("hidden_size", "n_embd", "d_model"),
    "n_kv_heads": ("num_key_value_heads",),
    "d_head": ("head_dim",),
}


_MAX_DIMENSION = 2 ** 31 - 1  # a sane bound for layer, head and width counts


class _InMemoryTensors:
    """Tensors held in memory ({name: ndarray or BFloat16Array}), read like a safetensors file."""

    def __init__(self, tensors: dict, path: str):
        self._tensors = tensors
        self.path = path

    def keys(self) -> list:
        return list(self._tensors)

    def __getitem__(self, name):
        return np.asarray(self._tensors[name])  # BF16 widened, other dtypes as they are

    def mapped(self, name):
        return self._tensors[name]


class Checkpoint:
    """The safetensors files of one checkpoint and its config.json, read lazily.

    path : a .safetensors file, or a folder of shards (every ``*.safetensors`` in it).
    backend : as in :class:`attngeom.models.SafetensorsFile`.

    ``get(name)`` returns a tensor or None; ``mapped(name)`` the same without reading it (a
    memory-mapped view; BF16 as a :class:`BFloat16Array`); ``names`` lists every tensor;
    ``config`` is the parsed config.json found next to the weights ({} when there is none;
    ValueError naming the file when it is not a JSON object, see
    :func:`attngeom.models.read_json_object`). :meth:`from_tensors` wraps tensors already in
    memory (a model's state dict) and their config.

    Example: ``ck = Checkpoint("model_dir"); ck.get("h.0.attn.c_attn.weight")``
    """

    def __init__(self, path, *, backend: str = "auto"):
        path = resolve_checkpoint(path)
        if os.path.isdir(path):
            files = weight_files(path)  # the index's shards when there is one
            folder = path
        else:
            files, folder = [path], os.path.dirname(os.path.abspath(path))
        self.path = path
        self.folder = folder
        self.files = [SafetensorsFile(f, backend=backend) for f in files]
        self._where: Dict[str, SafetensorsFile] = {}
        for f in self.files:
            for name in f.keys():
                if name in self._where:
                    raise ValueError(f"tensor {name!r} is in both {self._where[name].path!r} and {f.path!r}")
                self._where[name] = f
        index = os.path.join(folder, INDEX)
        if os.path.isdir(path) and os.path.isfile(index):
            for name, shard in read_index(index).items():
                if name not in self._where or os.path.basename(self._where[name].path) != shard:
                    raise ValueError(f"{index!r} puts tensor {name!r} in {shard!r}, which does not hold it")
        self.config_path = os.path.join(folder, "config.json")
        self.config = read_json_object(self.config_path) if os.path.exists(self.config_path) else {}

    @classmethod
    def from_tensors(cls, tensors: dict, config: dict, *, source: str) -> "Checkpoint":
        """A checkpoint whose tensors are already in memory.

        Parameters
        ----------
        tensors : dict of str to ndarray or BFloat16Array
            The state dict, under the checkpoint's tensor names (kept, not copied).
        config : dict
            What config.json would hold.
        source : str
            Names the model in messages (``path``); ``folder`` is "" (no tokenizer files).

        Returns
        -------
        Checkpoint
            Reading from ``tensors``.

        Examples
        --------
        >>> ck = Checkpoint.from_tensors({"w": np.eye(2)}, {}, source="<in memory>")  # doctest: +SKIP
        """
        ck = cls.__new__(cls)
        ck.path, ck.folder, ck.config_path = source, "", f"{source} config"
        ck.files = [_InMemoryTensors(tensors, source)]
        ck._where = {name: ck.files[0] for name in tensors}
        ck.config = dict(config)
        return ck

    @property
    def names(self) -> list:
        """Every tensor name of the checkpoint."""
        return list(self._where)

    def get(self, name: str) -> Optional[np.ndarray]:
        """The tensor of that name (BF16 widened to float32), or None when it is absent."""
        f = self._where.get(name)
        return None if f is None else f[name]

    def mapped(self, name: str):
        """The tensor of that name without reading it, or None when it is absent.

        A read-only memory-mapped view of a safetensors file (the array itself for tensors
        held in memory); BF16 as a :class:`attngeom.models.BFloat16Array`, widened when used.
        """
        f = self._where.get(name)
        return None if f is None else f.mapped(name)

    def get_weight(self, name: str) -> Optional[np.ndarray]:
        """Like :meth:`get`, for a weight the diagnostics use: ValueError naming the tensor and
        its file when it is empty or holds NaN or infinity (a trained model's weights are
        finite: one NaN weight makes every output of its layer NaN)."""
        a = self.get(name)
        if a is None:
            return None
        where = self._where[name].path
        if a.size == 0:
            raise ValueError(f"tensor {name!r} in {where!r} is empty (shape {a.shape})")
        finite = np.isfinite(a)
        if not finite.all():
            bad = a.size - int(np.count_nonzero(finite))
            raise ValueError(f"tensor {name!r} in {where!r} has {bad} non-finite values (NaN or infinity) "
                             f"of {a.size}")
        return a

    def file_of(self, name: str) -> Optional[str]:
        """The path of the safetensors file holding tensor ``name`` (None when it is absent)."""
        f = self._where.get(name)
        return None if f is None else f.path

    def config_value(self, key: str) -> Optional[int]:
        """A model dimension from config.json: n_layers, n_heads, d_model, n_kv_heads, d_head.

        None when config.json does not give it; ValueError naming the file and the field when
        the value is not an integer in 1..2**31-1 (a float such as 2.7 or 1e400, a boolean,
        zero or a negative number)."""
        for k in _CONFIG_KEYS[key]:
            value = self.config.get(k)
            if value is None:
                continue
            if type(value) is not int or not 1 <= value <= _MAX_DIMENSION:
                raise ValueError(f"{self.config_path!r}: field {k!r} must be an integer in 1..{_MAX_DIMENSION}, "
                                 f"got {value!r}")
            return value
        return None
