"""Checkpoint folders, owned here: their names and THE complete-checkpoint rule.

Under checkpoints/ (or any checkpoint root)::

    step_00000100/          complete: has meta.json and DCP's .metadata
    step_00000200.tmp/      being written, or left by a crash: never resumed from
    step_00000200.old/      a replaced checkpoint, about to be deleted: never resumed from

Torch-free: the launcher checks checkpoints before launch with the same rule the ranks use.
"""
from __future__ import annotations

import json
import re
from pathlib import Path

META_FILENAME = "meta.json"
DCP_METADATA_FILENAME = ".metadata"
TMP_SUFFIX = ".tmp"
REPLACED_SUFFIX = ".old"
_COMPLETE_NAME = re.compile(r"^step_(\d{8,})$")
_STALE_NAME = re.compile(r"^step_\d{8,}\.(tmp|old)$")


def step_dir_name(step: int) -> str:
    """`step_00000042` for step 42 (zero-padded so names sort like steps)."""
    if step < 0:
        raise ValueError(f"checkpoint step must be >= 0, got {step}")
    return f"step_{step:08d}"


def step_dir(root: Path, *, step: int) -> Path:
    """Where the complete checkpoint of `step` lives."""
    return Path(root) / step_dir_name(step)


def tmp_step_dir(root: Path, *, step: int) -> Path:
    """Where the checkpoint of `step` is written before it is published by a rename."""
    return Path(root) / (step_dir_name(step) + TMP_SUFFIX)


def replaced_step_dir(root: Path, *, step: int) -> Path:
    """Where an existing checkpoint of `step` is moved while a new one takes its name."""
    return Path(root) / (step_dir_name(step) + REPLACED_SUFFIX)


def checkpoint_step(path: Path) -> int | None:
    """The step encoded in a complete-checkpoint folder name, or None for any other name."""
    match = _COMPLETE_NAME.match(Path(path).name)
    return int(match.group(1)) if match else None


def is_complete_checkpoint(path: Path) -> bool:
    """THE rule: a published `step_N` folder (no .tmp/.old suffix) holding meta.json and DCP's
    .metadata. Nothing else is resumed or loaded from."""
    path = Path(path)
    return (
        checkpoint_step(path) is not None
        and path.is_dir()
        and (path / META_FILENAME).is_file()
        and (path / DCP_METADATA_FILENAME).is_file()
    )


def complete_checkpoints(root: Path) -> list[Path]:
    """Every complete checkpoint under `root`, oldest step first (empty if root is missing)."""
    root = Path(root)
    if not root.is_dir():
        return []
    found = [p for p in root.iterdir() if is_complete_checkpoint(p)]
    return sorted(found, key=lambda p: checkpoint_step(p))


def latest_checkpoint(root: Path) -> Path | None:
    """The newest complete checkpoint under `root`; partial or stale folders are ignored."""
    found = complete_checkpoints(root)
    return found[-1] if found else None


def stale_dirs(root: Path) -> list[Path]:
    """Folders left by interrupted saves (`step_N.tmp`, `step_N.old`)."""
    root = Path(root)
    if not root.is_dir():
        return []
    return sorted(p for p in root.iterdir() if p.is_dir() and _STALE_NAME.match(p.name))


def checkpoints_beyond_newest(root: Path, *, keep_last: int) -> list[Path]:
    """Complete checkpoints older than the newest `keep_last` ones (those to delete)."""
    if keep_last < 1:
        raise ValueError(f"keep_last must be >= 1 (or None to keep all), got {keep_last}")
    return complete_checkpoints(root)[:-keep_last]


def read_checkpoint_meta(path: Path) -> dict:
    """The contents of a checkpoint's meta.json (step, world_size, caller metadata, ...)."""
    meta_path = Path(path) / META_FILENAME
    if not meta_path.is_file():
        raise FileNotFoundError(
            f"{path} is not a complete checkpoint: {META_FILENAME} is missing "
            "(an interrupted save?); use latest_checkpoint(root) to find a complete one"
        )
    return json.loads(meta_path.read_text())
