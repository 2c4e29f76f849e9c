"""A full disk named in one line: which path could not be written, and how much space is free
on its filesystem. Torch-free: the launcher, the checkpoint writer and the export share it."""
from __future__ import annotations

import errno
import os
from pathlib import Path

NO_SPACE = "No space left on device"
_FULL_ERRNOS = (errno.ENOSPC, errno.EDQUOT, errno.EFBIG)
DISK_FULL_FREE_BYTES = 64 << 10
"""Below this much free space, a failed write is taken for a full disk: some writers lose the
ENOSPC (torch.save's zip writer says only "unexpected pos 704 vs 598")."""


def is_disk_full(exc: BaseException, where: Path | str | None = None) -> bool:
    """A write refused for lack of space (ENOSPC, a quota, a file-size limit), also when a
    library wrapped the OSError in its own exception and kept only the message, or lost it
    while `where` (what was being written) has (almost) no free space left."""
    if isinstance(exc, OSError) and exc.errno in _FULL_ERRNOS:
        return True
    text = str(exc)
    if NO_SPACE in text or "Disk quota exceeded" in text or "File too large" in text:
        return True
    free = free_bytes(Path(where)) if where is not None else None
    return free is not None and free < DISK_FULL_FREE_BYTES


def free_bytes(path: Path) -> int | None:
    """Free space (for an unprivileged writer) on the filesystem holding `path`, or on its
    nearest existing parent; None when no parent can be read."""
    for candidate in [Path(path), *Path(path).parents]:
        try:
            fs = os.statvfs(candidate)
        except OSError:
            continue
        return fs.f_bavail * fs.f_frsize
    return None


def human_bytes(count: int | None) -> str:
    if count is None:
        return "unknown space"
    for unit in ("B", "KiB", "MiB", "GiB"):
        if count < 1024:
            return f"{count:.0f} {unit}" if unit == "B" else f"{count:.1f} {unit}"
        count /= 1024
    return f"{count:.1f} TiB"


def disk_full_line(exc: BaseException, where: Path | str | None = None) -> str | None:
    """One line for a disk-full error (None for any other error): the file being written (the
    error's own filename, else `where`) and the free space left on its filesystem."""
    if not is_disk_full(exc, where):
        return None
    path = getattr(exc, "filename", None) or where
    if path is None:
        return f"{NO_SPACE} ({type(exc).__name__}); free space on the run's disks, then resume"
    return (f"{NO_SPACE} writing {path}: {human_bytes(free_bytes(Path(path)))} free on its "
            "filesystem; free space there, then resume (nothing partial is counted as complete)")
