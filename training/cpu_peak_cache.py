"""The CPU peak (MFU's denominator on CPU), measured once per host and reused by every run there.

A measurement taken under whatever load there is varies run to run (the same default run read
MFU 21.6% and then 51.9%), so runs measured separately cannot be compared. Instead the first
run on a host measures it (training/metrics.py: the best of repeated matmul timings) and stores
it, with the load seen then, in one file per host:

    $MESHRUN_CPU_PEAK_CACHE/<hostname>.json     (default dir: $XDG_CACHE_HOME/meshrun/cpu_peak,
                                                 else ~/.cache/meshrun/cpu_peak)

one entry per (compute dtype, torch threads per rank): the peak of 1 thread is not that of 2.
Every later run on the host with that key divides by the stored number, so their MFUs compare.
`training.cpu_peak=remeasure` measures again and replaces the entry (e.g. after a quiet moment);
`training.cpu_peak=run` measures for this run only and stores nothing (the old behaviour);
`training.cpu_peak_flops` (a number) overrides all of this. Written atomically (a temporary
sibling, renamed): two runs storing at once leave one whole file. A file that cannot be read
is measured over, with a warning, never an error.
"""
from __future__ import annotations

import json
import logging
import math
import os
import socket
import time
from collections.abc import Callable
from pathlib import Path

from conf.choices import CpuPeakMode
from parallel.cost.devices import PeakFlops

log = logging.getLogger("meshrun.metrics")

CACHE_ENV = "MESHRUN_CPU_PEAK_CACHE"
"""A folder for the per-host peak files (tests point it at a temporary folder)."""
FILE_VERSION = 1


def cache_dir() -> Path:
    if os.environ.get(CACHE_ENV):
        return Path(os.environ[CACHE_ENV]).expanduser()
    base = os.environ.get("XDG_CACHE_HOME") or "~/.cache"
    return Path(base).expanduser() / "meshrun" / "cpu_peak"


def host_file(host: str | None = None) -> Path:
    return cache_dir() / f"{host or socket.gethostname()}.json"


def entry_key(dtype_name: str, threads: int) -> str:
    return f"{dtype_name}/{threads}t"


def read_entries(path: Path) -> dict:
    """The file's entries ({} when it is absent; a broken file is warned about and ignored)."""
    try:
        data = json.loads(path.read_text())
        entries = data["entries"]
        if not isinstance(entries, dict):
            raise ValueError("entries is not an object")
        return entries
    except FileNotFoundError:
        return {}
    except (OSError, ValueError, KeyError, TypeError) as err:
        log.warning("CPU peak cache %s cannot be read (%s): measuring again", path, err)
        return {}


def write_entry(path: Path, key: str, entry: dict) -> None:
    """Add or replace one entry, atomically (a temporary sibling renamed over the file)."""
    entries = {**read_entries(path), key: entry}
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    try:
        tmp.write_text(json.dumps({"version": FILE_VERSION, "host": path.stem,
                                   "entries": entries}, indent=2) + "\n")
        os.replace(tmp, path)
    except OSError as err:
        tmp.unlink(missing_ok=True)
        log.warning("CPU peak not stored in %s (%s): the next run measures again", path, err)


def load_seen() -> dict:
    """The load when the peak is measured: 1/5/15-minute load averages and the core count."""
    try:
        loadavg = [round(x, 2) for x in os.getloadavg()]
    except OSError:
        loadavg = []
    return {"loadavg": loadavg, "cpu_count": os.cpu_count()}


def entry_source(path: Path, entry: dict) -> str:
    """How MFU names a stored peak: the same words for every run that uses that entry."""
    load = "/".join(f"{x:g}" for x in entry.get("loadavg", [])) or "?"
    return (f"host CPU peak {path} [{entry.get('key')}], measured {entry.get('measured_at')} "
            f"at load {load} on {entry.get('cpu_count')} cores: {entry.get('measurement')}")


def host_peak(dtype_name: str, *, threads: int, mode: CpuPeakMode,
              measure: Callable[[], tuple[float, str, tuple[str, ...]]],
              path: Path | None = None) -> PeakFlops:
    """The peak for this host, dtype and thread count: the stored one (mode host), or
    `measure()` -> (flops, measurement words, warnings), stored unless mode is run."""
    path = path or host_file()
    key = entry_key(dtype_name, threads)
    entry = read_entries(path).get(key) if mode is CpuPeakMode.host else None
    if isinstance(entry, dict) and _valid(entry):
        for warning in entry.get("warnings", []):
            log.warning("stored %s (fix: training.cpu_peak=remeasure on a quiet machine)", warning)
        return PeakFlops(flops=float(entry["flops"]), source=entry_source(path, entry))
    flops, words, warnings = measure()
    for warning in warnings:
        log.warning(warning)
    if mode is CpuPeakMode.run:
        return PeakFlops(flops=flops, source=f"{words} (this run only: training.cpu_peak=run)")
    entry = {"key": key, "flops": flops, "measurement": words, "warnings": list(warnings),
             "measured_at": time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime()),
             "torch_threads": threads, "dtype": dtype_name, **load_seen()}
    write_entry(path, key, entry)
    return PeakFlops(flops=flops, source=entry_source(path, entry))


def _valid(entry: dict) -> bool:
    flops = entry.get("flops")
    return (isinstance(flops, (int, float)) and not isinstance(flops, bool)
            and math.isfinite(flops) and flops > 0)
