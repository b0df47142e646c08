"""Output folders (run folders, the heads and corpus reports) written whole or not at all: into a hidden temporary
sibling ".<name>.<random>.partial", renamed into place once every file is written, so an interrupted run or a full
disk never leaves a folder that looks complete."""
from __future__ import annotations

import os
import secrets
import shutil

PARTIAL = ".partial"  # suffix of the temporary folders an output is written into


def _stage(final: str, marker: str) -> str:
    """Create the temporary folder that `final` (an absolute path) is written into, next to it (same file system,
    so the final rename is atomic); ValueError naming --out when it cannot be written there.

    An existing `final` is replaced at the end only when it is empty or holds `marker` (an
    earlier output of the same command); anything else is refused, never deleted."""
    if os.path.lexists(final):
        if not os.path.isdir(final) or os.path.islink(final):
            raise ValueError(f"--out {final!r} exists and is not a folder")
        entries = os.listdir(final)
        if entries and marker not in entries:
            raise ValueError(f"--out {final!r} is a folder that holds other files (no {marker}); "
                             "choose a new or an empty folder")
    parent = os.path.dirname(final)
    try:
        if os.path.lexists(parent) and not os.path.isdir(parent):
            raise NotADirectoryError(f"{parent!r} is not a folder")
        os.makedirs(parent, exist_ok=True)
        staging = _sibling(final, PARTIAL)
    except OSError as exc:
        raise ValueError(f"--out {final!r} cannot be written: {exc}") from None
    return staging


def _sibling(final: str, suffix: str) -> str:
    """Create a new empty hidden folder ".<name>.<random><suffix>" next to `final` (permissions
    from the umask, as a folder made by os.makedirs would have)."""
    parent, name = os.path.split(final)
    for _ in range(100):
        path = os.path.join(parent, f".{name}.{secrets.token_hex(4)}{suffix}")
        try:
            os.mkdir(path)
            return path
        except FileExistsError:
            continue
    raise FileExistsError(f"no free temporary name next to {final!r}")  # pragma: no cover


def _publish(staging: str, final: str) -> None:
    """Move the finished `staging` folder to `final`, replacing an earlier output there."""
    if not os.path.lexists(final):
        os.rename(staging, final)
        return
    old = _sibling(final, ".old")
    previous = os.path.join(old, "previous")
    os.rename(final, previous)
    try:
        os.rename(staging, final)
    except OSError:
        os.rename(previous, final)  # put the earlier output back (kept in `old` if even that fails)
        os.rmdir(old)
        raise
    shutil.rmtree(old, ignore_errors=True)


def write_folder(final: str, marker: str, write, *, staging: str = None, keep=None) -> None:
    """`write(folder)` into a staging folder, then published as `final`; the staging folder is
    removed when writing fails (a full disk, an interrupt), so `final` is never half-written.

    `staging` continues an earlier staging folder instead of a new one; `keep(staging)` is
    called when writing fails and, returning True, keeps the folder (a resumable run's saved
    states) instead of removing it."""
    final = os.path.abspath(final)
    if os.path.dirname(final) == final:
        raise ValueError(f"--out {final!r} is the root of the file system, not an output folder")
    staging = staging or _stage(final, marker)
    published = False
    try:
        write(staging)
        _publish(staging, final)
        published = True
    finally:
        if not published and not (keep is not None and keep(staging)):
            shutil.rmtree(staging, ignore_errors=True)

