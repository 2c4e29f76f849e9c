"""Rank heartbeats: what each rank last said it was doing, and when a silence is a hang.

Each rank writes `<run_dir>/heartbeat/rank<R>.json` (atomically: a temporary file, then a
rename) at every phase change and every step: step, phase, time, pid, host, a counter `beat`,
and the last few collectives it entered. The watchdog (launcher/watchdog.py), which runs in a
process that does not share the ranks' fate, reads them; so does `meshrun status`. The rule
for how long a silence may last (`hang_timeout_s`) lives here, once.
"""
from __future__ import annotations

import json
import os
import signal
import statistics
import time
from pathlib import Path

HEARTBEAT_DIR = "heartbeat"
HUNG_EVENT = "hung"
"""The metrics.jsonl event the watchdog appends when it stops a hung run (state `hung`)."""
HANG_REPORT_FILE = "hang_report.txt"
"""logs/<this>: the watchdog's full report (stalled ranks, their collectives, stacks)."""

STEP_PHASES = ("step", "eval")
"""Phases that repeat each step: their timeout scales with the measured step time."""
LONG_PHASES = ("init", "first_collective", "preflight", "build", "checkpoint_save", "checkpoint_load",
               "export", "finish")
"""One-off phases that may legitimately take long (start-up, compile, saving, exporting)."""

STACK_SIGNAL = signal.SIGRTMIN + 2
"""Asks a rank for its Python stacks (faulthandler). Not SIGUSR1/USR2: those are Slurm's
warning signal (cluster.warning_signal) and submitit's."""
STEP_FLOOR_S = 60.0
"""Auto: a step or eval phase may be silent at least this long ..."""
STEP_FACTOR = 10.0
"""... or this many median step times, whichever is longer."""
LONG_PHASE_FLOOR_S = 300.0
"""Auto: init, first collective, build, checkpoint save/load, export, at least this long ..."""
LONG_PHASE_FACTOR = 50.0
"""... or this many median step times."""
NEVER_STARTED_GRACE_S = 120.0
"""A rank that wrote no heartbeat at all is silent since the launch, plus this (imports)."""


def heartbeat_dir(run_dir: Path | str) -> Path:
    return Path(run_dir) / HEARTBEAT_DIR


def heartbeat_file(run_dir: Path | str, rank: int) -> Path:
    return heartbeat_dir(run_dir) / f"rank{rank}.json"


def stacks_file(run_dir: Path | str, rank: int) -> Path:
    """Where a rank's faulthandler writes every thread's Python stack on SIGUSR1."""
    return Path(run_dir) / "logs" / f"stacks.rank{rank}.txt"


def flight_request_file(run_dir: Path | str) -> Path:
    """The watchdog's request for flight records (training/flight_recorder.py): a file, since a
    rank blocked in a collective runs no Python signal handler; its threads poll for it."""
    return Path(run_dir) / "logs" / "flight_request"


def flight_dump_file(run_dir: Path | str, rank: int) -> Path:
    """Where a rank writes torch's flight record (JSON) when the watchdog asks."""
    return Path(run_dir) / "logs" / f"flight.rank{rank}.json"


def request_flight_dumps(run_dir: Path | str) -> None:
    """Ask every live rank, on any host sharing the run dir, for its flight record."""
    write_atomically(flight_request_file(run_dir), str(time.time()))


def hang_timeout_s(setting: float, *, phase: str, step_times_s: list[float]) -> float:
    """How long `phase` may go without a heartbeat before its rank counts as hung.

    `setting` is training.hang_timeout_s: > 0 is used for every phase as given; -1 (auto) is
    max(60 s, 10 x median step time) for step and eval, and max(300 s, 50 x median step time)
    for the one-off phases (init, first collective, build, checkpoint save/load, export); the
    median is over the step times the ranks reported so far (none yet: the floors).
    """
    if setting > 0:
        return float(setting)
    median = statistics.median(step_times_s) if step_times_s else 0.0
    if phase in STEP_PHASES:
        return max(STEP_FLOOR_S, STEP_FACTOR * median)
    return max(LONG_PHASE_FLOOR_S, LONG_PHASE_FACTOR * median)


def collective_timeouts_s(setting: float, *, join_timeout_s: float) -> tuple[float, float]:
    """(init, train) timeouts of the process group: a backstop behind the watchdog, so a
    collective never waits torch's 30 minutes. Init: the join timeout plus the longest
    one-off phase's hang timeout; train: twice the longest hang timeout any phase gets
    before step times are known (a phase's own timeout would fire first)."""
    longest = hang_timeout_s(setting, phase="init", step_times_s=[])
    return join_timeout_s + longest, 2 * longest + 30.0


def write_atomically(path: Path, text: str) -> None:
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    tmp.write_text(text)
    os.replace(tmp, path)


def read_heartbeats(run_dir: Path | str) -> dict[int, dict]:
    """rank -> its last heartbeat; a missing or torn file is left out."""
    found = {}
    folder = heartbeat_dir(run_dir)
    for path in folder.glob("rank*.json") if folder.is_dir() else []:
        try:
            found[int(path.stem[4:])] = json.loads(path.read_text())
        except (OSError, ValueError):
            continue
    return found


def stale_ranks(run_dir: Path | str, *, setting: float, now: float | None = None) -> list[dict]:
    """For `meshrun status`: heartbeats older than their phase's timeout (wall clock)."""
    beats = read_heartbeats(run_dir)
    times = [t for b in beats.values() for t in b.get("step_times_s", [])]
    now = time.time() if now is None else now
    stale = []
    for rank, beat in sorted(beats.items()):
        limit = hang_timeout_s(setting, phase=beat.get("phase", ""), step_times_s=times)
        if beat.get("phase") != "done" and now - beat.get("time", now) > limit:
            stale.append({"rank": rank, **beat, "silent_s": now - beat["time"]})
    return stale


def hung_in_this_leg(run_dir: Path | str) -> bool:
    """The watchdog declared this leg hung (a `hung` event after the newest resume marker):
    the SIGTERM that then stops the ranks (scancel, or the guard's requeue) is no preemption,
    so they must not requeue the job themselves nor write an end event over `hung`."""
    from conf.run_dir.metrics_rows import RESUME_ROW_KIND, read_metrics_rows
    from conf.run_dir.paths import RunDir

    rows = read_metrics_rows(RunDir(run_dir).metrics_file)
    starts = [i for i, r in enumerate(rows) if r.get("kind") == RESUME_ROW_KIND]
    return any(r.get("event") == HUNG_EVENT for r in rows[(starts[-1] if starts else 0):])
