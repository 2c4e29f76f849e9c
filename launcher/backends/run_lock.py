"""One launcher per run dir: `meshrun run`/`resume` hold the run dir's lock file while they drive it.

The lock is `flock(2)` on `<run_dir>/launcher.lock` (the name is `conf.run_dir`'s), not an O_EXCL
file plus a pid check: the kernel drops a flock when the last descriptor of its open file goes,
so a launcher that crashes or is SIGKILLed can never leave a lock that looks held, and there is no
window between "is its pid alive?" and "take it over" for two newcomers to race through. The
descriptor is handed on to torchrun, so a launcher's torchrun that is still stopping its ranks
keeps the run dir locked until it has exited.

The file also records who holds it (host, pid, start time, command), for the refusal message and
for stale-lock detection: a release empties the file, so a free lock whose file still names a
holder was left by a crash. On this host that holder is gone (the flock is free), and the newcomer
takes over with a notice. A record from another host is refused: whether that host's flock is
visible here depends on the file system, and only a person can tell that its launcher is gone.
"""
from __future__ import annotations

import fcntl
import json
import os
import signal
import socket
import sys
import time
from pathlib import Path

from conf.errors import ConfigError, Problem
from conf.run_dir.paths import RunDir


class RunLock:
    """A held run-dir lock; `fd` stays open (and the lock held) until `release()`."""

    def __init__(self, path: Path, fd: int) -> None:
        self.path, self.fd = path, fd

    def release(self) -> None:
        if self.fd < 0:
            return
        release_flock(self.fd)
        self.fd = -1

    def __enter__(self) -> "RunLock":
        return self

    def __exit__(self, *exc) -> None:
        self.release()


def acquire_run_lock(run_dir: Path, *, action: str) -> RunLock:
    """Lock `run_dir` for this process or raise ConfigError naming the live holder."""
    path = RunDir(run_dir).lock_file
    fd, record = try_flock(path)
    if fd is None:
        raise ConfigError([_held_problem(run_dir, path, record, action)],
                          f"Cannot {action}") from None
    try:
        _check_previous(run_dir, path, record, action)
        write_lock_record(fd, command=sys.argv)
        os.fsync(fd)
    except BaseException:
        fcntl.flock(fd, fcntl.LOCK_UN)
        os.close(fd)
        raise
    return RunLock(path, fd)


def _check_previous(run_dir: Path, path: Path, previous: dict | None, action: str) -> None:
    """A free lock whose file still names a holder: its launcher crashed (or was killed)."""
    if not previous:
        return
    host, pid = previous.get("host", "?"), previous.get("pid", "?")
    if host != socket.gethostname():
        raise ConfigError([Problem(
            "run_dir", str(run_dir),
            f"was last locked by meshrun pid {pid} on host {host} (since "
            f"{previous.get('started', '?')}); its lock is not visible from this host",
            f"if no meshrun on {host} drives this run any more, delete {path} and retry")],
            f"Cannot {action}")
    state = "has exited" if not pid_alive(pid) else "no longer holds it (pid reused?)"
    sys.stderr.write(f"notice: taking over the stale lock {path}: meshrun pid {pid} on this "
                     f"host (since {previous.get('started', '?')}) {state}; "
                     "its run was not stopped cleanly\n")


def _held_problem(run_dir: Path, path: Path, holder: dict | None, action: str) -> Problem:
    holder = holder or {}
    pid, host = holder.get("pid", "?"), holder.get("host", "?")
    who = f"meshrun pid {pid} on host {host} since {holder.get('started', '?')}"
    if holder.get("command"):
        who += f" ({' '.join(map(str, holder['command']))})"
    if host == socket.gethostname() and isinstance(pid, int) and not pid_alive(pid):
        who += "; that launcher has exited and its torchrun is still stopping the ranks"
    return Problem("run_dir", str(run_dir), f"is in use by {who}",
                   f"wait for it to end (or stop it: kill {pid}), then {action} again")


def try_flock(path: Path) -> tuple[int | None, dict | None]:
    """Open `path` (made if missing) and take its flock without waiting: (the descriptor, the
    record the file still holds) when taken; (None, the holder's record) when it is held."""
    fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        holder = read_lock_record(fd)
        os.close(fd)
        return None, holder
    return fd, read_lock_record(fd)


def write_lock_record(fd: int, **extra) -> dict:
    """Record this process as the holder (host, pid, start time, and `extra`)."""
    record = {"host": socket.gethostname(), "pid": os.getpid(),
              "started": time.strftime("%Y-%m-%dT%H:%M:%S%z"), **extra}
    os.ftruncate(fd, 0)
    os.pwrite(fd, (json.dumps(record) + "\n").encode(), 0)
    return record


def release_flock(fd: int) -> None:
    """Empty the record first (a later taker sees a clean release), unlock, close."""
    os.ftruncate(fd, 0)
    fcntl.flock(fd, fcntl.LOCK_UN)
    os.close(fd)


def read_lock_record(fd: int) -> dict | None:
    size = os.fstat(fd).st_size
    if size == 0:
        return None
    try:
        record = json.loads(os.pread(fd, size, 0).decode(errors="replace"))
    except ValueError:
        return {"pid": "?", "host": "?", "started": "? (unreadable lock file)"}
    return record if isinstance(record, dict) else None


def pid_alive(pid) -> bool:
    if not isinstance(pid, int) or pid <= 0:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def lock_holder(run_dir: Path) -> dict | None:
    """Who holds `run_dir`'s lock now (its record), or None when nobody does."""
    return flock_holder(RunDir(run_dir).lock_file)


def flock_holder(path: Path) -> dict | None:
    """Who holds the flock on the lock file `path` now (the record it wrote; {} when
    unreadable), or None when nobody does (a free lock: its last holder is gone)."""
    path = Path(path)
    if not path.is_file():
        return None
    fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
        except BlockingIOError:
            return read_lock_record(fd) or {}
        fcntl.flock(fd, fcntl.LOCK_UN)
        return None
    finally:
        os.close(fd)


def stop_lock_holder(run_dir: Path) -> str:
    """SIGTERM to the launcher that holds `run_dir` on this host: as Ctrl-C, its ranks
    checkpoint and stop. ConfigError when nobody holds it, or a launcher on another host."""
    holder = lock_holder(run_dir)
    if holder is None:
        raise ConfigError([Problem("run_dir", str(run_dir), "is not running (no launcher holds "
                                   "its lock)", "nothing to stop")], "Cannot stop")
    pid, host = holder.get("pid", "?"), holder.get("host", "?")
    if host != socket.gethostname() or not pid_alive(pid):
        raise ConfigError([Problem("run_dir", str(run_dir),
                                   f"is driven by meshrun pid {pid} on host {host}",
                                   f"stop it there: kill {pid}")], "Cannot stop")
    os.kill(pid, signal.SIGTERM)
    return f"asked meshrun pid {pid} to stop {run_dir} (its ranks checkpoint first)"
