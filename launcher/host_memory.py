"""How much memory new processes on this machine may take, read from the OS without torch.

MemAvailable (/proc/meminfo: free memory plus what the kernel can reclaim without swapping)
is what the kernel itself offers as "available for starting new applications"; under a cgroup
v2 limit (a container, a Slurm job step) the room left under that limit is used when smaller.
0 when neither can be read (not Linux): the plan then gives no CPU verdict.
$MESHRUN_HOST_MEMORY_BYTES, when set, replaces the probe: a share of a machine others use too,
or a fixed figure for plans that must print the same wherever they are made.
"""
from __future__ import annotations

import os
from pathlib import Path

from conf.errors import ConfigError, Problem

MEMINFO = Path("/proc/meminfo")
CGROUP_ROOT = Path("/sys/fs/cgroup")
HOST_MEMORY_ENV = "MESHRUN_HOST_MEMORY_BYTES"


def available_bytes() -> int:
    """Bytes the ranks may take here: $MESHRUN_HOST_MEMORY_BYTES, else the smaller of
    MemAvailable and the room under this process's cgroup limit; 0 = unknown."""
    given = os.environ.get(HOST_MEMORY_ENV, "").strip()
    if given:
        return _given_bytes(given)
    found = [b for b in (_mem_available(), _cgroup_room()) if b is not None]
    return min(found) if found else 0


def _mem_available() -> int | None:
    try:
        for line in MEMINFO.read_text().splitlines():
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) * 1024  # kB
    except (OSError, ValueError, IndexError):
        return None
    return None


def _cgroup_room() -> int | None:
    """limit - usage of this process's cgroup v2 (None: no limit, or not cgroup v2)."""
    try:
        line = Path("/proc/self/cgroup").read_text().splitlines()[0]
        folder = CGROUP_ROOT / line.split("::", 1)[1].lstrip("/")
        limit = (folder / "memory.max").read_text().strip()
        if limit == "max":
            return None
        return max(int(limit) - int((folder / "memory.current").read_text()), 0)
    except (OSError, ValueError, IndexError):
        return None


def _given_bytes(text: str) -> int:
    if not text.isdigit() or int(text) <= 0:
        raise ConfigError([Problem(HOST_MEMORY_ENV, text, "must be a positive number of bytes",
                                   "e.g. 17179869184 for 16 GiB, or unset it to use MemAvailable")],
                          "Invalid environment")
    return int(text)
