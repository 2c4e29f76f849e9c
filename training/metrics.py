"""Throughput, MFU and memory. MFU = achieved FLOP/s per device / that device's dense peak."""
from __future__ import annotations

import resource
import time

import torch

from conf.spec import RunSpec
from parallel.cost.devices import GIB, PeakFlops, gpu_peak
from training.precision import TORCH_DTYPES

MATMUL_N = 512
MATMUL_REPEATS = 8


def measure_cpu_matmul_peak(dtype: torch.dtype) -> float:
    """Best FLOP/s of an N^3 matmul on this rank's threads: the CPU "peak" MFU divides by."""
    a = torch.randn(MATMUL_N, MATMUL_N, dtype=dtype)
    b = torch.randn(MATMUL_N, MATMUL_N, dtype=dtype)
    torch.mm(a, b)  # warm-up
    best = float("inf")
    for _ in range(MATMUL_REPEATS):
        start = time.perf_counter()
        torch.mm(a, b)
        best = min(best, time.perf_counter() - start)
    return 2 * MATMUL_N**3 / best


def resolve_peak(spec: RunSpec, device: torch.device) -> PeakFlops:
    """The peak that MFU divides by, and where it comes from (always logged with MFU)."""
    dtype_name = spec.precision.compute_dtype.value
    if device.type == "cuda":
        name = torch.cuda.get_device_name(device)
        peak = gpu_peak(name, dtype_name)
        if peak is not None:
            return peak
        return PeakFlops(flops=float("nan"), source=f"unknown device {name}: MFU not computed")
    if spec.training.cpu_peak_flops > 0:
        return PeakFlops(flops=spec.training.cpu_peak_flops, source="user (training.cpu_peak_flops)")
    flops = measure_cpu_matmul_peak(TORCH_DTYPES[dtype_name])
    threads = torch.get_num_threads()
    return PeakFlops(flops=flops, source=f"measured {dtype_name} matmul {MATMUL_N}^3 "
                                         f"on {threads} thread(s)")


def mfu(*, tokens_per_s_per_device: float, flops_per_token: int, peak: PeakFlops) -> float:
    return tokens_per_s_per_device * flops_per_token / peak.flops


def memory_stats(device: torch.device) -> dict[str, float]:
    """CUDA allocated/reserved/peak, or the CPU process's peak resident set size, in GiB."""
    if device.type == "cuda":
        return {"mem_allocated_gib": torch.cuda.memory_allocated(device) / GIB,
                "mem_reserved_gib": torch.cuda.memory_reserved(device) / GIB,
                "mem_peak_gib": torch.cuda.max_memory_allocated(device) / GIB}
    peak_kib = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss  # KiB on Linux
    return {"mem_peak_gib": peak_kib * 1024 / GIB}


class StepTimer:
    """Wall time of a step, synchronising CUDA so queued kernels are counted."""

    def __init__(self, device: torch.device) -> None:
        self.device = device
        self.start = 0.0

    def begin(self) -> None:
        self._sync()
        self.start = time.perf_counter()

    def elapsed_s(self) -> float:
        self._sync()
        return time.perf_counter() - self.start

    def _sync(self) -> None:
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
