"""Live processes, read from /proc, and waiting for a condition (stdlib only: the Slurm test
cluster imports it too)."""
from __future__ import annotations

import os
import time
from pathlib import Path


def _state_and_parent(stat_text: str) -> tuple[str, int]:
    """(state letter, parent pid) from a /proc/<pid>/stat line (the name may hold spaces)."""
    state, parent = stat_text.rsplit(")", 1)[1].split()[:2]
    return state, int(parent)


def pid_alive(pid: int) -> bool:
    """True while `pid` runs; a zombie (not reaped by its parent) counts as gone."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    try:
        return _state_and_parent(Path(f"/proc/{pid}/stat").read_text())[0] != "Z"
    except OSError:
        return False


def descendants(root: int) -> list[int]:
    """Live processes below `root` (children, theirs, ...), from the parent pids in /proc."""
    children: dict[int, list[int]] = {}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            state, parent = _state_and_parent(stat.read_text())
        except (OSError, IndexError, ValueError):
            continue
        if state != "Z":
            children.setdefault(parent, []).append(int(stat.parent.name))
    found, todo = [], [root]
    while todo:
        below = children.get(todo.pop(), [])
        found += below
        todo += below
    return found


def survivors(marker: str) -> list[str]:
    """Command lines of live processes (not zombies) that mention `marker`."""
    found = []
    for proc in Path("/proc").glob("[0-9]*"):
        try:
            cmdline = (proc / "cmdline").read_bytes().replace(b"\0", b" ").decode()
        except OSError:
            continue
        if marker in cmdline and int(proc.name) != os.getpid():
            found.append(f"{proc.name}: {cmdline}")
    return found


def wait_for(predicate, timeout_s: float, what: str, every_s: float = 0.2):
    """Poll `predicate` every `every_s` (a file check: 0.2 s; a `meshrun status` call, which
    starts an interpreter, every 1 s); return its first true value, or fail after `timeout_s`."""
    end = time.monotonic() + timeout_s
    while time.monotonic() < end:
        value = predicate()
        if value:
            return value
        time.sleep(every_s)
    raise AssertionError(f"timed out after {timeout_s}s waiting for {what}")
