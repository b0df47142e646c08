"""Durable files: written whole or not at all, and checked when read back.

``write_checked(path, data)`` writes the SHA-256 digest of `data` (64 hex characters) and
then `data` to a temporary file in the same folder, flushes it to disk and renames it over
`path` (``os.replace`` is atomic on POSIX): a process killed at any moment leaves the old
file or the new one, never a torn one. ``read_checked(path)`` returns the data and raises
:class:`attngeom.errors.DamagedFile` (a ValueError) when the file is truncated or its content no longer
matches its digest (a disk fault, a copy cut short). The saved states of interrupted
training runs and of corpus partitions are kept this way.
"""
from __future__ import annotations

import hashlib
import os

from .errors import DamagedFile

_DIGEST = 64  # hex characters of a SHA-256 digest


def _replace(path: str, data: bytes) -> None:
    """Write `data` to a temporary file beside `path`, flush it to disk, rename it over `path`."""
    folder = os.path.dirname(os.path.abspath(path))
    os.makedirs(folder, exist_ok=True)
    tmp = f"{path}.{os.getpid()}.tmp"
    try:
        with open(tmp, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    finally:
        if os.path.exists(tmp):
            os.remove(tmp)


def write_checked(path: str, data: bytes) -> None:
    """Write `data` to `path` atomically, preceded by its SHA-256 digest."""
    _replace(path, hashlib.sha256(data).hexdigest().encode("ascii") + data)


def write_atomic(path, text: str) -> str:
    """Write `text` (UTF-8) to `path` atomically: a reader sees the old file or the new one,
    never a torn one. Returns the path."""
    path = str(path)
    _replace(path, text.encode("utf-8"))
    return path


def read_checked(path: str) -> bytes:
    """The data write_checked wrote to `path`; DamagedFile when it is truncated or altered."""
    with open(path, "rb") as f:
        head, data = f.read(_DIGEST), f.read()
    try:
        digest = head.decode("ascii")
    except UnicodeDecodeError:
        digest = ""
    if len(digest) != _DIGEST or hashlib.sha256(data).hexdigest() != digest:
        raise DamagedFile(f"{path} is damaged: its content does not match its SHA-256 digest (truncated or altered)")
    return data
