"""Kill a process at its n-th filesystem write under a folder: real files, real SIGKILL.

    total = count_writes(fn, root)          # how many writes `fn` makes under root
    for n in range(1, total + 1):
        kill_at_write(fn, root, n)          # fn runs in a forked child, SIGKILLed before write n

The child is a fork of the caller (nothing re-imported, no spawn cost); a Python audit hook
(sys.addaudithook, installed only in the child) counts each file open, mkdir, rename,
remove, rmdir, rmtree and chmod whose path lies under `root`, and the child SIGKILLs itself
just before the n-th. Writes made inside native code (safetensors' Rust writer) are not
events: a kill lands before or after them, never inside one.
"""
from __future__ import annotations

import os
import signal
import sys
from pathlib import Path
from typing import Callable

WRITE_EVENTS = {"open", "os.mkdir", "os.rename", "os.remove", "os.rmdir", "shutil.rmtree",
                "os.chmod", "os.truncate", "os.link", "os.symlink"}


def _under(value, root: str) -> bool:
    if isinstance(value, bytes):
        value = os.fsdecode(value)
    if not isinstance(value, (str, os.PathLike)):
        return False
    return os.path.abspath(os.fspath(value)).startswith(root)


def _run_child(fn: Callable[[], None], root: Path, *, kill_at: int, count_file: Path) -> None:
    import torch

    torch.set_num_threads(1)  # forked from a process whose thread pool may be in use
    seen = [0]
    root_text = os.path.abspath(root)

    def hook(event: str, args: tuple) -> None:
        if event in WRITE_EVENTS and args and _under(args[0], root_text):
            seen[0] += 1
            if seen[0] == kill_at:
                os.kill(os.getpid(), signal.SIGKILL)

    sys.addaudithook(hook)
    fn()
    count_file.write_text(str(seen[0]))


def _fork(fn: Callable[[], None], root: Path, *, kill_at: int, count_file: Path) -> int:
    """Run in a forked child; return its wait status decoded: -signal or exit code."""
    pid = os.fork()
    if pid == 0:  # the child: never returns into pytest
        code = 0
        try:
            _run_child(fn, root, kill_at=kill_at, count_file=count_file)
        except BaseException:  # noqa: BLE001 - reported through the exit code
            import traceback
            traceback.print_exc()
            code = 3
        os._exit(code)
    _, status = os.waitpid(pid, 0)
    return -os.WTERMSIG(status) if os.WIFSIGNALED(status) else os.WEXITSTATUS(status)


def count_writes(fn: Callable[[], None], root: Path, *, scratch: Path) -> int:
    """Run `fn` to the end in a child; the number of write events it made under `root`."""
    count_file = Path(scratch) / "write_count"
    status = _fork(fn, root, kill_at=-1, count_file=count_file)
    assert status == 0, f"the uninterrupted run failed (status {status})"
    return int(count_file.read_text())


def kill_at_write(fn: Callable[[], None], root: Path, n: int, *, scratch: Path) -> None:
    """Run `fn` in a child SIGKILLed just before its n-th write under `root`."""
    status = _fork(fn, root, kill_at=n, count_file=Path(scratch) / "unused_count")
    assert status == -signal.SIGKILL, f"write {n}: the child was not killed (status {status})"
