"""This rank's heartbeat (conf/run_dir/heartbeats.py): phase, step, the last collectives it
entered, and how long each step waited in them.

Writing touches no tensor: no host sync is added to the step. A write is a small JSON file
replaced atomically (tens of microseconds; benchmarks/watchdog_cost.py measures it).
STACK_SIGNAL (conf/run_dir/heartbeats.py) makes faulthandler write every thread's Python stack
to logs/stacks.rank<R>.txt, which the watchdog asks of every live rank when one hangs.
"""
from __future__ import annotations

import contextlib
import faulthandler
import json
import os
import threading
import time
from collections import deque
from pathlib import Path

from conf.run_dir.heartbeats import STACK_SIGNAL, heartbeat_file, stacks_file, write_atomically
from training.flight_recorder import FlightDumper

RING = 8
"""Collectives kept in the ring buffer (newest last)."""
FLUSH_S = 0.1
"""How often the writer thread writes a changed heartbeat: collectives and steps only mark it
changed, so the step pays no file write (benchmarks/watchdog_cost.py); phases write at once."""
STEP_TIMES_KEPT = 20
REQUEST_POLL_S = 0.5
"""How often the writer thread looks for the watchdog's flight-record request (one stat)."""


class Heartbeat:
    """One rank's progress, written to heartbeat/rank<R>.json at each phase, collective and
    step. `collective(label)` also times the block: the step's wait (blocked in collectives)."""

    def __init__(self, run_dir: Path, *, rank: int, host: str) -> None:
        self.path = heartbeat_file(run_dir, rank)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self.rank, self.host, self.pid = rank, host, os.getpid()
        self.phase_name, self.step = "init", 0
        self.beat = 0
        self.collectives: deque[str] = deque(maxlen=RING)
        self.step_times_s: deque[float] = deque(maxlen=STEP_TIMES_KEPT)
        self.wait_s = 0.0
        """Seconds blocked in timed collectives since the last `take_wait_s`."""
        self.blocking = False
        """Inside a timed block: a wait nested in it is not counted again."""
        self.clocks: list = []
        """Gradient-sync clocks (training/rank_times.py), settled after each backward."""
        self._lock = threading.Lock()
        self._changed = threading.Event()
        self._flight = FlightDumper(run_dir, rank)
        threading.Thread(target=self._write_changes, name="heartbeat", daemon=True).start()

    def install_stack_dump(self, run_dir: Path) -> None:
        """STACK_SIGNAL -> every thread's Python stack into logs/stacks.rank<R>.txt (the file
        kept open). Before the first heartbeat: the watchdog signals only ranks that wrote one
        (the signal's default action would kill a rank without the handler)."""
        path = stacks_file(run_dir, self.rank)
        path.parent.mkdir(parents=True, exist_ok=True)
        self._stacks = open(path, "w")  # noqa: SIM115 (open for the process's life)
        faulthandler.register(STACK_SIGNAL, file=self._stacks, all_threads=True, chain=False)

    def phase(self, name: str, *, step: int | None = None) -> None:
        self.phase_name = name
        if step is not None:
            self.step = step
        self.write()

    def enter(self, label: str) -> None:
        """Mark entering `label` (collectives inside a longer block), untimed."""
        with self._lock:
            self.collectives.append(f"{label}@{self.step}")
        self.mark_changed()

    @contextlib.contextmanager
    def collective(self, label: str):
        """Mark entering the collective `label` (ring buffer + heartbeat), time the block."""
        self.enter(label)
        outer, self.blocking = self.blocking, True
        started = time.perf_counter()
        try:
            yield
        finally:
            self.blocking = outer
            if not outer:
                self.wait_s += time.perf_counter() - started

    def blocked_in(self, wait, *args, **kwargs):
        """`wait(*args, **kwargs)`, its time added to `wait_s` unless inside a timed block
        (training/collective_waits.py times torch's collective waits with it)."""
        if self.blocking:
            return wait(*args, **kwargs)
        self.blocking = True
        started = time.perf_counter()
        try:
            return wait(*args, **kwargs)
        finally:
            self.blocking = False
            self.wait_s += time.perf_counter() - started

    def settle_clocks(self) -> None:
        for clock in self.clocks:
            clock.settle()

    def take_wait_s(self) -> float:
        waited, self.wait_s = self.wait_s, 0.0
        return waited

    def end_step(self, step: int, step_time_s: float) -> None:
        with self._lock:
            self.step = step
            self.step_times_s.append(step_time_s)
            self.phase_name = "step"
        self.mark_changed()

    def mark_changed(self) -> None:
        """Progress the writer thread writes within FLUSH_S (a stuck collective releases the
        GIL, so the file shows the collective a rank waits in)."""
        with self._lock:
            self.beat += 1
        self._changed.set()

    def _write_changes(self) -> None:
        while True:
            if self._changed.wait(REQUEST_POLL_S):
                self._changed.clear()
                self.write(advance=False)
                time.sleep(FLUSH_S)
            self._flight.poll()

    def write(self, *, advance: bool = True) -> None:
        """Write the heartbeat now (phases: at once)."""
        with self._lock:
            if advance:
                self.beat += 1
            text = json.dumps({
                "rank": self.rank, "pid": self.pid, "host": self.host, "beat": self.beat,
                "phase": self.phase_name, "step": self.step, "time": time.time(),
                "collectives": list(self.collectives),
                "step_times_s": list(self.step_times_s)})
            write_atomically(self.path, text)


class NoHeartbeat(Heartbeat):
    """A TrainState built outside `python -m training` (tests, tools): times, writes nothing."""

    def __init__(self) -> None:  # noqa: D107 (no file, no signal, no writer thread)
        self.phase_name, self.step, self.beat, self.wait_s = "init", 0, 0, 0.0
        self.blocking = False
        self.collectives: deque[str] = deque(maxlen=RING)
        self.step_times_s: deque[float] = deque(maxlen=STEP_TIMES_KEPT)
        self.clocks = []
        self._lock = threading.Lock()

    def mark_changed(self) -> None:
        pass

    def write(self, *, advance: bool = True) -> None:
        pass
