"""Reading and writing the safetensors format, with or without the ``safetensors`` package.

The format: an 8-byte little-endian unsigned header length N, a JSON header of N bytes
({name: {"dtype": "F32", "shape": [...], "data_offsets": [begin, end]}, "__metadata__":
{str: str}}), then the raw little-endian tensor data, offsets relative to its start.

The header is always parsed and checked here, so a file that is not safetensors, a
truncated file or an inconsistent header gives the same ValueError with either backend.
Tensor data is read through the ``safetensors`` package's NumPy API when it is installed
(``backend="auto"``), otherwise by this module's own reader; bfloat16 has no NumPy dtype,
so BF16 tensors are always read here and widened to float32 exactly (the 16 bits are the
upper half of the float32 bit pattern).
"""
from __future__ import annotations

import json
import os
import struct
from typing import Dict, Iterable, Optional

import numpy as np

# safetensors dtype codes -> NumPy dtypes of the stored data (little-endian).
_DTYPES = {
    "F64": np.dtype("<f8"), "F32": np.dtype("<f4"), "F16": np.dtype("<f2"), "BF16": np.dtype("<u2"),
    "I64": np.dtype("<i8"), "I32": np.dtype("<i4"), "I16": np.dtype("<i2"), "I8": np.dtype("i1"),
    "U64": np.dtype("<u8"), "U32": np.dtype("<u4"), "U16": np.dtype("<u2"), "U8": np.dtype("u1"),
    "BOOL": np.dtype("?"),
}
_CODES = {np.dtype(np.float64): "F64", np.dtype(np.float32): "F32", np.dtype(np.float16): "F16",
          np.dtype(np.int64): "I64", np.dtype(np.int32): "I32", np.dtype(np.int16): "I16",
          np.dtype(np.int8): "I8", np.dtype(np.uint8): "U8", np.dtype(np.bool_): "BOOL"}
_ITEMSIZE = {"F8_E4M3": 1, "F8_E5M2": 1}  # known but unreadable here
_MAX_HEADER = 100_000_000  # the reference implementation's limit


def bfloat16_to_float32(bits) -> np.ndarray:
    """Widen bfloat16 values stored as uint16 bit patterns to float32, exactly.

    Checkpoints store bfloat16 weights this way; NumPy has no bfloat16 dtype.

    Parameters
    ----------
    bits : array_like of uint16
        The bfloat16 bit patterns, any shape.

    Returns
    -------
    ndarray of float32
        Same shape, with the bits in the upper half of each float32.

    Examples
    --------
    >>> from attngeom.models import bfloat16_to_float32
    >>> bfloat16_to_float32(np.array([0x3F80, 0xC000], np.uint16))
    array([ 1., -2.], dtype=float32)
    """
    b = np.asarray(bits)
    if b.dtype != np.uint16:
        raise TypeError(f"bits must be a uint16 array of bfloat16 bit patterns, got dtype {b.dtype}")
    return (b.astype(np.uint32) << np.uint32(16)).view(np.float32)


def float32_to_bfloat16(x) -> np.ndarray:
    """Round float32 values to bfloat16 (nearest, ties to even); returns the uint16 bit patterns.

    The inverse, up to rounding, of :func:`bfloat16_to_float32`; NaN stays NaN.

    Parameters
    ----------
    x : array_like
        Real values, any shape (cast to float32 first).

    Returns
    -------
    ndarray of uint16
        The bfloat16 bit patterns, same shape.

    Examples
    --------
    >>> from attngeom.models import float32_to_bfloat16
    >>> [hex(b) for b in float32_to_bfloat16(np.array([1.0, -2.0]))]
    ['0x3f80', '0xc000']
    """
    f = np.ascontiguousarray(np.asarray(x, dtype=np.float32))
    u = f.view(np.uint32).astype(np.uint64)
    rounded = ((u + 0x7FFF + ((u >> 16) & 1)) >> 16).astype(np.uint16)
    return np.where(np.isnan(f), np.uint16(0x7FC0), rounded)


def _package():
    try:
        from safetensors import safe_open
    except ImportError:
        return None
    return safe_open


class SafetensorsFile:
    """One safetensors file: its checked header, tensor names, and tensors on demand.

    Parameters
    ----------
    path : a .safetensors file.
    backend : "auto" (the ``safetensors`` package when importable, else the built-in
        reader), "package" (require the package) or "python" (always the built-in reader).

    Tensors come back as NumPy arrays of their stored dtype (float16 stays float16), except
    BF16, which becomes float32. Raises ValueError for a file that is not safetensors, a
    truncated file, or a header whose offsets do not match the shapes.

    Example: ``f = SafetensorsFile("model.safetensors"); w = f["encoder.layer.0.attention.self.query.weight"]``
    """

    def __init__(self, path, *, backend: str = "auto"):
        if backend not in ("auto", "package", "python"):
            raise ValueError(f"backend must be 'auto', 'package' or 'python', got {backend!r}")
        self.path = os.fspath(path)
        if not os.path.isfile(self.path):
            raise ValueError(f"path must be an existing safetensors file, got {self.path!r}")
        safe_open = _package()
        if backend == "package" and safe_open is None:
            raise ImportError("backend='package' needs the safetensors package: pip install safetensors")
        self.backend = "python" if backend == "python" or safe_open is None else "package"
        self._header, self._data_start = self._read_header()
        self.metadata: Dict[str, str] = self._header.pop("__metadata__", None) or {}

    def _read_header(self):
        size = os.path.getsize(self.path)
        where = f"{self.path!r}"
        if size < 8:
            raise ValueError(f"{where} is not a safetensors file: {size} bytes, shorter than the 8-byte header length")
        with open(self.path, "rb") as f:
            (n,) = struct.unpack("<Q", f.read(8))
            if n == 0 or n > _MAX_HEADER:
                raise ValueError(f"{where} is not a safetensors file: header length {n} is not in 1..{_MAX_HEADER}")
            if 8 + n > size:
                raise ValueError(f"{where} is truncated or not a safetensors file: header length {n} "
                                 f"but only {size - 8} bytes follow")
            raw = f.read(n)
        try:
            header = json.loads(raw.decode("utf-8"))
        except (UnicodeDecodeError, json.JSONDecodeError) as exc:
            raise ValueError(f"{where} is not a safetensors file: the header is not JSON ({exc})") from None
        if not isinstance(header, dict):
            raise ValueError(f"{where} is not a safetensors file: the header is not a JSON object")
        data_len = size - 8 - n
        spans = []
        for name, info in header.items():
            if name == "__metadata__":
                if not isinstance(info, dict) or not all(isinstance(k, str) and isinstance(v, str) for k, v in info.items()):
                    raise ValueError(f"{where}: __metadata__ must map strings to strings")
                continue

            def plain_ints(x):
                return isinstance(x, list) and all(isinstance(i, int) and not isinstance(i, bool) for i in x)

            if (not isinstance(info, dict) or not isinstance(info.get("dtype"), str) or not plain_ints(info.get("shape"))
                    or not plain_ints(info.get("data_offsets")) or len(info["data_offsets"]) != 2):
                raise ValueError(f"{where}: header entry {name!r} needs a dtype string, an integer shape and two "
                                 f"integer data_offsets, got {info!r}")
            code, shape, (begin, end) = info["dtype"], list(info["shape"]), info["data_offsets"]
            spans.append((begin, end, name))
            itemsize = _DTYPES[code].itemsize if code in _DTYPES else _ITEMSIZE.get(code)
            if itemsize is None:
                itemsize = 0  # unknown dtype: rejected when the tensor is read
            expected = int(np.prod(shape, dtype=np.int64)) * itemsize
            if any(s < 0 for s in shape) or not 0 <= begin <= end:
                raise ValueError(f"{where}: tensor {name!r} has invalid shape {shape} or offsets [{begin}, {end}]")
            if itemsize and end - begin != expected:
                raise ValueError(f"{where}: tensor {name!r} of dtype {code} and shape {tuple(shape)} needs "
                                 f"{expected} bytes, its offsets [{begin}, {end}] give {end - begin}")
            if end > data_len:
                raise ValueError(f"{where} is truncated: tensor {name!r} ends at byte {end} of the data, "
                                 f"which has {data_len} bytes")
        # the data must be tiled exactly by the tensors, in order (as the reference reader requires)
        position = 0
        for begin, end, name in sorted(spans):
            if begin != position:
                raise ValueError(f"{where}: tensor {name!r} starts at byte {begin} of the data, expected {position} "
                                 "(tensors must be contiguous and must not overlap)")
            position = end
        if position != data_len:
            raise ValueError(f"{where}: the tensors cover {position} bytes but the data has {data_len} "
                             "(trailing bytes)")
        return header, 8 + n

    # -- the mapping interface ---------------------------------------------------------
    def keys(self) -> list:
        """Tensor names, in the header's order."""
        return list(self._header)

    def __contains__(self, name) -> bool:
        return name in self._header

    def __len__(self) -> int:
        return len(self._header)

    def dtype(self, name: str) -> str:
        """The stored dtype code of a tensor ("F32", "F16", "BF16", ...)."""
        return self._info(name)["dtype"]

    def shape(self, name: str) -> tuple:
        """The stored shape of a tensor, without reading it."""
        return tuple(int(s) for s in self._info(name)["shape"])

    def _info(self, name):
        if name not in self._header:
            raise KeyError(f"no tensor {name!r} in {self.path!r}")
        return self._header[name]

    def __getitem__(self, name: str) -> np.ndarray:
        return self.read([name])[name]

    def read(self, names: Optional[Iterable[str]] = None) -> Dict[str, np.ndarray]:
        """The named tensors (all by default) as {name: ndarray}; BF16 is widened to float32."""
        names = self.keys() if names is None else list(names)
        for name in names:
            code = self._info(name)["dtype"]
            if code not in _DTYPES:
                raise ValueError(f"tensor {name!r} in {self.path!r} has dtype {code}, which is not supported "
                                 f"(supported: {', '.join(_DTYPES)})")
        out = {}
        direct = [n for n in names if self.backend == "package" and self._header[n]["dtype"] != "BF16"]
        if direct:
            try:
                with _package()(self.path, framework="numpy") as f:
                    for name in direct:
                        out[name] = f.get_tensor(name)
            except Exception as exc:  # the package's SafetensorError is not a ValueError
                raise ValueError(f"{self.path!r} could not be read: {exc}") from None
        rest = [n for n in names if n not in out]
        if rest:
            with open(self.path, "rb") as f:
                for name in rest:
                    out[name] = self._read_one(f, name)
        return {n: out[n] for n in names}

    def _read_one(self, f, name) -> np.ndarray:
        info = self._header[name]
        code, shape = info["dtype"], tuple(int(s) for s in info["shape"])
        begin, end = info["data_offsets"]
        dt = _DTYPES[code]
        f.seek(self._data_start + begin)
        buf = f.read(end - begin)
        if len(buf) != end - begin:  # pragma: no cover - the header check catches this
            raise ValueError(f"{self.path!r} is truncated inside tensor {name!r}")
        a = np.frombuffer(buf, dtype=dt).reshape(shape)
        if code == "BF16":
            return bfloat16_to_float32(a)
        return a.astype(dt.newbyteorder("="), copy=True)

    def __repr__(self):
        return f"SafetensorsFile({self.path!r}, {len(self)} tensors, backend={self.backend!r})"


def read_safetensors(path, names: Optional[Iterable[str]] = None, *, backend: str = "auto") -> Dict[str, np.ndarray]:
    """Tensors of a safetensors file as {name: ndarray} (all, or the given names).

    Dtypes: F64, F32, F16 and the integer types keep their dtype; BF16 becomes float32
    (exactly). ValueError for a file that is not safetensors or is truncated.

    Parameters
    ----------
    path : str or path-like
        The .safetensors file.
    names : iterable of str, optional
        Read only these tensors (default all).
    backend : {"auto", "package", "python"}, default "auto"
        As in :class:`SafetensorsFile`.

    Returns
    -------
    dict of str to ndarray
        The tensors.

    Examples
    --------
    >>> from attngeom.models import read_safetensors, write_safetensors
    >>> path = write_safetensors("tiny.safetensors", {"w": np.eye(2, dtype=np.float32)})
    >>> read_safetensors(path)["w"]
    array([[1., 0.],
           [0., 1.]], dtype=float32)
    """
    return SafetensorsFile(path, backend=backend).read(names)


def write_safetensors(path, tensors: Dict[str, np.ndarray], *, metadata: Optional[Dict[str, str]] = None,
                      dtype: Optional[str] = None) -> str:
    """Write {name: array} as a safetensors file.

    Parameters
    ----------
    path : str or path-like
        Output file.
    tensors : dict of str to array_like
        The tensors.
    metadata : dict of str to str, optional
        Stored as "__metadata__".
    dtype : {None, "F32", "F16", "BF16"}, default None
        None keeps each array's dtype (float64, float32, float16, integer, bool); "F32",
        "F16" or "BF16" converts every floating array (BF16 rounds to nearest even).

    Returns
    -------
    str
        The path written.

    Examples
    --------
    >>> from attngeom.models import read_safetensors, write_safetensors
    >>> path = write_safetensors("half.safetensors", {"w": np.ones(3)}, dtype="BF16")
    >>> read_safetensors(path)["w"].dtype  # BF16 is read back widened to float32
    dtype('float32')
    """
    if dtype not in (None, "F32", "F16", "BF16"):
        raise ValueError(f"dtype must be None, 'F32', 'F16' or 'BF16', got {dtype!r}")
    header, chunks, offset = {}, [], 0
    for name, value in tensors.items():
        a = np.asarray(value)
        if a.dtype.kind == "f" and dtype is not None:
            if dtype == "BF16":
                code, data = "BF16", float32_to_bfloat16(a)
            else:
                code = dtype
                data = a.astype("<f4" if dtype == "F32" else "<f2")
        elif a.dtype in _CODES:
            code, data = _CODES[a.dtype], a
        else:
            raise TypeError(f"tensors[{name!r}] has dtype {a.dtype}, which safetensors cannot store here")
        raw = np.ascontiguousarray(data).astype(data.dtype.newbyteorder("<"), copy=False).tobytes()
        header[name] = {"dtype": code, "shape": list(a.shape), "data_offsets": [offset, offset + len(raw)]}
        chunks.append(raw)
        offset += len(raw)
    if metadata:
        header["__metadata__"] = {str(k): str(v) for k, v in metadata.items()}
    blob = json.dumps(header, separators=(",", ":")).encode("utf-8")
    blob += b" " * (-len(blob) % 8)  # align the data to 8 bytes, as the reference writer does
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(blob)))
        f.write(blob)
        for raw in chunks:
            f.write(raw)
    return os.fspath(path)
