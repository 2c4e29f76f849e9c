"""Run states: one vocabulary for `meshrun status`, sweep status and compare, and the state a
run dir's own files say (with the launcher's exit status, when it is known)."""
from __future__ import annotations

from enum import Enum
from pathlib import Path

from conf.run_dir.failure_diagnosis import failure_tail, looks_oom
from conf.run_dir.heartbeats import HUNG_EVENT
from conf.run_dir.metrics_rows import FAILED_EVENT, PREFLIGHT_EVENT
from conf.run_dir.paths import RunDir


class RunState(str, Enum):
    """Where a run stands. `str(state)` and `state.value` are the word people see."""

    created = "created"
    """The run dir is written; no rank has started."""
    pending = "pending"
    """Waiting: queued by the scheduler, or a sweep point not launched yet."""
    running = "running"
    """Ranks have started and nothing says the run ended."""
    paused = "paused"
    """Stopped on purpose at training.stop_at_step; `meshrun resume` continues it."""
    requeued = "requeued"
    """Stopped by a warning signal and requeued by Slurm; it continues by itself."""
    stopped = "stopped"
    """Ended before its last step (a signal, Ctrl-C, out of requeues); resumable."""
    completed = "completed"
    """The last step is done and summary.json is written."""
    preflight_passed = "preflight passed"
    """A `meshrun preflight` run dir: its checks passed and no training was asked of it (a
    failed preflight is `failed`). Finished: nothing to wait for or resume."""
    failed = "failed"
    hung = "hung"
    """A rank stopped progressing: the watchdog named it (logs/hang_report.txt), dumped the
    stacks and stopped the run; the newest complete checkpoint resumes it."""
    out_of_memory = "out of memory"
    timed_out = "timed out"
    preempted = "preempted"
    cancelled = "cancelled"
    missing = "missing"
    """No run dir (or no spec.json in it) where one should be."""
    unknown = "unknown"
    """The scheduler or the run's files could not say."""

    def __str__(self) -> str:
        return self.value

    def __hash__(self) -> int:  # equal to its word, so hash like it (dict keys, Counter)
        return str.__hash__(self)


FINISHED_STATES = (RunState.completed, RunState.preflight_passed)
"""Done as asked: what the run dir says stands, whatever the launcher's exit."""
ACTIVE_STATES = (RunState.pending, RunState.running, RunState.unknown)
"""A sweep waits for these."""
FAILED_STATES = (RunState.failed, RunState.hung, RunState.out_of_memory, RunState.timed_out,
                 RunState.cancelled)
"""`meshrun status` shows the log tail for these."""
RETRYABLE_STATES = (RunState.failed, RunState.hung, RunState.out_of_memory, RunState.timed_out,
                    RunState.preempted, RunState.cancelled, RunState.stopped, RunState.paused,
                    RunState.missing)
"""`meshrun sweep retry` reruns (or resumes) these."""
EVENT_STATES = {"paused": RunState.paused, "requeued": RunState.requeued,
                "stopped": RunState.stopped, "finished": RunState.running,
                FAILED_EVENT: RunState.failed, PREFLIGHT_EVENT: RunState.preflight_passed,
                HUNG_EVENT: RunState.hung}
"""The loop's last event -> state ("finished": the summary is being written)."""
INTERRUPTED_EXIT = (0, 130)
KILLED_EXIT = (-9, 137)


def state_from_files(run_dir: Path) -> RunState:
    """What the run dir itself says: summary.json, the loop's last event, the rank logs."""
    rd = RunDir(run_dir)
    if rd.summary_file.exists():
        return RunState.completed
    events = [r for r in rd.read_rows() if r.get("kind") == "event"]
    if events:
        return EVENT_STATES.get(events[-1].get("event"), RunState.unknown)
    logs = rd.rank_logs()
    if any("failed" in log.read_text(errors="replace") for log in logs):
        return RunState.out_of_memory if looks_oom(failure_tail(run_dir)) else RunState.failed
    return RunState.running if logs else RunState.created


def state_after_exit(run_dir: Path, *, exit_status: int | None, launcher_alive: bool) -> RunState:
    """A locally launched run's state when its launcher's exit status is known (sweeps record
    it): None = not ended (or its launcher died under it)."""
    files = state_from_files(run_dir)
    if files in FINISHED_STATES or files is RunState.hung:
        return files
    if exit_status is None:
        return RunState.running if launcher_alive else RunState.failed
    if exit_status in INTERRUPTED_EXIT:
        return files if files in (RunState.paused, RunState.requeued) else RunState.stopped
    if exit_status in KILLED_EXIT or looks_oom(failure_tail(run_dir)):
        return RunState.out_of_memory
    return RunState.failed
