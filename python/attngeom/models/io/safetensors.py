"""Reading and writing the safetensors format, with or without the ``safetensors`` package.

The format: an 8-byte little-endian unsigned header length N, a JSON header of N bytes
({name: {"dtype": "F32", "shape": [...], "data_offsets": [begin, end]}, "__metadata__":
{str: str}}), then the raw little-endian tensor data, offsets relative to its start.

The header is always parsed and checked here, so a file that is not safetensors, a
truncated file or an inconsistent header gives the same ValueError with either backend.
The checks: a header of at most ``MAX_HEADER_BYTES`` (16 MiB, reasoning beside it), UTF-8
JSON nested no deeper than Python can parse, no name given twice, shapes of at most 64
dimensions each in 0..2**63-1 with at most 2**63-1 elements, and offsets that tile the data
exactly, sizes computed as Python integers (no int64 wrap-around: [2**32, 2**32] is not 0
bytes). Every message names the file and the tensor or field.
Tensor data is read through the ``safetensors`` package's NumPy API when it is installed
(``backend="auto"``), otherwise by this module's own reader; bfloat16 has no NumPy dtype,
so BF16 tensors are always read here and widened to float32 exactly (the 16 bits are the
upper half of the float32 bit pattern).

:meth:`SafetensorsFile.mapped` reads nothing: it returns a read-only view of the tensor's
bytes in a memory map of the file (the header checked here, with either backend), so the
operating system pages weights in as they are used and can drop them again; a BF16 tensor
becomes a :class:`BFloat16Array`, widened to float32 only when a computation asks for it.
"""
from __future__ import annotations

import json
import mmap
import os
import struct
from typing import Dict, Iterable, Optional

import numpy as np

from ... import _core
from ..._operands import choice

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

# The largest JSON header read (bytes). The reference implementation allows 100 MB, which
# parses into about 1.5 GB of Python objects and takes tens of seconds here; real headers
# are far smaller. A header entry takes about 100-130 bytes
# ('"model.layers.60.mlp.experts.255.down_proj.weight":{"dtype":"BF16","shape":[7168,2048],
# "data_offsets":[...]}'). The model with the most tensors in common use, DeepSeek-V3
# (61 layers, 256 experts, FP8 weights each with a scale tensor: about 92k tensors), would
# need about 12 MB if it were saved as one file; published checkpoints are shards of a few
# GB whose headers are tens to hundreds of kB. 16 MiB holds about 130k tensors in one file
# and parses in one to two seconds into about 250 MB.
MAX_HEADER_BYTES = 16 * 1024 * 1024
_MAX_NDIM = 64  # NumPy's limit on dimensions
_INT64_MAX = 2 ** 63 - 1  # the format's shapes and offsets are 64-bit; NumPy sizes are int64


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
    if b.ndim and b.flags.c_contiguous:  # the core widens on the thread budget
        return _core.widen_bf16(b)
    if b.ndim and b.T.flags.c_contiguous:  # a transposed weight: the same layout as NumPy's order="K"
        return _core.widen_bf16(b.T).T
    return (b.astype(np.uint32) << np.uint32(16)).view(np.float32)


class BFloat16Array:
    """bfloat16 values held as their uint16 bit patterns, widened to float32 when used.

    NumPy has no bfloat16 dtype. A BF16 weight of a memory-mapped checkpoint (or of an
    in-memory torch model) stays in its 2-byte form; indexing, slicing and ``.T`` give
    views of the bits, and ``astype`` / ``np.asarray`` widen exactly
    (:func:`bfloat16_to_float32`), so a forward pass widens one layer at a time instead of
    the whole model at load.

    Parameters
    ----------
    bits : ndarray of uint16
        The bit patterns, any shape (kept as given: a memory map stays one).

    Attributes
    ----------
    bits : ndarray of uint16
        The bit patterns.
    shape, ndim, size : as the widened array's.

    Examples
    --------
    >>> from attngeom.models import BFloat16Array
    >>> a = BFloat16Array(np.array([[0x3F80, 0xC000]], np.uint16))
    >>> a.shape, a.T.astype(np.float64).ravel()
    ((1, 2), array([ 1., -2.]))
    """

    __slots__ = ("bits",)

    def __init__(self, bits):
        if not isinstance(bits, np.ndarray) or bits.dtype != np.uint16:
            raise TypeError(f"bits must be a uint16 ndarray of bfloat16 bit patterns, got "
                            f"{type(bits).__name__} {getattr(bits, 'dtype', '')}")
        self.bits = bits

    dtype = np.dtype(np.float32)  # what it widens to

    @property
    def shape(self) -> tuple:
        return self.bits.shape

    @property
    def ndim(self) -> int:
        return self.bits.ndim

    @property
    def size(self) -> int:
        return self.bits.size

    @property
    def T(self) -> "BFloat16Array":
        return BFloat16Array(self.bits.T)

    def __len__(self) -> int:
        return len(self.bits)

    def __getitem__(self, index) -> "BFloat16Array":
        return BFloat16Array(self.bits[index])

    def astype(self, dtype, copy: bool = True) -> np.ndarray:
        """The values widened to float32, then cast to ``dtype`` (a new array)."""
        return bfloat16_to_float32(self.bits).astype(dtype, copy=False)

    def __array__(self, dtype=None, copy=None):
        return self.astype(np.float32 if dtype is None else dtype)

    def __repr__(self):
        return f"BFloat16Array(shape={self.shape})"


def release_pages(a) -> None:
    """Drop the file pages under a memory-mapped tensor from this process's resident set.

    The forward pass reads each layer's weights once; after the layer, its mapped pages are
    released (``madvise(MADV_DONTNEED)``), so the resident set holds about one layer of
    weights instead of the whole checkpoint. The pages stay in the kernel's page cache: a
    later use maps them again without reading the file (only read-only maps are released, so
    nothing is lost). Only pages wholly inside the tensor are released. Arrays that are not
    views of a read-only memory map (weights held in memory, copy-on-write or writable maps)
    are left alone.

    Parameters
    ----------
    a : ndarray or BFloat16Array
        A view from :meth:`SafetensorsFile.mapped` (any slice or transpose of one), or any
        other object (ignored).

    Examples
    --------
    >>> from attngeom.models.io.safetensors import release_pages
    >>> release_pages(np.ones(3))   # not mapped: nothing happens
    """
    arr = a.bits if isinstance(a, BFloat16Array) else a
    mm = getattr(arr, "_mmap", None)
    if mm is None or not isinstance(arr, np.ndarray) or arr.size == 0 or not hasattr(mmap, "MADV_DONTNEED"):
        return
    if getattr(arr, "mode", None) != "r":  # a copy-on-write or writable map: its pages may hold edits
        return
    base = np.frombuffer(mm, np.uint8).__array_interface__["data"][0]
    low = high = arr.__array_interface__["data"][0]
    for n, stride in zip(arr.shape, arr.strides):
        low, high = low + min(0, stride * (n - 1)), high + max(0, stride * (n - 1))
    page = mmap.PAGESIZE
    start = -(-(low - base) // page) * page
    end = (high + arr.itemsize - base) // page * page
    if end > start:
        mm.madvise(mmap.MADV_DONTNEED, start, end - start)


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


class _DuplicateName(Exception):
    """A JSON object of the header names the same key twice."""


def _unique_object(pairs):
    """json object_pairs_hook: the object as a dict, refusing a key that occurs twice."""
    obj = dict(pairs)
    if len(obj) != len(pairs):
        seen = set()
        for key, _ in pairs:
            if key in seen:
                raise _DuplicateName(key)
            seen.add(key)
    return obj


def _parse_header(raw: bytes, where: str) -> dict:
    """The JSON header as a dict; ValueError for text that is not a JSON object without repeated keys."""
    try:
        header = json.loads(raw.decode("utf-8"), object_pairs_hook=_unique_object)
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise ValueError(f"{where} is not a safetensors file: the header is not JSON ({exc})") from None
    except RecursionError:
        raise ValueError(f"{where} is not a safetensors file: the header is nested too deeply "
                         "(a safetensors header has three levels)") from None
    except _DuplicateName as exc:
        raise ValueError(f"{where}: the header names {exc.args[0]!r} twice (tensor names and fields must be "
                         "unique)") from None
    if not isinstance(header, dict):
        raise ValueError(f"{where} is not a safetensors file: the header is not a JSON object")
    return header


def _plain_ints(x) -> bool:
    return isinstance(x, list) and all(type(i) is int for i in x)


def _check_entry(name: str, info, data_len: int, where: str):
    """(begin, end) of one header entry after checking its dtype, shape and offsets against
    the data's length; ValueError naming the file, the tensor and the field otherwise.

    Shapes and offsets are Python integers (unbounded), so no product or sum here can wrap
    around; each is bounded before NumPy sees it."""
    if (not isinstance(info, dict) or not isinstance(info.get("dtype"), str) or not _plain_ints(info.get("shape"))
            or not _plain_ints(info.get("data_offsets")) or len(info["data_offsets"]) != 2):
        raise ValueError(f"{where}: header entry {name!r} needs a dtype string, an integer shape and two "
                         f"integer data_offsets, got {_short(info)}")
    code, shape, (begin, end) = info["dtype"], info["shape"], info["data_offsets"]
    if len(shape) > _MAX_NDIM or any(not 0 <= s <= _INT64_MAX for s in shape):
        raise ValueError(f"{where}: tensor {name!r} has an invalid shape {_short(shape)} (at most {_MAX_NDIM} "
                         f"dimensions, each in 0..2**63-1)")
    numel = 1
    for s in shape:
        if s:  # the size NumPy allocates and indexes with; zero-size dimensions aside
            numel *= s
    if numel > _INT64_MAX:
        raise ValueError(f"{where}: tensor {name!r} has shape {tuple(shape)} with {numel} elements, beyond 2**63-1")
    if 0 in shape:
        numel = 0
    if not 0 <= begin <= end:
        raise ValueError(f"{where}: tensor {name!r} has invalid data_offsets [{begin}, {end}]")
    if end > data_len:
        raise ValueError(f"{where} is truncated: tensor {name!r} ends at byte {end} of the data, "
                         f"which has {data_len} bytes")
    itemsize = _DTYPES[code].itemsize if code in _DTYPES else _ITEMSIZE.get(code)
    if itemsize is not None and end - begin != numel * itemsize:  # unknown dtypes are refused when read
        raise ValueError(f"{where}: tensor {name!r} of dtype {code} and shape {tuple(shape)} needs "
                         f"{numel * itemsize} bytes, its data_offsets [{begin}, {end}] give {end - begin}")
    return begin, end


def _short(value, limit: int = 200) -> str:
    """repr(value) cut to `limit` characters (header entries can be arbitrarily long)."""
    text = repr(value)
    return text if len(text) <= limit else text[:limit] + "..."


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
    BF16, which becomes float32. Raises ValueError (naming the file and the tensor or
    field) for a file that is not safetensors, a truncated file, or a header that breaks
    one of the module's checks (size, nesting, repeated names, shapes, offsets).

    Example: ``f = SafetensorsFile("model.safetensors"); w = f["encoder.layer.0.attention.self.query.weight"]``
    """

    def __init__(self, path, *, backend: str = "auto"):
        choice("backend", backend, ("auto", "package", "python"), "'auto', 'package' or 'python'")
        self.path = os.fspath(path)
        if not os.path.isfile(self.path):
            raise ValueError(f"path must be an existing safetensors file, got {self.path!r}")
        safe_open = _package()
        if backend == "package" and safe_open is None:
            raise ImportError("backend='package' needs the safetensors package: pip install safetensors")
        self.backend = "python" if backend == "python" or safe_open is None else "package"
        self._header, self._data_start = self._read_header()
        self.metadata: Dict[str, str] = self._header.pop("__metadata__", None) or {}
        self._map = None

    def _read_header(self):
        size = os.path.getsize(self.path)
        where = f"{self.path!r}"
        if size < 8:
            raise ValueError(f"{where} is not a safetensors file: {size} bytes, shorter than the 8-byte header length")
        with open(self.path, "rb") as f:
            (n,) = struct.unpack("<Q", f.read(8))
            if n == 0 or n > MAX_HEADER_BYTES:
                raise ValueError(f"{where} is not a safetensors file or its header is too large: header length {n} "
                                 f"is not in 1..{MAX_HEADER_BYTES}")
            if 8 + n > size:
                raise ValueError(f"{where} is truncated or not a safetensors file: header length {n} "
                                 f"but only {size - 8} bytes follow")
            raw = f.read(n)
        header = _parse_header(raw, where)
        data_len = size - 8 - n
        spans = []
        for name, info in header.items():
            if name == "__metadata__":
                if not isinstance(info, dict) or not all(isinstance(v, str) for v in info.values()):
                    raise ValueError(f"{where}: __metadata__ must map strings to strings")
                continue
            begin, end = _check_entry(name, info, data_len, where)
            spans.append((begin, end, name))
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

    def mapped(self, name: str):
        """A tensor as a read-only view of the file's bytes, through a memory map: nothing is
        read until the values are used.

        As with any memory map, the file must not be truncated while the view is in use
        (the process would get SIGBUS); :func:`write_safetensors` replaces a file by renaming
        a new one over it, which leaves existing maps intact.

        Parameters
        ----------
        name : str
            The tensor.

        Returns
        -------
        ndarray or BFloat16Array
            A read-only ``np.memmap`` view of the stored dtype (little-endian), or, for BF16,
            a :class:`BFloat16Array` over such a view of its bits.

        Raises
        ------
        KeyError
            For a name the file does not hold.
        ValueError
            For a dtype this module cannot read (fp8).

        Examples
        --------
        >>> from attngeom.models import SafetensorsFile, write_safetensors
        >>> f = SafetensorsFile(write_safetensors("m.safetensors", {"w": np.ones((2, 3), np.float32)}))
        >>> w = f.mapped("w")
        >>> type(w).__name__, w.flags.writeable
        ('memmap', False)
        """
        info = self._info(name)
        code = info["dtype"]
        if code not in _DTYPES:
            raise ValueError(f"tensor {name!r} in {self.path!r} has dtype {code}, which is not supported "
                             f"(supported: {', '.join(_DTYPES)})")
        shape = tuple(int(s) for s in info["shape"])
        begin, end = info["data_offsets"]
        if end == begin:  # mmap cannot map an empty file region
            a = np.zeros(shape, _DTYPES[code])
            a.flags.writeable = False
        else:
            if self._map is None:
                self._map = np.memmap(self.path, dtype=np.uint8, mode="r", offset=self._data_start)
            a = self._map[begin:end].view(_DTYPES[code]).reshape(shape)
        return BFloat16Array(a) if code == "BF16" else a

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
        The tensors; a :class:`BFloat16Array` is written as BF16 as it is.
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
        if isinstance(value, BFloat16Array):  # stored as its bits, whatever `dtype` says
            bits = np.ascontiguousarray(value.bits).astype("<u2", copy=False)
            header[name] = {"dtype": "BF16", "shape": list(bits.shape), "data_offsets": [offset, offset + bits.nbytes]}
            chunks.append(bits.tobytes())
            offset += bits.nbytes
            continue
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
    if len(blob) > MAX_HEADER_BYTES:
        raise ValueError(f"tensors: the header of {len(tensors)} tensors would take {len(blob)} bytes, above the "
                         f"{MAX_HEADER_BYTES} that the readers accept; write the tensors into several files")
    # A new file renamed over the old one: a reader that memory-maps the old file keeps its
    # contents (rewriting it in place would truncate the pages under the map).
    staging = f"{os.fspath(path)}.{os.getpid()}.partial"
    try:
        with open(staging, "wb") as f:
            f.write(struct.pack("<Q", len(blob)))
            f.write(blob)
            for raw in chunks:
                f.write(raw)
        os.replace(staging, path)
    finally:
        if os.path.exists(staging):
            os.remove(staging)
    return os.fspath(path)
