"""The run dir, owned here: every name in it, its readers, and the run states.

Torch-free and hydra-free: the launcher, the sweeps, `meshrun status`/`compare` and the ranks
all name the run dir's files through this module, so its layout is written down once::

    <run_dir>/spec.json          the frozen RunSpec every rank reads (conf.run_dir.spec_io round-trips it)
              config.yaml        the composed Hydra config, for people
              overrides.json     the command-line overrides (`meshrun resume` recomposes from them)
              command.txt        the launch command
              env.json           Python/torch versions, host, git state
              wandb_id.txt       the W&B run id (one W&B run across resumes and requeues)
              resumes.jsonl      one line per `meshrun resume` leg: time, the overrides it
                                 was given, the effective overrides it composed from
              launcher.lock      held (flock) by the one launcher driving the run: host, pid, start
              logs/rank<R>.log   each rank's log; logs/torchrun.log, logs/launcher.log
              metrics.jsonl      one JSON row per train step / eval / event (rank 0 appends)
              summary.json       the final numbers (rank 0, only when the last step is done)
              preflight.json     the preflight report (rank 0)
              checkpoints/step_<N>/   complete checkpoints (see below)
              export/            the safetensors export (Hugging Face layout)
              slurm/jobs.json    the Slurm submissions (slurm/<job id>/ are submitit's folders)

Checkpoint folders and the complete-checkpoint rule: conf/run_dir/checkpoint_dirs.py.
"""
from __future__ import annotations

import json
import os
import re
import statistics
from enum import Enum
from pathlib import Path

from conf.run_dir.checkpoint_dirs import is_complete_checkpoint, latest_checkpoint
from conf.spec import RunSpec
from conf.run_dir.spec_io import read_spec, write_spec

SPEC_FILE = "spec.json"
CONFIG_FILE = "config.yaml"
OVERRIDES_FILE = "overrides.json"
COMMAND_FILE = "command.txt"
ENV_FILE = "env.json"
WANDB_ID_FILE = "wandb_id.txt"
RESUMES_FILE = "resumes.jsonl"
LOCK_FILE = "launcher.lock"
LOGS_DIR = "logs"
TORCHRUN_LOG = "torchrun.log"
LAUNCHER_LOG = "launcher.log"
METRICS_FILE = "metrics.jsonl"
SUMMARY_FILE = "summary.json"
PREFLIGHT_FILE = "preflight.json"
CHECKPOINTS_DIR = "checkpoints"
EXPORT_DIR = "export"
SLURM_DIR = "slurm"
JOBS_FILE = "jobs.json"



LEG_UNPAUSE = "training.stop_at_step=0"
"""stop_at_step pauses one leg of a run: a resumed leg runs on unless told again."""


SAFE_NAME = re.compile(r"[^A-Za-z0-9_.-]+")
"""Characters a run dir's name (and an #SBATCH job name) may not hold; `safe_name` maps them."""


def safe_name(text: str) -> str:
    """`text` reduced to characters safe in paths and #SBATCH lines."""
    return SAFE_NAME.sub("_", text)


def rank_log_name(rank: int) -> str:
    return f"rank{rank}.log"


class RunDir:
    """A run dir's paths by name: `RunDir(path).metrics_file`, `.rank_log(3)`, ..."""

    __slots__ = ("path",)

    def __init__(self, path: Path | str) -> None:
        self.path = Path(path)

    def __repr__(self) -> str:
        return f"RunDir({str(self.path)!r})"

    spec_file = property(lambda self: self.path / SPEC_FILE)
    config_file = property(lambda self: self.path / CONFIG_FILE)
    overrides_file = property(lambda self: self.path / OVERRIDES_FILE)
    command_file = property(lambda self: self.path / COMMAND_FILE)
    env_file = property(lambda self: self.path / ENV_FILE)
    wandb_id_file = property(lambda self: self.path / WANDB_ID_FILE)
    resumes_file = property(lambda self: self.path / RESUMES_FILE)
    lock_file = property(lambda self: self.path / LOCK_FILE)
    logs_dir = property(lambda self: self.path / LOGS_DIR)
    torchrun_log = property(lambda self: self.path / LOGS_DIR / TORCHRUN_LOG)
    launcher_log = property(lambda self: self.path / LOGS_DIR / LAUNCHER_LOG)
    metrics_file = property(lambda self: self.path / METRICS_FILE)
    summary_file = property(lambda self: self.path / SUMMARY_FILE)
    preflight_file = property(lambda self: self.path / PREFLIGHT_FILE)
    checkpoints_dir = property(lambda self: self.path / CHECKPOINTS_DIR)
    export_dir = property(lambda self: self.path / EXPORT_DIR)
    slurm_dir = property(lambda self: self.path / SLURM_DIR)
    jobs_file = property(lambda self: self.path / SLURM_DIR / JOBS_FILE)

    def rank_log(self, rank: int) -> Path:
        return self.logs_dir / rank_log_name(rank)

    def rank_logs(self) -> list[Path]:
        """The rank logs written so far, sorted by name."""
        return sorted(self.logs_dir.glob("rank*.log"))

    @property
    def is_run_dir(self) -> bool:
        """A folder made by the launcher: it holds spec.json."""
        return self.spec_file.is_file()

    def read_spec(self) -> RunSpec:
        return read_spec(self.spec_file)

    def write_spec(self, spec: RunSpec) -> None:
        write_spec(spec, self.spec_file)

    def read_overrides(self) -> list[str]:
        return json.loads(self.overrides_file.read_text())

    def read_resumes(self) -> list[dict]:
        """resumes.jsonl, one dict per resumed leg (torn or foreign lines skipped)."""
        if not self.resumes_file.is_file():
            return []
        lines = self.resumes_file.read_text(errors="replace").split("\n")
        return [row for row in map(parse_metrics_line, lines) if row is not None]

    def append_resume(self, *, time: str, overrides: list[str], effective: list[str]) -> None:
        with open(self.resumes_file, "a") as f:
            f.write(json.dumps({"time": time, "overrides": overrides,
                                "effective": effective}) + "\n")

    def leg_overrides(self) -> list[str]:
        """The overrides the newest leg ran with (a plain `meshrun resume` continues with
        them): overrides.json, then each resume's, each leg un-pausing the last."""
        effective = self.read_overrides()
        for leg in self.read_resumes():
            effective = leg.get("effective") or (
                effective + [LEG_UNPAUSE] + list(leg.get("overrides", [])))
        return effective

    def read_rows(self) -> list[dict]:
        return read_metrics_rows(self.metrics_file)

    def read_summary(self) -> dict | None:
        """summary.json, or None before the run has finished."""
        path = self.summary_file
        return json.loads(path.read_text()) if path.is_file() else None

    def latest_checkpoint(self) -> Path | None:
        return latest_checkpoint(self.checkpoints_dir)


RESUME_ROW_KIND = "resume"
"""metrics.jsonl is append-only: a resumed leg first appends {"kind": "resume", "step": S}
(the checkpoint step it continues from); rows of steps after S written before it belong to a
leg that died before its next checkpoint, and readers drop them (each step's last row wins)."""


def read_metrics_rows(path: Path) -> list[dict]:
    """Every complete row of a metrics.jsonl as the run's current history: a last line still
    being written and any line that is not a JSON object are skipped; rows superseded by a
    later resume marker are dropped."""
    path = Path(path)
    if not path.exists():
        return []
    text = path.read_text(errors="replace")
    lines = text.split("\n")
    if not text.endswith("\n"):
        lines = lines[:-1]  # the writer has not finished this line yet
    return history(row for row in map(parse_metrics_line, lines) if row is not None)


def parse_metrics_line(line: str) -> dict | None:
    """One metrics row, or None for a blank, torn or foreign line (never raises)."""
    if not line.strip():
        return None
    try:
        row = json.loads(line)
    except ValueError:
        return None
    return row if isinstance(row, dict) else None


def history(rows) -> list[dict]:
    """Apply resume markers: a marker at step S drops the rows of steps after S before it."""
    kept: list[dict] = []
    for row in rows:
        if row.get("kind") == RESUME_ROW_KIND:
            step = row.get("step", 0)
            kept = [r for r in kept if r.get("step", 0) <= step]
        kept.append(row)
    return kept


_FAILURE_ENTRY = re.compile(
    r"rank\s*:\s*(\d+).*?exitcode\s*:\s*(-?\d+)[^\n]*?(?:\((SIG[A-Z0-9]+)\))?\s*\n", re.S)
ROOT_CAUSE = "Root Cause (first observed failure):"
COLLATERAL_MARKERS = ("connection closed by peer", "connection reset by peer", "broken pipe")
"""A rank whose error says one of these failed because a peer died first (gloo/NCCL)."""


def first_failure(run_dir: Path) -> tuple[int, int, str] | None:
    """The rank that failed first, from torchrun's last error summary: (rank, exit code, signal
    name or ""), or None where there is none. torchrun's "Root Cause (first observed
    failure)" is the earliest timestamp, and a survivor that wrote its error file ("connection
    reset by peer") can be stamped before the agent noticed the peer it lost (a SIGKILLed rank
    leaves no file): such a root cause gives way to a listed failure whose log says no such
    thing."""
    rd = RunDir(run_dir)
    if not rd.torchrun_log.exists():
        return None
    text = rd.torchrun_log.read_text(errors="replace")
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
    tail = _log_tail(run_dir, lines)
    full = disk_full_note(run_dir)
    return f"{full}\n{tail}" if full and NO_SPACE not in tail else tail


NO_SPACE = "No space left on device"
DISK_FULL_FREE_BYTES = 64 << 10
"""Below this much free space on the run dir's filesystem, a failure is reported as a full disk."""


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


# --- outcomes: the numbers of summary.json, from metrics.jsonl -----------------------------------

WARMUP_FRACTION = 0.1  # steps left out of the throughput means (compile, allocator, caches)


def outcomes_from_rows(rows: list[dict]) -> dict:
    """The final numbers a run's metrics rows give (summary.json's first keys, in its order);
    `training.summary_json` adds where they came from. Compare uses it for unfinished runs too."""
    train = [r for r in rows if r.get("kind") == "train"]
    evals = [r for r in rows if r.get("kind") == "eval"]
    steady = train[int(len(train) * WARMUP_FRACTION):] or train
    first_val = evals[0]["val_loss"] if evals else None
    final_val = evals[-1]["val_loss"] if evals else None
    return {
        "steps_done": train[-1]["step"] if train else 0,
        "final_loss": train[-1]["loss"] if train else None,
        "first_val_loss": first_val,
        "final_val_loss": final_val,
        "best_val_loss": min(r["val_loss"] for r in evals) if evals else None,
        "val_loss_drop": 1 - final_val / first_val if first_val else None,
        "tokens_per_s": _mean(steady, "tokens_per_s"),
        "tokens_per_s_per_device": _mean(steady, "tokens_per_s_per_device"),
        "mfu": _mean(steady, "mfu"),
        "peak_mem_gib": max((r.get("mem_peak_gib", 0.0) for r in train), default=None),
        "wall_s": _wall_s(rows),
    }


def _mean(rows: list[dict], key: str) -> float | None:
    values = [r[key] for r in rows if key in r]
    return statistics.fmean(values) if values else None


def _wall_s(rows: list[dict]) -> float | None:
    times = [r["time"] for r in rows if "time" in r]
    return max(times) - min(times) if len(times) > 1 else None


# --- run states: one vocabulary for `meshrun status`, sweep status and compare -------------------

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
FAILED_STATES = (RunState.failed, RunState.out_of_memory, RunState.timed_out, RunState.cancelled)
"""`meshrun status` shows the log tail for these."""
RETRYABLE_STATES = (RunState.failed, RunState.out_of_memory, RunState.timed_out,
                    RunState.preempted, RunState.cancelled, RunState.stopped, RunState.paused,
                    RunState.missing)
"""`meshrun sweep retry` reruns (or resumes) these."""
FAILED_EVENT = "failed"
PREFLIGHT_EVENT = "preflight passed"
"""The one event of a `meshrun preflight` run dir, noted by the launcher once every rank passed."""
"""The loop's event when it gives up (a non-finite loss); its row carries step, loss, message."""
EVENT_STATES = {"paused": RunState.paused, "requeued": RunState.requeued,
                "stopped": RunState.stopped, "finished": RunState.running,
                FAILED_EVENT: RunState.failed, PREFLIGHT_EVENT: RunState.preflight_passed}
"""The loop's last event -> state ("finished": the summary is being written)."""
OOM_MARKERS = ("out of memory", "outofmemoryerror", "oom-kill")
INTERRUPTED_EXIT = (0, 130)
KILLED_EXIT = (-9, 137)


def looks_oom(text: str) -> bool:
    low = text.lower()
    return any(marker in low for marker in OOM_MARKERS)


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
    if files in FINISHED_STATES:
        return files
    if exit_status is None:
        return RunState.running if launcher_alive else RunState.failed
    if exit_status in INTERRUPTED_EXIT:
        return files if files in (RunState.paused, RunState.requeued) else RunState.stopped
    if exit_status in KILLED_EXIT or looks_oom(failure_tail(run_dir)):
        return RunState.out_of_memory
    return RunState.failed


# --- checkpoints of a run --------------------------------------------------------------------------

def find_checkpoint(source: Path) -> Path | None:
    """`source` itself if it is a complete checkpoint, else the newest one of the run dir
    `source` (checkpoint.load_from accepts either)."""
    source = Path(source)
    return source if is_complete_checkpoint(source) else RunDir(source).latest_checkpoint()
