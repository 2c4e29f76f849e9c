"""Automatic restarts (training.max_restarts), torch-free: what a failure was, whether the run
may restart after it, and the leg each restart adds to resumes.jsonl.

A restart leg is a resumes.jsonl row like a `meshrun resume` leg (time, overrides [], the
effective overrides the newest leg ran with) plus `"restart": n` (its number since the last
leg a person started) and `"after"`: the failure it follows, `{"step": S, "cause": "..."}`.
The run restarts when a complete checkpoint exists, fewer than max_restarts restart legs
follow the last leg a person started, and no restart since then followed the same failure:
the same cause at the same step twice is a bug, not a fault, and restarting again would only
repeat it.
"""
from __future__ import annotations

import json
import time
from dataclasses import asdict, dataclass
from pathlib import Path

from conf.run_dir.checkpoint_dirs import checkpoint_step
from conf.run_dir.failure_diagnosis import ROOT_CAUSE, first_failure
from conf.run_dir.metrics_rows import FAILED_EVENT
from conf.run_dir.paths import RunDir

RESTART_KEY = "restart"
"""The key that marks a resumes.jsonl row as an automatic restart (its number)."""
REPEATED_FAILURE_REASON = "same failure twice"
SAME_FAILURE = "the same failure"
"""How restart_refusal's line for a repeated failure begins."""
"""The reason of the "failed" event written when restarts stop on a repeated failure."""


@dataclass(frozen=True)
class Failure:
    """One failed leg: the step the run had reached and what failed."""

    step: int
    """The newest step the run reached (its last train row, or its newest checkpoint)."""
    cause: str
    """"rank R exit code C" / "rank R killed by SIGKILL" (torchrun's first failure), else the
    launcher's exit status ("exit status N")."""


def failure_of(run_dir: Path, exit_status: int | None, *, torchrun_log_from: int = 0,
               log: Path | None = None) -> Failure:
    """The failure a leg that ended with `exit_status` left in its run dir (None: a rank
    failed where no launcher sees an exit status: a Slurm task). torchrun's error summary
    names the rank only when the leg wrote one (after byte `torchrun_log_from` of its log,
    where the leg began): an older leg's summary says nothing of this one. `log`: a node's
    own torchrun log (cluster=nodes) instead of the run's."""
    log = log or RunDir(run_dir).torchrun_log
    first = first_failure(run_dir, log) if _wrote_summary(log, torchrun_log_from) else None
    if first is None:
        cause = "a rank failed" if exit_status is None else f"exit status {exit_status}"
    else:
        rank, code, sig = first
        cause = (f"rank {rank} killed by {sig or f'signal {-code}'}" if code < 0
                 else f"rank {rank} exit code {code}")
    return Failure(step=reached_step(run_dir), cause=cause)


def reached_step(run_dir: Path) -> int:
    """The newest step the run reached: its last train row, or its newest checkpoint."""
    rd = RunDir(run_dir)
    steps = [r.get("step", 0) for r in rd.read_rows() if r.get("kind") == "train"]
    latest = rd.latest_checkpoint()
    return max(steps + [checkpoint_step(latest) if latest is not None else 0])


def _wrote_summary(path: Path, since: int) -> bool:
    try:
        with open(path, "rb") as log:
            log.seek(since)
            return ROOT_CAUSE.encode() in log.read()
    except OSError:
        return False


def current_restarts(run_dir: Path) -> list[dict]:
    """The restart legs since the last leg a person started (run or resume), oldest first."""
    legs = RunDir(run_dir).read_resumes()
    streak: list[dict] = []
    for leg in legs:
        streak = streak + [leg] if RESTART_KEY in leg else []
    return streak


def restart_refusal(run_dir: Path, failure: Failure, *, max_restarts: int) -> str | None:
    """Why the run must not restart after `failure` (one line), or None: it may."""
    rd = RunDir(run_dir)
    if max_restarts <= 0:
        return "training.max_restarts=0"
    stopped = [r for r in rd.read_rows() if r.get("event") == FAILED_EVENT]
    if stopped and stopped[-1].get("step", -1) >= failure.step:
        return "the run stopped itself (" + str(stopped[-1].get("reason", "failed")) + ")"
    streak = current_restarts(run_dir)
    for leg in streak:
        if leg.get("after") == asdict(failure):
            return (f"{SAME_FAILURE} ({failure.cause}) at the same step ({failure.step}) "
                    f"twice: a bug, not a fault; not restarting again (restart "
                    f"{leg[RESTART_KEY]} followed it too)")
    if len(streak) >= max_restarts:
        return f"out of restarts (training.max_restarts={max_restarts})"
    if rd.latest_checkpoint() is None:
        return "no complete checkpoint to restart from"
    return None


def record_refusal(run_dir: Path, failure: Failure, reason: str) -> None:
    """A repeated failure stops the run: say so where `meshrun status` reads why a run failed
    (a "failed" event in metrics.jsonl; no rank is running to write it)."""
    said = [r for r in RunDir(run_dir).read_rows() if r.get("event") == FAILED_EVENT]
    if said and said[-1].get("reason") == REPEATED_FAILURE_REASON:
        return  # another rank (or torchrun's next try) said it already
    row = {"kind": "event", "event": FAILED_EVENT, "step": failure.step, "time": time.time(),
           "reason": REPEATED_FAILURE_REASON, "message": f"not restarted: {reason}"}
    with RunDir(run_dir).metrics_file.open("a") as out:
        out.write(json.dumps(row) + "\n")


def record_restart(run_dir: Path, failure: Failure, **where: str) -> int:
    """Append the restart leg that follows `failure` (`where`: e.g. the Slurm job id); return
    its number."""
    rd = RunDir(run_dir)
    number = len(current_restarts(run_dir)) + 1
    rd.append_resume(time=time.strftime("%Y-%m-%dT%H:%M:%S"), overrides=[],
                     effective=rd.leg_overrides(),
                     extra={RESTART_KEY: number, "after": asdict(failure), **where})
    return number
