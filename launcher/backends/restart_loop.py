"""training.max_restarts on this machine: the launcher starts torchrun again after a failed leg.

Why a loop here and not torchrun's --max-restarts: the launcher sees each leg end, so it can
restart only from a complete checkpoint, record each restart as a leg in resumes.jsonl, stop
when the same failure comes back at the same step (conf/run_dir/restart_legs.py), treat a hang
the watchdog ended like any failed leg, and leave alone a run the loop stopped on purpose (a
non-finite loss). torchrun restarts blindly (also from step 0, also a deterministic bug) and
records nothing. The first leg may use the warm agent (one-shot); restarts start torchrun cold.
"""
from __future__ import annotations

import contextlib
import sys
from pathlib import Path
from typing import Callable

from conf.run_dir.paths import RunDir
from conf.run_dir.restart_legs import (SAME_FAILURE, Failure, failure_of, record_refusal,
                                       record_restart, restart_refusal)
from launcher.backends.run_lock import RunLock, acquire_run_lock

ENDED_ON_PURPOSE = (0, 130)
"""Exit statuses that are no failure: done, paused or stopped; Ctrl-C."""


def launch_with_restarts(run_dir: Path, *, max_restarts: int, lock: RunLock | None,
                         launch_leg: Callable[[RunLock, bool], int]) -> int:
    """Run `launch_leg(lock, first)` until a leg ends on purpose or may not restart; return
    the last leg's exit status. `lock` (or one taken here) is held across every leg."""
    with contextlib.ExitStack() as stack:
        if lock is None:
            lock = stack.enter_context(acquire_run_lock(run_dir, action="run"))
        log_from = _log_size(run_dir)
        status = launch_leg(lock, True)
        while status not in ENDED_ON_PURPOSE and max_restarts > 0:
            if not _restart_recorded(run_dir, status, max_restarts=max_restarts,
                                     log_from=log_from):
                break
            log_from = _log_size(run_dir)
            status = launch_leg(lock, False)
        return status


def _log_size(run_dir: Path) -> int:
    """Where the next leg's torchrun output will begin in logs/torchrun.log."""
    try:
        return RunDir(run_dir).torchrun_log.stat().st_size
    except OSError:
        return 0


def _restart_recorded(run_dir: Path, status: int, *, max_restarts: int, log_from: int) -> bool:
    """Decide after a failed leg; say the decision in one line; record the restart leg."""
    return restart_decided(run_dir, failure_of(run_dir, status, torchrun_log_from=log_from),
                           max_restarts=max_restarts)


def restart_decided(run_dir: Path, failure: Failure, *, max_restarts: int) -> bool:
    """Whether the run restarts after `failure`; says the decision in one line on stderr and
    records the restart leg (the local loop, and node 0's agent on cluster=nodes)."""
    reason = restart_refusal(run_dir, failure, max_restarts=max_restarts)
    if reason is not None:
        if reason.startswith(SAME_FAILURE):  # the failure report then says it, once
            record_refusal(run_dir, failure, reason)
        else:
            sys.stderr.write(f"not restarting {run_dir}: {reason}\n")
        return False
    number = record_restart(run_dir, failure)
    latest = RunDir(run_dir).latest_checkpoint()
    sys.stderr.write(f"restart {number}/{max_restarts} of {run_dir} after {failure.cause} at "
                     f"step {failure.step}: from checkpoint {latest.name}\n")
    return True
