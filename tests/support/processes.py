"""Live processes, read from /proc (stdlib only: the Slurm test cluster imports it too)."""
from __future__ import annotations

import os
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
