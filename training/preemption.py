"""Stop requests from signals: Slurm's warning signal, SIGTERM (preemption, Ctrl-C).

The handler only sets a flag. The loop all-reduces the flag after each step, so every rank
finishes the same step, saves the same checkpoint and stops together.
"""
from __future__ import annotations

import logging
import os
import signal
import subprocess
import sys

log = logging.getLogger("meshrun.preemption")


class StopRequest:
    """Set by the warning signal or SIGTERM; read by the loop once per step."""

    def __init__(self) -> None:
        self.signal_name = ""

    def install(self, warning_signal: str) -> None:
        names = {warning_signal.split("@")[0], "TERM"}
        for name in sorted(names):
            signal.signal(getattr(signal, f"SIG{name}"), self._handle)

    def _handle(self, signum: int, frame) -> None:
        self.signal_name = signal.Signals(signum).name
        log.warning("received %s: stopping after this step with a checkpoint", self.signal_name)

    @property
    def requested(self) -> bool:
        return bool(self.signal_name)


def die_with_parent() -> None:
    """SIGKILL this rank when its parent (torchrun) dies: nobody would stop or reap it. Linux
    only (PR_SET_PDEATHSIG); the launcher asks for it through MESHRUN_RANK_DIES_WITH_PARENT."""
    if not sys.platform.startswith("linux"):
        return
    import ctypes

    ctypes.CDLL(None, use_errno=True).prctl(1, int(signal.SIGKILL), 0, 0, 0)  # PR_SET_PDEATHSIG
    if os.getppid() == 1:  # torchrun died before prctl took effect
        os.kill(os.getpid(), signal.SIGKILL)


def slurm_job_id() -> str:
    """The job id when this rank runs under Slurm (array jobs use their own id), else ""."""
    return os.environ.get("SLURM_JOB_ID", "")


def restart_count() -> int:
    return int(os.environ.get("SLURM_RESTART_COUNT", "0") or 0)


def requeue_job(job_id: str) -> None:
    """Put this Slurm job back in the queue; it reruns the same task, which resumes."""
    result = subprocess.run(["scontrol", "requeue", job_id], capture_output=True, text=True)
    if result.returncode != 0:
        raise RuntimeError(f"scontrol requeue {job_id} failed: {result.stderr.strip()}")
