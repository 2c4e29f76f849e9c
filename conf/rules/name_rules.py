"""Rules on names and paths that otherwise fail only after launch: W&B names (wandb refuses
them in every rank's `wandb.init`), the run dir's name (the filesystem's name limit) and
folders that are files. Each adds Problems; none raises."""
from __future__ import annotations

import os
from pathlib import Path

from conf.errors import ProblemList
from conf.run_dir.paths import safe_name
from conf.schema import LoggingConfig, RunConfig

WANDB_TAG_MAX = 64
"""wandb: "Tags must be between 1 and 64 characters" (wandb_settings.validate_tags)."""
WANDB_NAME_MAX = 128
"""wandb: a project name may not exceed 128 characters; groups and entities are held to it."""
WANDB_FORBIDDEN = "/\\#?%:"
"""wandb: characters a project name cannot contain (wandb_settings.validate_project)."""

NAME_MAX_BYTES = 255
"""The longest file or folder name (in bytes) of common filesystems (ext4, xfs, btrfs, NFS)."""
RUN_DIR_SUFFIX_BYTES = len("-20260101-120000") + len("-99") + len("..abcdefgh.tmp")
"""What the launcher adds to the run name: the timestamp, a clash suffix, and the private
temporary folder's prefix and suffix the run dir is written in before its rename."""


def check_wandb(lg: LoggingConfig, problems: ProblemList) -> None:
    """Names wandb.init would refuse in every rank, after launch."""
    for key, value, may_be_empty in (("logging.wandb_project", lg.wandb_project, False),
                                     ("logging.wandb_entity", lg.wandb_entity, True),
                                     ("logging.wandb_group", lg.wandb_group, True)):
        _check_wandb_name(key, value, may_be_empty, problems)
    for i, tag in enumerate(lg.wandb_tags):
        if not isinstance(tag, str):
            continue  # reported by rules.typed_lists
        if not 1 <= len(tag) <= WANDB_TAG_MAX:
            problems.add(f"logging.wandb_tags[{i}]", repr(tag),
                         f"is {len(tag)} characters; W&B tags must be 1 to {WANDB_TAG_MAX}",
                         f"shorten it to at most {WANDB_TAG_MAX} characters"
                         if tag else "remove the empty tag")


def _check_wandb_name(key: str, value: str, may_be_empty: bool, problems: ProblemList) -> None:
    if not value.strip():
        if value or not may_be_empty:
            problems.add(key, repr(value), "must not be empty or blank" if not may_be_empty
                         else "must not be only whitespace", "give a name, e.g. meshrun"
                         if not may_be_empty else "give a name, or leave it empty")
        return
    bad = sorted({c for c in value if c in WANDB_FORBIDDEN})
    if bad:
        problems.add(key, repr(value),
                     f"W&B refuses the character(s) {' '.join(bad)} here "
                     f"(forbidden: {WANDB_FORBIDDEN})",
                     "use letters, digits, - and _ (a project is named by the entity; "
                     "set logging.wandb_entity for the team)")
    if len(value) > WANDB_NAME_MAX:
        problems.add(key, f"{value[:20]}... ({len(value)} characters)",
                     f"W&B names are at most {WANDB_NAME_MAX} characters",
                     f"shorten it to at most {WANDB_NAME_MAX}")


def check_paths(cfg: RunConfig, problems: ProblemList, *, check_paths: bool) -> None:
    """The run dir's name fits the filesystem; the folders meshrun creates are not files."""
    stem = safe_name(cfg.name)
    room = NAME_MAX_BYTES - RUN_DIR_SUFFIX_BYTES
    if not stem:
        problems.add("name", "''", "must not be empty (it names the run dir)", "e.g. name=run")
    elif len(stem.encode()) > room:
        problems.add("name", f"{cfg.name[:24]}... ({len(cfg.name)} characters)",
                     f"the run dir name <name>-<timestamp> would exceed the filesystem's "
                     f"{NAME_MAX_BYTES}-byte limit on a file name",
                     f"shorten the name to at most {room} characters")
    if not check_paths:
        return
    for key, value in (("runs_dir", cfg.runs_dir), ("data.cache_dir", cfg.data.cache_dir)):
        _check_folder(key, value, problems)


def _check_folder(key: str, value: str, problems: ProblemList) -> None:
    """`value` is, or can become, a folder: neither it nor a parent is an existing file."""
    path = Path(os.path.expanduser(value or "."))
    for p in (path, *path.parents):
        if p.exists() and not p.is_dir():
            where = "is an existing file" if p == path else f"lies under {p}, which is a file"
            problems.add(key, value, f"must be a folder, and {where}",
                         "give a folder path (it is created if missing)")
            return
        if p.is_dir():
            _check_writable_folder(key, value, p, problems)
            return


PSEUDO_FILESYSTEMS = frozenset({
    "proc", "sysfs", "devtmpfs", "devpts", "cgroup", "cgroup2", "debugfs", "securityfs",
    "tracefs", "configfs", "pstore", "bpf", "mqueue", "hugetlbfs", "fusectl", "autofs",
    "binfmt_misc", "efivarfs"})
"""Kernel file systems: they hold no files of ours (a mkdir there fails, even as root)."""


def _check_writable_folder(key: str, value: str, existing: Path, problems: ProblemList) -> None:
    """The nearest existing folder of `value` can take new folders: writable, on a real fs."""
    fs = _filesystem_type(existing)
    if fs in PSEUDO_FILESYSTEMS:
        problems.add(key, value, f"lies on the kernel's {fs} file system ({existing}), which "
                     "cannot hold files", "give a folder on a disk, e.g. ./runs")
    elif not os.access(existing, os.W_OK | os.X_OK):
        problems.add(key, value, f"cannot be created or written: {existing} is not writable "
                     "by this user", "give a folder you can write, e.g. ./runs")


def _filesystem_type(path: Path) -> str:
    """The type of the file system holding `path` (Linux /proc/self/mounts; '' elsewhere)."""
    try:
        lines = Path("/proc/self/mounts").read_text().splitlines()
    except OSError:
        return ""
    resolved, best, fs = str(path.resolve()), "", ""
    for line in lines:
        parts = line.split()
        if len(parts) < 3:
            continue
        mount = parts[1].replace("\\040", " ")
        inside = resolved == mount or resolved.startswith(mount.rstrip("/") + "/")
        if inside and len(mount) >= len(best):
            best, fs = mount, parts[2]
    return fs
