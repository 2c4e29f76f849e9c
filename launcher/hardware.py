"""Probe the launching machine without importing torch (torch alone costs ~1.5 s)."""
from __future__ import annotations

import os
import shutil
import subprocess
from functools import lru_cache

from conf.spec import HostSpec
from launcher.host_memory import available_bytes
from parallel.cost.devices import gpu_memory_bytes

NVIDIA_SMI_TIMEOUT_S = 10


def probe_host() -> HostSpec:
    """GPU name, count and compute capability from nvidia-smi; CPU count and the memory the
    ranks may take (host_memory.available_bytes) from the OS."""
    cpus = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    gpus = _nvidia_gpus() if os.environ.get("CUDA_VISIBLE_DEVICES", "x") != "" else []
    memory = available_bytes()
    if not gpus:
        return HostSpec(gpu_name="", gpu_count=0, compute_capability=0.0, cpu_count=cpus or 1,
                        mem_available_bytes=memory)
    name, cc = gpus[0]
    return HostSpec(gpu_name=name, gpu_count=len(gpus), compute_capability=cc,
                    cpu_count=cpus or 1, mem_available_bytes=memory)


def _nvidia_gpus() -> list[tuple[str, float]]:
    exe = shutil.which("nvidia-smi")
    if exe is None:
        return []
    try:
        out = subprocess.run([exe, "--query-gpu=name,compute_cap", "--format=csv,noheader"],
                             capture_output=True, text=True, timeout=NVIDIA_SMI_TIMEOUT_S)
    except (OSError, subprocess.TimeoutExpired):
        return []
    if out.returncode != 0:
        return []
    gpus = []
    for line in out.stdout.strip().splitlines():
        name, _, cc = line.rpartition(",")
        try:
            gpus.append((name.strip(), float(cc)))
        except ValueError:
            continue
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    if visible:
        gpus = gpus[: len(visible.split(","))]
    return gpus


def device_memory(gpu_name: str, *, local: bool) -> float | None:
    """Bytes of one GPU: from its name in the device catalogue, or nvidia-smi on this machine."""
    known = gpu_memory_bytes(gpu_name)
    if known is not None:
        return known
    return _local_gpu_memory() if local else None


@lru_cache(maxsize=1)
def _local_gpu_memory() -> float | None:
    exe = shutil.which("nvidia-smi")
    if not exe:
        return None
    try:
        out = subprocess.run([exe, "--query-gpu=memory.total", "--format=csv,noheader,nounits"],
                             capture_output=True, text=True, timeout=NVIDIA_SMI_TIMEOUT_S)
        return float(out.stdout.split()[0]) * 1024**2 if out.returncode == 0 else None
    except (OSError, subprocess.TimeoutExpired, ValueError, IndexError):
        return None
