"""Prepare the default corpus (this Python's standard library, byte-level) and expand token globs.

Torch-free and numpy-free: the launcher imports this module on the dry-run path.

Layout of a prepared corpus (`<cache_dir>/stdlib-py3.11-<hash>/`):
    train.bin, val.bin   raw uint8 token ids (token id = byte value, vocab 256); the source files
                         are sorted by relative path and joined with SEPARATOR
    manifest.json        source dir, Python version, file and token counts, sha256 of each .bin

Preparation happens once: the folder is built under a temporary name and renamed into place, so
concurrent preparers never see a half-written corpus; whoever loses the rename discards its copy.
"""
from __future__ import annotations

import glob
import hashlib
import json
import os
import platform
import shutil
import sys
import sysconfig
import tempfile
import uuid
from dataclasses import dataclass
from pathlib import Path

from conf.data_contract.stdlib_tokens import STDLIB_TOKEN_DTYPE, STDLIB_VOCAB_SIZE

FORMAT_VERSION = 1
TOKEN_DTYPE = STDLIB_TOKEN_DTYPE
VOCAB_SIZE = STDLIB_VOCAB_SIZE
SEPARATOR = b"\n"
"""Joins consecutive source files (each file usually ends in a newline already)."""
MANIFEST_NAME = "manifest.json"
SPLITS = ("train", "val")
_SKIPPED_DIRS = frozenset({"site-packages", "dist-packages", "__pycache__"})


@dataclass(frozen=True, slots=True, kw_only=True)
class PreparedCorpus:
    directory: Path
    manifest_path: Path
    train_files: tuple[str, ...]
    """Absolute token files for training (one train.bin)."""
    val_files: tuple[str, ...]
    train_source_files: int
    val_source_files: int
    train_tokens: int
    val_tokens: int
    dtype: str = TOKEN_DTYPE
    vocab_size: int = VOCAB_SIZE
    reused: bool
    """True when an existing prepared copy was used."""


def default_stdlib_dir() -> Path:
    """The running Python's standard library folder."""
    return Path(sysconfig.get_paths()["stdlib"]).resolve()


def stdlib_corpus_dir(*, cache_dir: Path, val_every_nth_file: int,
                      source_dir: Path | None = None) -> Path:
    """Where the prepared corpus lives (or would live), without preparing anything."""
    source = Path(source_dir).resolve() if source_dir else default_stdlib_dir()
    key = json.dumps([str(source), val_every_nth_file, FORMAT_VERSION])
    short_hash = hashlib.sha256(key.encode()).hexdigest()[:12]
    version = f"{sys.version_info.major}.{sys.version_info.minor}"
    return Path(cache_dir).expanduser().resolve() / f"stdlib-py{version}-{short_hash}"


def prepare_stdlib_corpus(*, cache_dir: Path, val_every_nth_file: int,
                          source_dir: Path | None = None,
                          verify_checksums: bool = False) -> PreparedCorpus:
    """Prepare (or reuse) the byte-level corpus of `source_dir` (default: the stdlib).

    Reuse checks the manifest, the Python version and the .bin sizes; `verify_checksums` also
    re-hashes the .bin files (about 0.1 s for the 30 MB stdlib corpus).
    """
    if val_every_nth_file < 2:
        raise ValueError(f"data.val_every_nth_file={val_every_nth_file}: must be >= 2 "
                         "(every n-th source file goes to validation, the rest to training)")
    source = Path(source_dir).resolve() if source_dir else default_stdlib_dir()
    target = stdlib_corpus_dir(cache_dir=cache_dir, val_every_nth_file=val_every_nth_file,
                               source_dir=source)
    if _is_valid_corpus(target, verify_checksums=verify_checksums):
        return _corpus_from(target, reused=True)
    target.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f".tmp-{target.name}-", dir=target.parent))
    os.chmod(staging, 0o755)  # mkdtemp makes it private; a shared cache should stay readable
    try:
        _write_corpus(staging, source=source, val_every_nth_file=val_every_nth_file)
        reused = _install(staging, target)
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return _corpus_from(target, reused=reused)


def list_source_files(source_dir: Path) -> list[str]:
    """Relative POSIX paths of the *.py files under `source_dir`, sorted; skips site-packages."""
    found = []
    for root, dirs, files in os.walk(source_dir):
        dirs[:] = [d for d in dirs if d not in _SKIPPED_DIRS]
        rel_root = Path(root).relative_to(source_dir)
        found.extend((rel_root / name).as_posix() for name in files if name.endswith(".py"))
    return sorted(found)


def split_source_files(paths: list[str], *, val_every_nth_file: int) -> dict[str, list[str]]:
    """Every n-th path (the n-th, 2n-th, ...) goes to validation, the rest to training."""
    val = [p for i, p in enumerate(paths) if (i + 1) % val_every_nth_file == 0]
    train = [p for i, p in enumerate(paths) if (i + 1) % val_every_nth_file != 0]
    return {"train": train, "val": val}


def read_manifest(path: Path) -> dict:
    """Load a corpus manifest; ValueError when it is missing, unreadable or another format."""
    try:
        manifest = json.loads(Path(path).read_text())
    except (OSError, json.JSONDecodeError) as error:
        raise ValueError(f"corpus manifest {path}: cannot be read ({error})") from error
    if manifest.get("format_version") != FORMAT_VERSION:
        raise ValueError(f"corpus manifest {path}: format_version "
                         f"{manifest.get('format_version')!r}, expected {FORMAT_VERSION}")
    return manifest


def expand_token_files(pattern: str) -> list[str]:
    """Absolute, sorted token files named by a path, a folder (its *.bin, *.npy) or a glob."""
    if not pattern:
        return []
    expanded = os.path.expanduser(pattern)
    if glob.has_magic(expanded):
        candidates = glob.glob(expanded, recursive=True)
    elif os.path.isdir(expanded):
        candidates = [os.path.join(expanded, name) for name in os.listdir(expanded)
                      if name.endswith((".bin", ".npy"))]
    else:
        candidates = [expanded]
    return sorted(os.path.abspath(p) for p in candidates if os.path.isfile(p))


def _write_corpus(folder: Path, *, source: Path, val_every_nth_file: int) -> None:
    paths = list_source_files(source)
    splits = split_source_files(paths, val_every_nth_file=val_every_nth_file)
    empty = [name for name in SPLITS if not splits[name]]
    if empty:
        raise ValueError(f"corpus from {source}: {len(paths)} *.py files leave no "
                         f"{' or '.join(empty)} files with val_every_nth_file={val_every_nth_file}")
    manifest = {
        "format_version": FORMAT_VERSION,
        "source_dir": str(source),
        "python_version": platform.python_version(),
        "val_every_nth_file": val_every_nth_file,
        "dtype": TOKEN_DTYPE,
        "vocab_size": VOCAB_SIZE,
        "separator": list(SEPARATOR),
        "splits": {name: _write_split(folder / f"{name}.bin", source, splits[name])
                   for name in SPLITS},
    }
    (folder / MANIFEST_NAME).write_text(json.dumps(manifest, indent=2) + "\n")


def _write_split(bin_path: Path, source: Path, rel_paths: list[str]) -> dict:
    digest = hashlib.sha256()
    tokens = 0
    with open(bin_path, "wb") as out:
        for index, rel_path in enumerate(rel_paths):
            chunk = (SEPARATOR if index else b"") + (source / rel_path).read_bytes()
            out.write(chunk)
            digest.update(chunk)
            tokens += len(chunk)
        out.flush()
        os.fsync(out.fileno())
    return {"file": bin_path.name, "source_files": len(rel_paths), "tokens": tokens,
            "bytes": tokens, "sha256": digest.hexdigest()}


def _install(staging: Path, target: Path) -> bool:
    """Rename `staging` to `target`; True when another process's valid copy won instead."""
    for _ in range(3):
        try:
            os.rename(staging, target)
            return False
        except OSError:
            if _is_valid_corpus(target, verify_checksums=False):
                return True  # another process got there first; the caller discards ours
            _move_aside(target)  # stale or broken copy
    raise OSError(f"could not install the prepared corpus at {target}")


def _move_aside(target: Path) -> None:
    aside = target.with_name(f".stale-{target.name}-{uuid.uuid4().hex[:8]}")
    try:
        os.rename(target, aside)
    except OSError:
        return  # someone else moved or replaced it
    shutil.rmtree(aside, ignore_errors=True)


def _is_valid_corpus(folder: Path, *, verify_checksums: bool) -> bool:
    try:
        manifest = read_manifest(folder / MANIFEST_NAME)
    except ValueError:
        return False
    if manifest.get("python_version") != platform.python_version():
        return False  # a patch release changed the stdlib at the same path
    try:
        return all(_is_valid_split(folder, manifest["splits"][name],
                                   verify_checksums=verify_checksums) for name in SPLITS)
    except (KeyError, TypeError):
        return False


def _is_valid_split(folder: Path, split: dict, *, verify_checksums: bool) -> bool:
    bin_path = folder / split["file"]
    if not bin_path.is_file() or bin_path.stat().st_size != split["bytes"]:
        return False
    return not verify_checksums or _sha256_of(bin_path) == split["sha256"]


def _sha256_of(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def _corpus_from(folder: Path, *, reused: bool) -> PreparedCorpus:
    manifest_path = folder / MANIFEST_NAME
    splits = read_manifest(manifest_path)["splits"]
    return PreparedCorpus(
        directory=folder,
        manifest_path=manifest_path,
        train_files=(str(folder / splits["train"]["file"]),),
        val_files=(str(folder / splits["val"]["file"]),),
        train_source_files=splits["train"]["source_files"],
        val_source_files=splits["val"]["source_files"],
        train_tokens=splits["train"]["tokens"],
        val_tokens=splits["val"]["tokens"],
        reused=reused,
    )
