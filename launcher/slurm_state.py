"""A Slurm job's state from sacct (accounting), torch-free; a poll()-able handle for progress."""
from __future__ import annotations

import subprocess
import time
from dataclasses import dataclass
from pathlib import Path

from conf.rundir import RunDir, RunState, failure_tail, looks_oom

ACTIVE = ("PENDING", "RUNNING", "REQUEUED", "CONFIGURING", "COMPLETING", "SUSPENDED",
          "RESIZING", "REQUEUE_FED", "REQUEUE_HOLD")
POLL_EVERY_S = 2.0
SLURM_STATES = {
    "PENDING": RunState.pending, "REQUEUED": RunState.pending, "CONFIGURING": RunState.pending,
    "REQUEUE_HOLD": RunState.pending, "REQUEUE_FED": RunState.pending,
    "SUSPENDED": RunState.pending, "RUNNING": RunState.running, "COMPLETING": RunState.running,
    "RESIZING": RunState.running, "COMPLETED": RunState.completed, "FAILED": RunState.failed,
    "NODE_FAIL": RunState.failed, "BOOT_FAIL": RunState.failed,
    "OUT_OF_MEMORY": RunState.out_of_memory, "TIMEOUT": RunState.timed_out,
    "DEADLINE": RunState.timed_out, "PREEMPTED": RunState.preempted,
    "CANCELLED": RunState.cancelled, "UNKNOWN": RunState.unknown,
}
"""Slurm's words -> the run states of `conf.rundir` (any other word: failed)."""


@dataclass(frozen=True, slots=True, kw_only=True)
class JobState:
    job_id: str
    state: str
    """Slurm's word: PENDING, RUNNING, COMPLETED, FAILED, TIMEOUT, PREEMPTED, ... or UNKNOWN."""
    exit_code: str
    elapsed: str
    nodes: str

    @property
    def active(self) -> bool:
        return self.state in ACTIVE or self.state == "UNKNOWN"


def job_state(job_id: str) -> JobState:
    """The job's state from sacct; PENDING until accounting has a record of it.

    Slurm 22.05's sacct has no restart count: requeues are counted from the run's events.
    """
    cmd = ["sacct", "-j", job_id, "-X", "-n", "-P", "--format=State,ExitCode,Elapsed,NodeList"]
    try:
        out = subprocess.run(cmd, capture_output=True, text=True, timeout=30)
    except subprocess.TimeoutExpired:
        return JobState(job_id=job_id, state="UNKNOWN", exit_code="", elapsed="", nodes="")
    if out.returncode != 0:
        raise RuntimeError(f"sacct failed for job {job_id}: {out.stderr.strip()} "
                           "(is SLURM_CONF set and accounting (slurmdbd) running?)")
    lines = [line for line in out.stdout.splitlines() if line.strip()]
    if not lines:
        return JobState(job_id=job_id, state="PENDING", exit_code="", elapsed="", nodes="")
    state, exit_code, elapsed, nodes = (lines[-1].split("|") + [""] * 4)[:4]
    return JobState(job_id=job_id, state=state.split()[0], exit_code=exit_code,
                    elapsed=elapsed, nodes=nodes)


def state_from_scheduler(slurm_state: str, run_dir: Path) -> RunState:
    """Slurm's word for a run's job, made exact by the run dir: a job that ended cleanly
    without summary.json stopped early (e.g. out of requeues); a failure whose logs say so ran
    out of memory."""
    state = SLURM_STATES.get(slurm_state, RunState.failed)
    if state is RunState.completed and not RunDir(run_dir).summary_file.exists():
        return RunState.stopped
    if state is RunState.failed and looks_oom(failure_tail(run_dir)):
        return RunState.out_of_memory
    return state


class SlurmJobHandle:
    """Quacks like subprocess.Popen for launcher.progress: poll() is None while active."""

    def __init__(self, job_id: str) -> None:
        self.job_id = job_id
        self.returncode: int | None = None
        self._checked = 0.0

    def poll(self) -> int | None:
        if self.returncode is None and time.monotonic() - self._checked >= POLL_EVERY_S:
            self._checked = time.monotonic()
            state = job_state(self.job_id)
            if not state.active:
                self.returncode = 0 if state.state == "COMPLETED" else 1
        return self.returncode
