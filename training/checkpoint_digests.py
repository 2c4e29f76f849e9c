"""The manifest of a checkpoint's files (size and SHA-256 each), built while saving: each rank
checksums what it wrote, rank 0 gathers them and adds what no rank claimed. meta.json lists
it; a checkpoint counts only when the manifest covers every file (conf/run_dir/checkpoint_dirs)."""
from __future__ import annotations

from pathlib import Path

import torch.distributed as dist

from conf.run_dir.checkpoint_dirs import META_FILENAME
from conf.run_dir.checkpoint_verify import file_digest


def own_digests(folder: Path, *, rank: int, rank_file: str) -> dict:
    """Size and checksum of the files this rank wrote (DCP's `__<rank>_*`, its `rank_file`)."""
    names = [p.name for p in folder.iterdir() if p.name.startswith(f"__{rank}_")]
    names.append(rank_file)
    return {name: file_digest(folder / name) for name in names}


def gather_digests(digests: dict, group=None) -> dict:
    """Every rank's digests, on every rank (one process: its own)."""
    if not (dist.is_available() and dist.is_initialized()):
        return dict(digests)
    every: list = [None] * dist.get_world_size(group)
    dist.all_gather_object(every, digests, group=group)
    return {name: entry for part in every for name, entry in part.items()}


def add_unclaimed_digests(folder: Path, manifest: dict) -> None:
    """Rank 0 checksums what no rank claimed (DCP's .metadata, files of unexpected names)."""
    for path in folder.iterdir():
        if path.is_file() and path.name != META_FILENAME and path.name not in manifest:
            manifest[path.name] = file_digest(path)
