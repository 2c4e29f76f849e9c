"""Is a checkpoint intact and safe to load? Torch-free, so the launcher asks before launch and
the ranks ask with the same code before they load.

Two checks:

* Checksums. Each save records every file's size and SHA-256 (about 1.2 GB/s on one core here,
  faster than blake2b's 0.4) in meta.json under "files"; meta.json is written last, so a folder
  with meta.json has a complete manifest. A truncated, bit-flipped, missing or replaced file
  fails `checkpoint_problems`. Checkpoints from before manifests (format 1) have no "files":
  they are reported as unverified, not as damaged.
* DCP's `.metadata` is a pickle; unpickling runs whatever it names. It may name only the
  classes DCP's metadata is made of (`DCP_METADATA_GLOBALS`, found by logging the globals of
  real checkpoints). `scan_dcp_metadata` walks it with every allowed class replaced by an inert
  stub (nothing is constructed, nothing runs) and refuses any other name; the ranks read it with
  the same allow-list and the real classes (training.safe_dcp).
"""
from __future__ import annotations

import hashlib
import json
import pickle
import re
from pathlib import Path

from conf.run_dir.checkpoint_dirs import (DCP_METADATA_FILENAME, META_FILENAME, checkpoint_step,
                                          complete_checkpoints)
from conf.run_dir.paths import CHECKPOINTS_DIR

MANIFEST_KEY = "files"
HASH_NAME = "sha256"
_CHUNK_BYTES = 1 << 20

DCP_METADATA_GLOBALS: dict[str, frozenset[str]] = {
    "torch.distributed.checkpoint.metadata": frozenset({
        "Metadata", "MetadataIndex", "StorageMeta", "TensorProperties", "TensorStorageMetadata",
        "BytesStorageMetadata", "ChunkStorageMetadata", "_MEM_FORMAT_ENCODING"}),
    "torch.distributed.checkpoint.filesystem": frozenset({"_StorageInfo"}),
    "torch": frozenset({"Size"}),
    "torch.serialization": frozenset({"_get_layout"}),  # torch.strided etc., by name
    "pathlib": frozenset({"PosixPath", "PurePosixPath", "WindowsPath", "PureWindowsPath"}),
    "collections": frozenset({"OrderedDict"}),
}
_DTYPE_NAME = re.compile(r"^(bool|(b?float|complex|u?int|q?u?int)\d+(_[a-z0-9]+)?)$")
"""`torch.<dtype>` (float32, bfloat16, float8_e4m3fn, ...); the ranks also check isinstance."""


class UnsafeCheckpoint(ValueError):
    """A checkpoint file names something outside the allow-list; it is never unpickled."""


def allowed_global(module: str, name: str) -> bool:
    """May DCP metadata name `module.name`? (the one allow-list: here and in the ranks)"""
    if module == "torch" and _DTYPE_NAME.match(name):
        return True
    return name in DCP_METADATA_GLOBALS.get(module, ())


def refusal(path: Path, module: str, name: str) -> str:
    return (f"{path} names {module}.{name}, which DCP checkpoint metadata never holds; refusing "
            "to unpickle it (a planted or foreign file?). Load only checkpoints you trust")


def file_digest(path: Path) -> dict:
    """{"bytes": size, "sha256": hex digest}, read in 1 MiB chunks."""
    digest = hashlib.new(HASH_NAME)
    size = 0
    with open(path, "rb") as handle:
        while chunk := handle.read(_CHUNK_BYTES):
            digest.update(chunk)
            size += len(chunk)
    return {"bytes": size, HASH_NAME: digest.hexdigest()}


def file_problem(folder: Path, name: str, expected: dict, *, hashes: bool = True) -> str | None:
    """Why `folder/name` is not the file the manifest recorded, or None (`hashes=False`: sizes
    only, cheap enough for the launcher)."""
    path = Path(folder) / name
    if not path.is_file():
        return f"{name} is missing"
    size = path.stat().st_size
    if size != expected["bytes"]:
        return f"{name} has {size} bytes, {expected['bytes']} were written (truncated?)"
    if hashes and file_digest(path)[HASH_NAME] != expected[HASH_NAME]:
        return f"{name} does not match its {HASH_NAME} checksum (corrupted on disk?)"
    return None


class _Inert:
    """What every allowed global becomes while scanning: accepts anything, does nothing."""

    def __init__(self, *args, **kwargs) -> None:
        pass

    def __setstate__(self, state) -> None:
        pass


class AllowListUnpickler(pickle.Unpickler):
    """Refuses every global outside the allow-list; `resolve` says what an allowed one becomes.
    This scan builds nothing (inert stubs); training/safe_dcp.py resolves the real classes."""

    def __init__(self, handle, *, path: Path) -> None:
        super().__init__(handle)
        self.path = path

    def find_class(self, module: str, name: str):
        if not allowed_global(module, name):
            raise UnsafeCheckpoint(refusal(self.path, module, name))
        return self.resolve(module, name)

    def resolve(self, module: str, name: str):
        return _Inert



def scan_dcp_metadata(folder: Path) -> str | None:
    """Why DCP's .metadata in `folder` must not be unpickled, or None. Runs nothing it names."""
    path = Path(folder) / DCP_METADATA_FILENAME
    try:
        with open(path, "rb") as handle:
            AllowListUnpickler(handle, path=path).load()
    except UnsafeCheckpoint as exc:
        return str(exc)
    except Exception as exc:  # noqa: BLE001 - any other failure: an unreadable pickle
        return f"{path} is not a readable DCP metadata pickle ({type(exc).__name__}: {exc})"
    return None


def read_manifest(folder: Path) -> dict | None:
    """The {file name: {"bytes", "sha256"}} a save recorded; None for a format-1 checkpoint.
    Raises ValueError when meta.json itself is unreadable."""
    try:
        meta = json.loads((Path(folder) / META_FILENAME).read_text())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise ValueError(f"{META_FILENAME} is unreadable ({type(exc).__name__}: {exc})") from exc
    files = meta.get(MANIFEST_KEY) if isinstance(meta, dict) else None
    return files if isinstance(files, dict) else None


def checkpoint_problems(folder: Path, *, share: tuple[int, int] = (0, 1),
                        hashes: bool = True) -> list[str]:
    """What is wrong with the checkpoint in `folder` (empty: intact and safe to load).

    `share=(rank, world_size)` checks every world_size-th file of the manifest (ranks split
    the reading, then pool their answers); the metadata pickle is scanned on every share.
    """
    folder = Path(folder)
    try:
        manifest = read_manifest(folder)
    except ValueError as exc:
        return [str(exc)]
    problems = []
    if manifest is not None:
        index, count = share
        for name in sorted(manifest)[index::count]:
            problem = file_problem(folder, name, manifest[name], hashes=hashes)
            if problem:
                problems.append(problem)
    if not problems:  # a damaged .metadata already failed its checksum: say that, not "unsafe"
        unsafe = scan_dcp_metadata(folder)
        if unsafe:
            problems.append(unsafe)
    return problems


def describe(folder: Path, problems: list[str]) -> str:
    return f"{Path(folder).name}: " + "; ".join(problems)


def newest_intact_checkpoint(root: Path, *, hashes: bool = True, notice=None) -> Path | None:
    """The newest complete checkpoint under `root` that passes `checkpoint_problems`; each one
    skipped on the way is reported through `notice(message)`."""
    for folder in reversed(complete_checkpoints(root)):
        problems = checkpoint_problems(folder, hashes=hashes)
        if not problems:
            return folder
        if notice is not None:
            notice(f"skipping damaged checkpoint {folder}: " + "; ".join(problems))
    return None


def prelaunch_problem(source: Path) -> str | None:
    """Before launch (sizes and the metadata pickle only; the ranks also compare checksums):
    why no checkpoint of `source` (a step folder, or a run dir / checkpoint root) can be
    loaded, or None. Skipped damaged ones are named in the answer only when none is left."""
    source = Path(source)
    if checkpoint_step(source) is not None:
        problems = checkpoint_problems(source, hashes=False)
        return describe(source, problems) if problems else None
    root = source / CHECKPOINTS_DIR if (source / CHECKPOINTS_DIR).is_dir() else source
    skipped: list[str] = []
    found = newest_intact_checkpoint(root, hashes=False, notice=skipped.append)
    if found is None and skipped:
        return "no intact checkpoint left: " + " | ".join(skipped)
    return None


__all__ = ["AllowListUnpickler", "prelaunch_problem", "DCP_METADATA_GLOBALS", "HASH_NAME", "MANIFEST_KEY", "UnsafeCheckpoint",
           "allowed_global", "checkpoint_problems", "checkpoint_step", "describe", "file_digest",
           "newest_intact_checkpoint", "read_manifest", "scan_dcp_metadata"]
