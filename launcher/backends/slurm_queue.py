"""Job states without accounting: when sacct fails (no slurmdbd, accounting down, sacct not
installed), ask the controller itself with squeue, which knows queued and running jobs and
those that ended within MinJobAge (5 min by default). A job it no longer lists has ended; its
run dir then says how (launcher.backends.slurm_state.state_from_scheduler)."""
from __future__ import annotations

import subprocess

SQUEUE_TIMEOUT_S = 30
NOT_IN_QUEUE = "NOT_IN_QUEUE"
"""The word for a job squeue no longer lists (without accounting nothing else knows it)."""
UNKNOWN_JOB = "Invalid job id"
"""What squeue says when none of the asked jobs is known to the controller."""


def squeue_command(job_ids: list[str]) -> list[str]:
    """One row per job (array tasks expanded), sacct's columns with an empty ExitCode, every
    state the controller still holds."""
    return ["squeue", "-h", "-r", "-t", "all", "-j", ",".join(job_ids),
            "-o", "%i|%T||%M|%N"]


def squeue_rows(job_ids: list[str]) -> str | None:
    """squeue's rows for `job_ids` ('' when it knows none of them); None when squeue itself
    cannot answer (not installed, no controller, timed out)."""
    try:
        out = subprocess.run(squeue_command(job_ids), capture_output=True, text=True,
                             timeout=SQUEUE_TIMEOUT_S)
    except (OSError, subprocess.TimeoutExpired):
        return None
    if out.returncode != 0:
        return "" if UNKNOWN_JOB in out.stderr else None
    return out.stdout
