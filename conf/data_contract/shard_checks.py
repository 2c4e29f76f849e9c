"""Shard checksums: a prepared dir's manifest records the sha256 of every shard (and loss mask);
these are checked before launch (every shard when the dir is small, else a random sample within
a byte budget) and again by each rank on every shard it opens (training/data/token_windows.py).
A flipped byte is then a named error, never silently trained on."""
from __future__ import annotations

import hashlib
import random
from pathlib import Path

PRELAUNCH_BUDGET_BYTES = 256 << 20
"""Before launch, a prepared dir this small (all shards and masks) is verified in full; a larger
one is verified on a random sample of whole shards up to this many bytes (about 0.5 s)."""


class ShardChecksumError(ValueError):
    """A shard's bytes are not the ones its manifest's sha256 records."""


def file_sha256(path: str | Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as stream:
        for block in iter(lambda: stream.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def verify_shard(path: str | Path, expected: str) -> None:
    """ShardChecksumError naming the shard when its sha256 is not `expected`."""
    actual = file_sha256(path)
    if actual != expected:
        raise ShardChecksumError(
            f"shard {path}: sha256 {actual[:16]}... is not the {expected[:16]}... its "
            "manifest.json records: the file changed after `meshrun data prepare` wrote it "
            "(fix: run the same `meshrun data prepare` again; it rebuilds the dir)")


def shards_to_verify(checksums: dict[str, str], *, budget_bytes: int,
                     rng: random.Random | None = None) -> list[str]:
    """Every shard when they fit the budget together; else a random sample that does (at least
    one shard)."""
    sizes = {path: Path(path).stat().st_size if Path(path).is_file() else 0
             for path in checksums}
    if sum(sizes.values()) <= budget_bytes:
        return list(checksums)
    order = list(checksums)
    (rng or random.Random()).shuffle(order)
    chosen, used = [], 0
    for path in order:
        if chosen and used + sizes[path] > budget_bytes:
            continue
        chosen.append(path)
        used += sizes[path]
    return chosen


def damaged_shards(checksums: dict[str, str], *,
                   budget_bytes: int = PRELAUNCH_BUDGET_BYTES) -> tuple[list[str], int]:
    """(messages for the damaged shards among those checked, how many were checked)."""
    chosen = shards_to_verify(checksums, budget_bytes=budget_bytes)
    bad = []
    for path in chosen:
        try:
            verify_shard(path, checksums[path])
        except (ShardChecksumError, OSError) as err:
            bad.append(str(err))
    return bad, len(chosen)
