"""A Slurm job's state from sacct (accounting), torch-free; a poll()-able handle for progress."""
from __future__ import annotations

import subprocess
import time
from dataclasses import dataclass

ACTIVE = ("PENDING", "RUNNING", "REQUEUED", "CONFIGURING", "COMPLETING", "SUSPENDED",
          "RESIZING", "REQUEUE_FED", "REQUEUE_HOLD")
POLL_EVERY_S = 2.0


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
