"""Who owns a hidden staging folder `.meshrun-<out>-*` beside a `meshrun data` --out.

`train-tokenizer` and `prepare-sft` build their output in such a folder and rename it into
place (launcher/data/output_dir.staged_dir). A process killed with SIGKILL cannot remove it, so
the folder holds OWNER_FILE, flock-ed (exclusive) by the building process for as long as it
lives and naming the --out, the command, the pid and the host. The kernel drops the lock when
the process dies, however it dies: the next call of the same command for the same --out
removes every sibling whose lock it can take and whose owner file names that --out and
command. A folder without an owner file (the `-old-` folder of an interrupted rename, a
folder another tool made) or with a held lock is never touched.
"""
from __future__ import annotations

import fcntl
import glob
import json
import os
import shutil
import socket
from pathlib import Path

OWNER_FILE = ".meshrun-stage-owner.json"


def claim_stage(stage: Path, *, out: Path, command: str) -> int:
    """Lock `stage`'s owner file for this process (blocking: a cleaner holds it only for a
    moment) and record the owner; the open descriptor, which keeps the lock until closed."""
    fd = os.open(stage / OWNER_FILE, os.O_CREAT | os.O_WRONLY | os.O_TRUNC, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        os.write(fd, json.dumps({"out": out.name, "command": command, "pid": os.getpid(),
                                 "host": socket.gethostname()}).encode() + b"\n")
    except BaseException:
        os.close(fd)
        raise
    return fd


def release_stage(stage: Path) -> None:
    """Remove the owner file before the stage is renamed to --out (the lock stays held by the
    open descriptor until the rename is done)."""
    (stage / OWNER_FILE).unlink(missing_ok=True)


def remove_stale_stages(out: Path, *, command: str) -> list[Path]:
    """Remove the staging folders of `command` for `out` whose owner is dead; the removed."""
    parent = out.absolute().parent
    removed = []
    for sibling in sorted(parent.glob(f".meshrun-{glob.escape(out.name)}-*")):
        if sibling.is_dir() and not sibling.is_symlink() and _dead_owner(sibling, out, command):
            shutil.rmtree(sibling, ignore_errors=True)
            removed.append(sibling)
    return removed


def _dead_owner(stage: Path, out: Path, command: str) -> bool:
    """Whether `stage` is `command`'s for `out` and no live process holds its lock."""
    try:
        fd = os.open(stage / OWNER_FILE, os.O_RDONLY | os.O_NOFOLLOW)
    except OSError:
        return False
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            return False  # held: its owner is alive
        try:
            record = json.loads(os.read(fd, 1 << 16) or b"null")
        except ValueError:
            return False
        return isinstance(record, dict) and record.get("out") == out.name \
            and record.get("command") == command
    finally:
        os.close(fd)
