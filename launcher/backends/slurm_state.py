"""A Slurm job's state from sacct (accounting), torch-free; a poll()-able handle for progress."""
from __future__ import annotations

import dataclasses
import os
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path

from conf.errors import ConfigError, Problem
from conf.run_dir.failure_diagnosis import failure_tail, looks_oom
from conf.run_dir.paths import RunDir
from conf.run_dir.run_states import RunState, state_from_files
from launcher.backends.slurm_queue import NOT_IN_QUEUE, squeue_rows

ACTIVE = ("PENDING", "RUNNING", "REQUEUED", "CONFIGURING", "COMPLETING", "SUSPENDED",
          "RESIZING", "REQUEUE_FED", "REQUEUE_HOLD")
POLL_FIRST_S = 2.0
POLL_MOST_S = 30.0
POLL_GROWTH = 1.2
POLL_MOST_ENV = "MESHRUN_SLURM_POLL_MOST_S"
"""Environment variable that lowers the longest wait between sacct polls (e.g. 1 on a test
cluster, where jobs are short and sacct is cheap); unset = POLL_MOST_S."""
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
"""Slurm's words -> the run states of `conf.run_dir` (any other word: failed)."""


@dataclass(frozen=True, slots=True, kw_only=True)
class JobState:
    job_id: str
    state: str
    """Slurm's word: PENDING, RUNNING, COMPLETED, FAILED, TIMEOUT, PREEMPTED, ... or UNKNOWN."""
    exit_code: str
    elapsed: str
    nodes: str
    note: str = ""
    """How the state was found when sacct could not say (slurm_queue.py); empty: from sacct."""

    @property
    def active(self) -> bool:
        return self.state in ACTIVE or self.state == "UNKNOWN"


def job_state(job_id: str) -> JobState:
    """One job's state from sacct; PENDING until accounting has a record of it."""
    return job_states([job_id])[job_id]


def job_states(job_ids: list[str]) -> dict[str, JobState]:
    """The states of all `job_ids` from ONE sacct call (`sacct -j a,b,c`), however many jobs are
    watched; a job accounting has no record of yet is PENDING, and all are UNKNOWN when sacct
    does not answer in time. When sacct fails (no accounting), one squeue call answers instead
    and each state says so in its `note` (slurm_queue.py); RuntimeError when neither can.

    Slurm 22.05's sacct has no restart count: requeues are counted from the run's events.
    """
    wanted = list(dict.fromkeys(job_ids))
    if not wanted:
        return {}
    try:
        out = subprocess.run(sacct_command(wanted), capture_output=True, text=True, timeout=30)
    except subprocess.TimeoutExpired:
        return {j: JobState(job_id=j, state="UNKNOWN", exit_code="", elapsed="", nodes="")
                for j in wanted}
    except OSError as err:  # no sacct on this machine
        return states_without_accounting(wanted, reason=f"cannot run sacct ({err.strerror})")
    if out.returncode != 0:
        reason = out.stderr.strip().splitlines()[-1] if out.stderr.strip() else \
            f"sacct exited with status {out.returncode}"
        return states_without_accounting(wanted, reason=reason)
    return parse_sacct(out.stdout, wanted)


def states_without_accounting(wanted: list[str], *, reason: str) -> dict[str, JobState]:
    """The jobs' states from squeue (a job it no longer lists: NOT_IN_QUEUE), each noting that
    accounting was unavailable and why."""
    rows = squeue_rows(wanted)
    if rows is None:
        raise RuntimeError(f"sacct failed for job(s) {','.join(wanted)}: {reason}; squeue did "
                           "not answer either (is SLURM_CONF set and slurmctld running?)")
    head = f"accounting unavailable (sacct: {reason})"
    found = parse_sacct(rows, wanted, missing=NOT_IN_QUEUE)
    return {j: dataclasses.replace(
        job, note=f"{head}; squeue no longer lists the job, so its run dir says how it ended"
        if job.state == NOT_IN_QUEUE else f"{head}; state from squeue")
        for j, job in found.items()}


def sacct_command(job_ids: list[str]) -> list[str]:
    return ["sacct", "-j", ",".join(job_ids), "-X", "-n", "-P",
            "--format=JobID,State,ExitCode,Elapsed,NodeList"]


def parse_sacct(text: str, job_ids: list[str], *,
                missing: str = "PENDING") -> dict[str, JobState]:
    """sacct's `JobID|State|ExitCode|Elapsed|NodeList` rows -> a state per asked id (the last row
    that names it; `missing` for an id no row names). A pending array's tasks share one row,
    `123_[0-3%2]`: each task in its range takes that row's state."""
    found: dict[str, JobState] = {}
    for line in text.splitlines():
        if not line.strip():
            continue
        row_id, state, exit_code, elapsed, nodes = (line.split("|") + [""] * 5)[:5]
        for job_id in job_ids:
            if _row_names(row_id, job_id):
                found[job_id] = JobState(job_id=job_id, state=(state.split() or ["UNKNOWN"])[0],
                                         exit_code=exit_code, elapsed=elapsed, nodes=nodes)
    return {j: found.get(j, JobState(job_id=j, state=missing, exit_code="", elapsed="",
                                     nodes="")) for j in job_ids}


def _row_names(row_id: str, job_id: str) -> bool:
    """Whether sacct's JobID `row_id` is the job `job_id`: the same id, or an array row
    `base_[0-3,7%2]` whose ranges hold the task."""
    if row_id == job_id:
        return True
    base, _, tasks = row_id.partition("_[")
    job_base, _, task = job_id.partition("_")
    if not tasks or base != job_base or not task.isdigit():
        return False
    for part in tasks.rstrip("]").split("%")[0].split(","):
        low, _, high = part.partition("-")
        if low.isdigit() and int(low) <= int(task) <= int(high or low):
            return True
    return False


def poll_most_s() -> float:
    """The longest wait between sacct polls: $MESHRUN_SLURM_POLL_MOST_S, else POLL_MOST_S."""
    raw = os.environ.get(POLL_MOST_ENV, "")
    if not raw:
        return POLL_MOST_S
    try:
        most = float(raw)
    except ValueError:
        most = 0.0
    if not 0 < most <= POLL_MOST_S:
        raise ConfigError([Problem(POLL_MOST_ENV, raw, f"must be seconds in (0, {POLL_MOST_S:g}]",
                                   f"unset it for the default {POLL_MOST_S:g} s")],
                          title="Invalid environment")
    return most


def poll_intervals(*, first_s: float = POLL_FIRST_S, most_s: float | None = None,
                   growth: float = POLL_GROWTH):
    """Seconds to wait before each next sacct poll: `first_s`, growing by `growth` each time up
    to `most_s` (2 s, 2.4 s, 2.9 s, ... 30 s after about 2.5 min): quick for short jobs, light on
    slurmdbd for long ones. `most_s` defaults to poll_most_s()."""
    most_s = poll_most_s() if most_s is None else most_s
    wait = min(first_s, most_s)
    while True:
        yield wait
        wait = min(most_s, wait * growth)


def state_from_scheduler(slurm_state: str, run_dir: Path) -> RunState:
    """Slurm's word for a run's job, made exact by the run dir: a job that ended cleanly
    without summary.json stopped early (e.g. out of requeues), unless it was a preflight that
    passed; a failure whose logs say so ran out of memory."""
    if slurm_state == NOT_IN_QUEUE:  # ended, and nothing but the run dir remembers how
        files = state_from_files(run_dir)
        unsure = (RunState.created, RunState.pending, RunState.running)
        return RunState.unknown if files in unsure else files
    state = SLURM_STATES.get(slurm_state, RunState.failed)
    if state in (RunState.failed, RunState.cancelled) and \
            state_from_files(run_dir) is RunState.hung:
        return RunState.hung  # the hang guard cancelled it (training/slurm_entry.py)
    if state is RunState.completed and not RunDir(run_dir).summary_file.exists():
        passed = state_from_files(run_dir) is RunState.preflight_passed
        return RunState.preflight_passed if passed else RunState.stopped
    if state is RunState.failed and looks_oom(failure_tail(run_dir)):
        return RunState.out_of_memory
    return state


class SlurmJobHandle:
    """Quacks like subprocess.Popen for launcher.views.progress: poll() is None while active. Asks
    sacct at most once per `poll_intervals()` step, however often poll() is called."""

    def __init__(self, job_id: str) -> None:
        self.job_id = job_id
        self.returncode: int | None = None
        self._intervals = poll_intervals()
        self._next_check = 0.0

    def poll(self) -> int | None:
        if self.returncode is None and time.monotonic() >= self._next_check:
            state = job_state(self.job_id)
            self._next_check = time.monotonic() + next(self._intervals)
            if not state.active:
                self.returncode = 0 if state.state == "COMPLETED" else 1
        return self.returncode
