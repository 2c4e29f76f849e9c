"""Writes that survive a crash of the machine, not only of the process: data and folder
entries fsynced before a rename makes them visible (checkpoints, exports)."""
from __future__ import annotations

import os
from pathlib import Path


def fsynced_write(path: Path, data: bytes) -> None:
    """Write `data` to `path` and fsync it."""
    with open(path, "wb") as handle:
        handle.write(data)
        handle.flush()
        os.fsync(handle.fileno())


def fsync_path(path: Path) -> None:
    """fsync a file or a folder (a folder: its entries, e.g. after a rename into it)."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
