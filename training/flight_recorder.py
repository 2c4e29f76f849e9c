"""torch's flight recorder: every collective of every process group (DDP, FSDP, TP, PP, CP:
those the loop does not wrap too), on gloo and NCCL alike, kept in a ring buffer by torch.

`enable()` turns it on before the process group is created (TORCH_FR_BUFFER_SIZE; a user's own
setting wins). When the hang watchdog asks (conf/run_dir/heartbeats.py `request_flight_dumps`:
a request file, since a rank blocked in a collective runs no Python signal handler), the
heartbeat's thread writes this rank's record to logs/flight.rank<R>.json; the watchdog's report
says, per process group, which collective each rank entered last (conf/run_dir/flight_dumps.py).
"""
from __future__ import annotations

import os
from pathlib import Path

from conf.run_dir.heartbeats import flight_dump_file, flight_request_file, write_atomically

BUFFER_ENV = "TORCH_FR_BUFFER_SIZE"
ENTRIES = 2000
"""Collectives kept per rank: a few steps of FSDP's per-layer gathers on a deep model."""


def enable() -> None:
    """Record collectives from the process group's creation on (before init_process_group)."""
    os.environ.setdefault(BUFFER_ENV, str(ENTRIES))


class FlightDumper:
    """Writes this rank's flight record once per watchdog request (polled by a thread)."""

    def __init__(self, run_dir: Path, rank: int) -> None:
        self.request = flight_request_file(run_dir)
        self.dump = flight_dump_file(run_dir, rank)
        self.answered = self._asked()
        """mtime of the request last answered (one left by an earlier leg is no request)."""

    def _asked(self) -> float:
        try:
            return self.request.stat().st_mtime
        except FileNotFoundError:
            return 0.0

    def poll(self) -> None:
        asked = self._asked()
        if asked > self.answered:
            self.answered = asked
            write_atomically(self.dump, record_json())


def record_json() -> str:
    """This process's flight record as torch dumps it (JSON), "" when torch keeps none."""
    try:
        from torch._C._distributed_c10d import _dump_fr_trace_json
    except ImportError:
        return ""
    record = _dump_fr_trace_json(includeCollectives=True, onlyActive=False)
    return record.decode() if isinstance(record, bytes) else record
