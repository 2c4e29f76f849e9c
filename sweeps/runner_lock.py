"""One runner per sweep dir: `meshrun sweep` and `sweep retry` hold `<sweep_dir>/runner.lock`.

The lock is `flock(2)`, as a run dir's launcher.lock is (launcher.backends.run_lock): the kernel
drops it when the runner's last descriptor goes, so a runner that is SIGKILLed never leaves a
lock that looks held, and a recycled pid can never pass for a live runner. The check ("is a
runner alive?") and the record of the new runner are one step: whoever gets the flock is the
runner, a second one is refused (exit 2) with the holder's pid and host, which the file records
(host, pid, start time, command) while the lock is held and is emptied on release.

The descriptor is close-on-exec and never handed to the points: a point process that outlives
its runner while it stops its ranks holds its own run dir's lock, and that is what sweep status
and retry look at for the point.
"""
from __future__ import annotations

import sys
import time
from pathlib import Path

from conf.errors import ConfigError, Problem
from launcher.backends.run_lock import (flock_holder, release_flock, try_flock,
                                        write_lock_record)

RUNNER_LOCK_FILE = "runner.lock"


class SweepLock:
    """A held sweep-dir lock; released by `release()` (or when this process dies)."""

    def __init__(self, path: Path, fd: int) -> None:
        self.path, self.fd = path, fd

    def release(self) -> None:
        if self.fd < 0:
            return
        release_flock(self.fd)
        self.fd = -1

    def __enter__(self) -> SweepLock:
        return self

    def __exit__(self, *exc) -> None:
        self.release()


def acquire_sweep_lock(sweep_dir: Path, *, action: str = "sweep") -> SweepLock:
    """Become the runner of `sweep_dir`, or raise ConfigError naming the live runner."""
    sweep_dir = Path(sweep_dir)
    sweep_dir.mkdir(parents=True, exist_ok=True)
    path = sweep_dir / RUNNER_LOCK_FILE
    fd, holder = try_flock(path)
    if fd is None:
        holder = _holder_record(path, holder)
        raise ConfigError([Problem(
            "sweep_dir", str(sweep_dir),
            f"is in use by a running sweep (pid {holder.get('pid', '?')} on "
            f"{holder.get('host', '?')}, since {holder.get('started', '?')})",
            f"wait for it, or stop it first (kill {holder.get('pid', '<pid>')})")],
            f"Cannot {action}") from None
    write_lock_record(fd, command=sys.argv)
    return SweepLock(path, fd)


HOLDER_RECORD_WAIT_S = 2.0
"""A runner writes its record just after it takes the lock: a refusal waits this long for it
(two `sweep retry` started together: the loser read an empty record, "pid ? on ?")."""


def _holder_record(path: Path, holder: dict | None) -> dict:
    """The lock holder's record, waiting briefly for a holder that has not written it yet."""
    deadline = time.monotonic() + HOLDER_RECORD_WAIT_S
    while not (holder or {}).get("pid") and time.monotonic() < deadline:
        time.sleep(0.05)
        holder = flock_holder(path)
        if holder is None:  # released meanwhile: nothing more to learn
            break
    return holder or {}


def sweep_runner(sweep_dir: Path) -> dict | None:
    """The live runner of `sweep_dir` (its record; {} when unreadable), or None when no process
    holds the lock."""
    return flock_holder(Path(sweep_dir) / RUNNER_LOCK_FILE)
