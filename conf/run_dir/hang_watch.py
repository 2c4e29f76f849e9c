"""The hang watchdog: it runs in a process that does not share the ranks' fate: a thread of
the local launcher (launcher/watchdog.py), or on Slurm a process forked by rank 0's task
before it imports torch (training/slurm_entry.py). Torch-free, stdlib only.

It reads the ranks' heartbeats (conf/run_dir/heartbeats.py). When a rank's heartbeat has not
advanced within its phase's timeout it: names the stalled rank(s) and what each was doing
(phase, step, the last collectives it entered); asks every live rank for its Python stack
(STACK_SIGNAL -> faulthandler -> logs/stacks.rank<R>.txt; a stopped process cannot answer, which
the report says) and for torch's flight record of every collective it entered, in every
process group (a request file its heartbeat thread answers; conf/run_dir/flight_dumps.py says
which rank is behind in which group); writes logs/hang_report.txt and the `hung` event (state hung) into
metrics.jsonl; and stops the run with `stop_all`. The newest complete checkpoint is untouched.
"""
from __future__ import annotations

import json
import os
import socket
import threading
import time
from pathlib import Path
from typing import Callable

from conf.run_dir.flight_dumps import flight_lines, read_flight_dumps
from conf.run_dir.heartbeats import (
    HANG_REPORT_FILE, HUNG_EVENT, NEVER_STARTED_GRACE_S, STACK_SIGNAL, hang_timeout_s,
    flight_dump_file, read_heartbeats, request_flight_dumps, stacks_file,
)
from conf.run_dir.paths import RunDir

POLL_S = 1.0
STACK_WAIT_S = 2.0
"""How long live ranks get to write their stacks after SIGUSR1."""
DETECTION_BOUND_S = POLL_S + STACK_WAIT_S + 2.0
LEFT_BEFORE_S = 5.0
"""A heartbeat older than the watchdog's start by more than this is an earlier leg's."""
"""A hang is named within its timeout plus this (poll, stacks, writing the report)."""


class HangWatchdog:
    """Polls heartbeats of `world_size` ranks every POLL_S; `report` is set once it fired."""

    def __init__(self, run_dir: Path, *, world_size: int, setting: float,
                 stop_all: Callable[[], None], clock: Callable[[], float] = time.monotonic,
                 ask_stacks: Callable[[], None] | None = None):
        """`stop_all` stops every rank; `ask_stacks` sends STACK_SIGNAL to every rank (None:
        to the ranks on this host, by the pids in their heartbeats)."""
        self.run_dir, self.world_size, self.setting = Path(run_dir), world_size, setting
        self.stop_all, self.clock, self.ask_stacks = stop_all, clock, ask_stacks
        self.started = clock()
        self.started_wall = time.time()
        self.seen: dict[int, tuple[int, float]] = {}
        """rank -> (its last beat counter, when this watchdog saw it change)."""
        self.report: str | None = None
        self._done = threading.Event()
        self._thread = threading.Thread(target=self._run, name="hang-watchdog", daemon=True)

    def __enter__(self) -> "HangWatchdog":
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._done.set()
        self._thread.join(timeout=10)

    def run(self) -> None:
        """Watch in this thread until a hang fired (a guard process's whole life)."""
        self._run()

    def _run(self) -> None:
        while not self._done.wait(POLL_S):
            stalled = self.check()
            if stalled:
                self.fire(stalled)
                return

    def check(self) -> list[int]:
        """The ranks silent past their phase's timeout (empty while all progress)."""
        now = self.clock()
        beats = {rank: b for rank, b in read_heartbeats(self.run_dir).items()
                 if b.get("time", 0.0) >= self.started_wall - LEFT_BEFORE_S}
        self.beats = beats  # (a file left by an earlier leg is no heartbeat of this one)
        times = [t for b in beats.values() for t in b.get("step_times_s", [])]
        stalled = []
        for rank in range(self.world_size):
            beat = beats.get(rank, {})
            counter = beat.get("beat", 0)
            last = self.seen.get(rank)
            if last is None or last[0] != counter:
                self.seen[rank] = (counter, self.started if last is None and not beat else now)
            if beat.get("phase") == "done":
                continue
            limit = hang_timeout_s(self.setting, phase=beat.get("phase", "init"),
                                   step_times_s=times)
            if not beat:  # Python and torch still importing: a slow start is not a hang
                limit = max(limit, NEVER_STARTED_GRACE_S)
            if now - self.seen[rank][1] > limit:
                stalled.append(rank)
        return stalled

    def fire(self, stalled: list[int]) -> None:
        now, beats = self.clock(), self.beats
        asked_at, before = time.time(), self._answer_marks()
        request_flight_dumps(self.run_dir)
        asked = _ask_for_stacks(beats, signal_all=self.ask_stacks is None)
        if self.ask_stacks is not None:
            self.ask_stacks()
        time.sleep(STACK_WAIT_S)
        after = self._answer_marks()
        mute = [r for r in range(self.world_size) if after[r] == before[r]]
        culprits = _culprits(stalled, beats, mute=mute if len(mute) < self.world_size else [])
        lines = [f"hang: no progress from rank(s) {', '.join(map(str, culprits))} within "
                 f"training.hang_timeout_s; the run was stopped (state {HUNG_EVENT})"]
        for rank in range(self.world_size):
            answered = asked.get(rank, "mute" if rank in mute else None)
            lines.append(_rank_line(rank, beats.get(rank), now - self.seen[rank][1],
                                    culprit=rank in culprits, answered=answered))
        summary = "\n".join(lines)
        self._write_report(summary, asked_at)
        self._append_event(culprits, beats, summary)
        self.report = summary
        self.stop_all()

    def _answer_marks(self) -> list[tuple | None]:
        """Per rank, its stacks file's and flight dump's (mtime, size): a rank whose marks do
        not change after the request did not answer, on any host sharing the run dir (no
        clock compared)."""
        def mark(path: Path) -> tuple | None:
            try:
                st = path.stat()
            except OSError:
                return None
            return st.st_mtime_ns, st.st_size
        return [(mark(stacks_file(self.run_dir, r)), mark(flight_dump_file(self.run_dir, r)))
                for r in range(self.world_size)]

    def _write_report(self, summary: str, asked_at: float) -> None:
        dumps = read_flight_dumps(self.run_dir, self.world_size, since=asked_at - 1.0)
        parts = [summary, "", *flight_lines(dumps, self.world_size), ""]
        for rank in range(self.world_size):
            path = stacks_file(self.run_dir, rank)
            text = path.read_text(errors="replace") if path.exists() else ""
            parts += [f"--- rank {rank} Python stacks ({path.name}) ---",
                      text.strip() or "(none: the process could not answer)", ""]
        (RunDir(self.run_dir).logs_dir / HANG_REPORT_FILE).write_text("\n".join(parts))

    def _append_event(self, culprits: list[int], beats: dict, summary: str) -> None:
        steps = [b.get("step", 0) for b in beats.values()]
        row = {"kind": "event", "event": HUNG_EVENT, "step": min(steps, default=0),
               "ranks": culprits, "phases": {str(r): beats.get(r, {}).get("phase", "none")
                                             for r in culprits},
               "message": summary.splitlines()[0], "time": round(time.time(), 3)}
        with open(RunDir(self.run_dir).metrics_file, "a") as f:
            f.write("\n" + json.dumps(row) + "\n")


def _culprits(stalled: list[int], beats: dict, *, mute: list[int] = ()) -> list[int]:
    """The ranks behind: a stopped process, or one that did not answer the stack request
    while others did (`mute`: faulthandler answers even from a rank stuck in native code, so
    a mute rank is stopped or gone, on whichever host), of any rank (one stopped just after
    its last heartbeat may not be past its timeout yet while the peer waiting for it, silent
    since earlier, is); else the stalled ranks of lowest progress (a rank waiting in a
    collective for a stalled peer goes silent too, but later and ahead)."""
    stopped = sorted(r for r in set(stalled) | set(beats) | set(mute)
                     if r in mute or _process_state(beats.get(r, {})) == "T")
    if stopped:
        return stopped
    def progress(rank: int) -> tuple:
        b = beats.get(rank, {})
        return (b.get("step", -1), b.get("time", 0.0))
    least = min(progress(r) for r in stalled)
    return [r for r in stalled if progress(r)[0] == least[0]] or stalled


def _process_state(beat: dict) -> str:
    """/proc state letter of the rank's pid when it runs on this host ("" elsewhere)."""
    if not beat or beat.get("host") not in (socket.gethostname(), os.environ.get("SLURMD_NODENAME")):
        return ""
    try:
        text = Path(f"/proc/{beat['pid']}/stat").read_text()
    except OSError:
        return ""
    return text[text.rfind(")") + 2:].split()[0]


def _ask_for_stacks(beats: dict, *, signal_all: bool) -> dict[int, bool]:
    """STACK_SIGNAL to each live rank on this host (`signal_all`); rank -> whether it can
    answer (False: stopped or gone)."""
    asked = {}
    for rank, beat in beats.items():
        state = _process_state(beat)
        if state in ("", "Z", "X"):
            continue
        asked[rank] = state != "T"
        try:
            if signal_all:
                os.kill(beat["pid"], STACK_SIGNAL)
        except (ProcessLookupError, PermissionError):
            asked[rank] = False
    return asked


def _rank_line(rank: int, beat: dict | None, silent_s: float, *, culprit: bool,
               answered: bool | None) -> str:
    role = "STALLED" if culprit else "waiting"
    if not beat:
        return f"  rank {rank} [{role}]: no heartbeat at all (never started, silent {silent_s:.0f} s)"
    colls = ", ".join(beat.get("collectives", [])) or "none"
    stack = {True: "stack asked for", False: "stopped (SIGSTOP/T state): cannot dump its stack",
             "mute": "on another host; did not answer the stack request (stopped or gone)",
             None: "on another host; its stack asked for"}[answered]
    return (f"  rank {rank} [{role}] pid {beat.get('pid')} on {beat.get('host')}: phase "
            f"{beat.get('phase')} at step {beat.get('step')}, silent {silent_s:.0f} s; last "
            f"collectives entered: {colls}; {stack}")
