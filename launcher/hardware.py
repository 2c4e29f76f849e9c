"""Probe the launching machine without importing torch (torch alone costs ~1.5 s)."""
from __future__ import annotations

import os
import shutil
import subprocess

from conf.spec import HostSpec

NVIDIA_SMI_TIMEOUT_S = 10


def probe_host() -> HostSpec:
    """GPU name, count and compute capability from nvidia-smi; CPU count from the OS."""
    cpus = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    gpus = _nvidia_gpus() if os.environ.get("CUDA_VISIBLE_DEVICES", "x") != "" else []
    if not gpus:
        return HostSpec(gpu_name="", gpu_count=0, compute_capability=0.0, cpu_count=cpus or 1)
    name, cc = gpus[0]
    return HostSpec(gpu_name=name, gpu_count=len(gpus), compute_capability=cc,
                    cpu_count=cpus or 1)


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
