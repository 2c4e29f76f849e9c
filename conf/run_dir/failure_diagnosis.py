"""Why a run failed, from its files: which rank failed first (torchrun's error summary), the
log tail worth showing, a full disk, and out-of-memory markers. `meshrun status`, the sweeps
and the run states read failures through here."""
from __future__ import annotations

import os
import re
from pathlib import Path

from conf.run_dir.metrics_rows import FAILED_EVENT
from conf.run_dir.paths import RunDir
from conf.run_dir.disk_space import DISK_FULL_FREE_BYTES, NO_SPACE

_FAILURE_ENTRY = re.compile(
    r"rank\s*:\s*(\d+).*?exitcode\s*:\s*(-?\d+)[^\n]*?(?:\((SIG[A-Z0-9]+)\))?\s*\n", re.S)
ROOT_CAUSE = "Root Cause (first observed failure):"
COLLATERAL_MARKERS = ("connection closed by peer", "connection reset by peer", "broken pipe")
"""A rank whose error says one of these failed because a peer died first (gloo/NCCL)."""
OOM_MARKERS = ("out of memory", "outofmemoryerror", "oom-kill")


def looks_oom(text: str) -> bool:
    low = text.lower()
    return any(marker in low for marker in OOM_MARKERS)


def first_failure(run_dir: Path, log: Path | None = None) -> tuple[int, int, str] | None:
    """The rank that failed first, from torchrun's last error summary: (rank, exit code, signal
    name or ""), or None where there is none. torchrun's "Root Cause (first observed
    failure)" is the earliest timestamp, and a survivor that wrote its error file ("connection
    reset by peer") can be stamped before the agent noticed the peer it lost (a SIGKILLed rank
    leaves no file): such a root cause gives way to a listed failure whose log says no such
    thing. `log`: another torchrun log than the run's (a node's own, cluster=nodes)."""
    rd = RunDir(run_dir)
    log = log or rd.torchrun_log
    if not log.exists():
        return None
    text = log.read_text(errors="replace")
    if ROOT_CAUSE not in text:
        return None
    summary_start = text.rfind("Failures:", 0, text.rfind(ROOT_CAUSE))
    summary = text[summary_start if summary_start >= 0 else text.rfind(ROOT_CAUSE):]
    listed, _, root_part = summary.rpartition(ROOT_CAUSE)
    root = _FAILURE_ENTRY.search(root_part)
    if root is None:
        return None
    entries = [root] + list(_FAILURE_ENTRY.finditer(listed))
    failures = [(int(m.group(1)), int(m.group(2)), m.group(3) or "") for m in entries]
    primary = [f for f in failures if not _peer_death(rd, f[0])]
    return primary[0] if primary else failures[0]


def _peer_death(rd: RunDir, rank: int) -> bool:
    """Does `rank`'s log say it failed because a peer died (COLLATERAL_MARKERS)?"""
    log = rd.rank_log(rank)
    return log.exists() and any(m in log.read_text(errors="replace").lower()
                                for m in COLLATERAL_MARKERS)


def failure_tail(run_dir: Path, lines: int = 30) -> str:
    """The last lines of the most relevant log: the rank torchrun reports as the first failure
    (a SIGKILLed rank's log ends without an error, while its peers' logs hold "connection
    closed by peer" tracebacks); else a rank log whose error is not a peer's death; else any
    rank log with an error; else torchrun's. A run the loop itself stopped (a non-finite
    loss) says why in its "failed" event: that message comes first. A full disk is named
    first (its logs may be cut mid-word), unless the tail already says so."""
    if not Path(run_dir).is_dir():
        return (f"run dir {run_dir} was removed while training: the ranks stopped and recreated "
                "nothing (its logs, metrics and checkpoints went with it)")
    tail = _log_tail(run_dir, lines)
    full = disk_full_note(run_dir)
    return f"{full}\n{tail}" if full and NO_SPACE not in tail else tail


# Below DISK_FULL_FREE_BYTES free on the run dir's filesystem, a failure is a full disk.


def disk_full_note(run_dir: Path) -> str:
    """One line when the run dir's disk is (nearly) full: the logs that would have said so
    may then be cut mid-line or empty. Empty otherwise."""
    try:
        fs = os.statvfs(run_dir)
    except OSError:
        return ""
    free = fs.f_bavail * fs.f_frsize
    if free >= DISK_FULL_FREE_BYTES:
        return ""
    return (f"{NO_SPACE}: the disk holding {run_dir} has {free // 1024} KiB free; logs may be "
            "cut short. Free space there, then: meshrun resume " + str(run_dir))


def _log_tail(run_dir: Path, lines: int) -> str:
    rd = RunDir(run_dir)
    failed = [r for r in rd.read_rows() if r.get("event") == FAILED_EVENT and "message" in r]
    if failed:  # the loop said why it stopped: that is the tail worth showing
        return str(failed[-1]["message"])

    def tail(log: Path, head: str = "") -> str:
        text = log.read_text(errors="replace")
        return f"{head}{log}:\n" + "\n".join(text.splitlines()[-lines:])

    first = first_failure(run_dir)
    if first is not None and rd.rank_log(first[0]).exists():
        rank, code, sig = first
        how = f"killed by {sig or f'signal {-code}'}" if code < 0 else f"exit code {code}"
        return tail(rd.rank_log(rank), f"rank {rank} failed first ({how}, says torchrun); ")
    with_errors = []
    for log in rd.rank_logs():
        text = log.read_text(errors="replace")
        if "Traceback" in text or "Error" in text:
            with_errors.append((any(m in text.lower() for m in COLLATERAL_MARKERS), log))
    if with_errors:
        return tail(min(with_errors, key=lambda item: item[0])[1])
    if rd.torchrun_log.exists():
        return tail(rd.torchrun_log)
    return "(no logs)"
