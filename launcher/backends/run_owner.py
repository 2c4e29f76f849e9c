"""Is a locally launched run still owned by a live process? `meshrun status` asks before it
says "running": a run's files say running until its loop writes an end event, so a run whose
launcher and ranks were all killed would otherwise look alive forever.

The owner is whoever holds the run dir's flock (the launcher, then the torchrun it hands the
descriptor to; run_lock.py). The kernel drops a flock with its last holder, so a free lock
means no process of this run is alive on this host.
"""
from __future__ import annotations

import json
import socket
from pathlib import Path

from conf.run_dir.paths import RunDir
from conf.run_dir.run_states import RunState, state_from_files
from launcher.backends.run_lock import lock_holder, pid_alive


def last_lock_record(run_dir: Path) -> dict:
    """The holder record left in launcher.lock ({} when released cleanly or never taken)."""
    try:
        text = RunDir(run_dir).lock_file.read_text()
    except OSError:
        return {}
    try:
        record = json.loads(text) if text.strip() else {}
    except ValueError:
        return {}
    return record if isinstance(record, dict) else {}


def owner_state(run_dir: Path) -> dict:
    """{} while a live process owns the run (or its files already say how it ended); else the
    true state, `failed`, and a note naming the launcher that is gone. A record from another
    host whose lock is not visible here, or no record at all (ranks started by hand from
    `run --prepare-only`, which take no lock), leaves the state as the files say."""
    if state_from_files(run_dir) is not RunState.running or lock_holder(run_dir) is not None:
        return {}
    record = last_lock_record(run_dir)
    host, pid = record.get("host"), record.get("pid")
    if host and host != socket.gethostname():
        return {}
    if not RunDir(run_dir).lock_file.exists():  # ranks started by hand take no lock
        return {}
    if record:
        gone = "has exited" if not pid_alive(pid) else "no longer holds its lock"
        note = (f"no live process owns this run: its launcher (meshrun pid {pid} on {host}) "
                f"{gone} without ending it (killed?); the ranks are gone too")
    else:
        note = "no live process owns this run: its ranks ended without saying how"
    return {"state": RunState.failed, "owner_note": note}
