"""Ranks live no longer than their launcher: parent-death signals, the process tree, a dead pipe.

torchrun starts in its own session (so a terminal's Ctrl-C reaches the launcher only, which then
stops the ranks in order), and torchrun starts each rank in a session of its own too; so neither
a process group kill nor the terminal reaches the ranks. Instead:

- torchrun gets PR_SET_PDEATHSIG=SIGTERM: when the launcher dies (SIGKILL, crash), the kernel
  sends torchrun SIGTERM, which it forwards to the ranks; they finish their step, save a
  checkpoint and stop (torchrun SIGKILLs any still alive after its 30 s grace).
- each rank gets PR_SET_PDEATHSIG=SIGKILL from `training.preemption.die_with_parent` when
  `RANK_DIES_WITH_PARENT_ENV` is set: a rank whose torchrun is gone has nobody to report to.
- `kill_tree` SIGKILLs torchrun and every descendant (found through /proc), for a second Ctrl-C.
- `output_gone` tells when the reader of our stdout/stderr pipe has gone (`meshrun run | head`).
"""
from __future__ import annotations

import ctypes
import os
import select
import signal
import sys
from pathlib import Path

PR_SET_PDEATHSIG = 1
RANK_DIES_WITH_PARENT_ENV = "MESHRUN_RANK_DIES_WITH_PARENT"


def parent_death_preexec(sig: int = signal.SIGTERM):
    """A Popen preexec_fn: the child gets `sig` when this process dies (Linux; else a no-op).
    Popen must be called from the main thread (the signal fires when the parent *thread* ends)."""
    parent = os.getpid()
    if not sys.platform.startswith("linux"):
        return None
    libc = ctypes.CDLL(None, use_errno=True)

    def preexec() -> None:
        libc.prctl(PR_SET_PDEATHSIG, int(sig), 0, 0, 0)
        if os.getppid() != parent:  # the launcher died before prctl took effect
            os.kill(os.getpid(), sig)

    return preexec


def descendants(pid: int) -> list[int]:
    """Every live descendant of `pid` (children first), from /proc; empty where there is none."""
    children: dict[int, list[int]] = {}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            text = stat.read_text()
        except OSError:
            continue
        fields = text[text.rfind(")") + 2:].split()
        children.setdefault(int(fields[1]), []).append(int(stat.parent.name))
    found, todo = [], [pid]
    while todo:
        for child in children.get(todo.pop(), []):
            found.append(child)
            todo.append(child)
    return found


def kill_tree(pid: int) -> None:
    """SIGKILL `pid`'s descendants (the ranks, in sessions of their own), then its group."""
    for child in descendants(pid):
        _kill(child, signal.SIGKILL)
    try:
        os.killpg(pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        _kill(pid, signal.SIGKILL)


def _kill(pid: int, sig: int) -> None:
    try:
        os.kill(pid, sig)
    except (ProcessLookupError, PermissionError):
        pass


def output_gone() -> bool:
    """True when stdout or stderr is a pipe whose reader has exited (the next write would
    raise BrokenPipeError). Files and terminals never say so."""
    fds = []
    for stream in (sys.stdout, sys.stderr):
        try:
            fds.append(stream.fileno())
        except (AttributeError, ValueError, OSError):
            continue
    poller = select.poll()
    for fd in fds:
        poller.register(fd, 0)  # POLLERR/POLLHUP are always reported
    return any(event & select.POLLERR for _, event in poller.poll(0))
