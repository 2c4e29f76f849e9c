"""Throughput, MFU and memory. MFU = achieved FLOP/s per device / that device's dense peak.

On a GPU the peak comes from the device table. On a CPU there is no table, so the peak is a
measured matmul rate, and a measurement on a busy machine can come out far too low (one run
measured 9.4 GFLOP/s on a 2-core host that does ~225, and reported MFU 290%). So the CPU peak is
the best of several timings of two matrix sizes (rounds repeat until the sizes agree), clamped
to a generous physical bound, and an MFU above 100% is never reported: it is dropped from the row
(readers show "-") with a warning naming both numbers. Not capped at 100%: a capped value looks
like a real measurement, and it is not one; an absent value says "unknown".
The measured peak is stored per host and reused by every run there (training/cpu_peak_cache.py,
`training.cpu_peak`), so runs on one host divide by one number; `training.cpu_peak_flops`
overrides the measurement. Rank 0 logs the peak used as a metrics row (`peak_row`).
"""
from __future__ import annotations

import logging
import os
import resource
import time
from collections.abc import Callable
from dataclasses import dataclass

import torch
import torch.distributed as dist

from conf.choices import CpuPeakMode
from conf.run_dir.metrics_rows import PEAK_ROW_KIND
from conf.spec import RunSpec
from parallel.cost.devices import GIB, PeakFlops, gpu_peak
from parallel.cost.flops import flops_per_token, run_flops_convention
from training.cpu_peak_cache import host_peak
from training.loggers import PER_RANK_KEY
from training.precision import TORCH_DTYPES

log = logging.getLogger("meshrun.metrics")

FLOPS_ATTENTION = "full"
"""How the convention counts attention: 12*L*H*Q*T charges every query-key pair ("full"); a
causal count would be half of that. tests/unit/test_mfu.py checks this against the cost model."""

MATMUL_SIZES = (512, 1024)
MATMUL_REPEATS = 5
PEAK_ROUNDS = 4
SIZES_AGREE_WITHIN = 1.5
"""The two sizes' best rates must agree within this factor, else another round is timed."""

MAX_CORE_CLOCK_HZ = 6.0e9
"""Above any shipping CPU's boost clock: the upper bound stays generous."""
MAX_FLOP_PER_CYCLE = {"fp32": 64, "bf16": 1024, "fp16": 1024}
"""Per core: fp32 = 2 AVX-512 FMA units x 16 lanes x 2 FLOP; 16-bit = Intel AMX tiles (1024)."""
BUSY_FRACTION = 1 / 40
"""A measured fp32 peak below this fraction of the bound is reported as a busy machine."""

MeasureFn = Callable[[int], float]
"""FLOP/s of one best-of-repeats timing of an n x n matmul."""


def time_matmul_flops(n: int, dtype: torch.dtype, *, repeats: int = MATMUL_REPEATS,
                      timer: Callable[[], float] = time.perf_counter) -> float:
    """Best FLOP/s of `repeats` timings of an n x n x n matmul on this rank's threads."""
    a = torch.randn(n, n, dtype=dtype)
    b = torch.randn(n, n, dtype=dtype)
    torch.mm(a, b)  # warm-up
    best = float("inf")
    for _ in range(repeats):
        start = timer()
        torch.mm(a, b)
        best = min(best, timer() - start)
    return 2 * n**3 / max(best, 1e-12)


def cpu_peak_bound(dtype_name: str, threads: int) -> float:
    """A peak no CPU thread count can beat: threads x generous FLOP/cycle x MAX_CORE_CLOCK_HZ."""
    cores = max(1, min(threads, os.cpu_count() or threads))
    return cores * MAX_FLOP_PER_CYCLE.get(dtype_name, 64) * MAX_CORE_CLOCK_HZ


@dataclass(frozen=True)
class CpuPeak:
    flops: float
    source: str
    warnings: tuple[str, ...] = ()


def measure_cpu_peak(dtype_name: str, *, threads: int, measure: MeasureFn,
                     sizes: tuple[int, ...] = MATMUL_SIZES, rounds: int = PEAK_ROUNDS) -> CpuPeak:
    """The best of repeated matmul timings at two sizes, checked and clamped (see module doc).

    `measure(n)` times one n x n matmul (best of its repeats); tests pass a fake one.
    """
    best = {n: 0.0 for n in sizes}
    done = 0
    for done in range(1, rounds + 1):
        for n in sizes:
            best[n] = max(best[n], measure(n))
        if max(best.values()) <= SIZES_AGREE_WITHIN * min(best.values()):
            break
    flops = max(best.values())
    bound = cpu_peak_bound(dtype_name, threads)
    rates = ", ".join(f"{n}^3: {best[n] / 1e9:.1f}" for n in sizes)
    source = (f"measured {dtype_name} matmul on {threads} thread(s), best of {done} round(s) "
              f"[{rates} GFLOP/s]")
    warnings = []
    if max(best.values()) > SIZES_AGREE_WITHIN * min(best.values()):
        warnings.append(f"CPU peak: matmul sizes disagree after {done} rounds ({rates} GFLOP/s);"
                        " the machine looks busy. Set training.cpu_peak_flops for a trusted MFU.")
    if flops > bound:
        warnings.append(f"CPU peak: measured {flops / 1e9:.1f} GFLOP/s is above the physical "
                        f"bound {bound / 1e9:.1f} GFLOP/s (a timer glitch?); using the bound.")
        flops, source = bound, f"{source}, clamped to bound {bound / 1e9:.1f} GFLOP/s"
    elif dtype_name == "fp32" and flops < BUSY_FRACTION * bound:
        warnings.append(f"CPU peak: measured {flops / 1e9:.1f} GFLOP/s is under "
                        f"1/{round(1 / BUSY_FRACTION)} of the bound {bound / 1e9:.1f} GFLOP/s; the "
                        "machine looks busy and MFU may read high. Set training.cpu_peak_flops.")
    return CpuPeak(flops=flops, source=source, warnings=tuple(warnings))


def resolve_peak(spec: RunSpec, device: torch.device) -> PeakFlops:
    """The peak that MFU divides by, and where it comes from (always logged with MFU)."""
    peak = _peak(spec, device)
    log.info("MFU = achieved FLOP/s per device / peak %.4g FLOP/s (%s); FLOPs per token %d "
             "[%s; attention counted %s]", peak.flops, peak.source,
             flops_per_token(spec.model, spec.training.seq_len), run_flops_convention(spec),
             FLOPS_ATTENTION)
    return peak


def _peak(spec: RunSpec, device: torch.device) -> PeakFlops:
    dtype_name = spec.precision.compute_dtype.value
    if device.type == "cuda":
        name = torch.cuda.get_device_name(device)
        peak = gpu_peak(name, dtype_name)
        if peak is not None:
            return peak
        return PeakFlops(flops=float("nan"), source=f"unknown device {name}: MFU not computed")
    if spec.training.cpu_peak_flops > 0:
        return PeakFlops(flops=spec.training.cpu_peak_flops,
                         source="user (training.cpu_peak_flops)")
    return _shared_cpu_peak(dtype_name, spec.training.cpu_peak)


def peak_row(peak: PeakFlops, *, step: int) -> dict:
    """The metrics row naming the peak this leg's MFU divides by (conf/run_dir/outcomes.peak_of)."""
    return {"kind": PEAK_ROW_KIND, "step": step, "time": round(time.time(), 3),
            "peak_flops": peak.flops if peak.flops > 0 else None, "source": peak.source}


def _shared_cpu_peak(dtype_name: str, mode: CpuPeakMode) -> PeakFlops:
    """Rank 0 takes the host's stored CPU peak, or measures it (training/cpu_peak_cache.py)
    while the other ranks wait, then broadcasts it: at most one measurement per run instead of
    one per rank (0.1-4 s each on a loaded host), taken while the other ranks leave the cores
    quiet, and one peak that every rank divides by. Ranks
    on another host use rank 0's peak (set training.cpu_peak_flops for mixed CPU hosts)."""
    import torch.distributed as dist

    shared = dist.is_initialized() and dist.get_world_size() > 1
    box: list[PeakFlops | None] = [None]
    if not shared or dist.get_rank() == 0:
        threads = torch.get_num_threads()
        box[0] = host_peak(dtype_name, threads=threads, mode=mode,
                           measure=lambda: _measure_now(dtype_name, threads))
    if shared:
        dist.broadcast_object_list(box, src=0)
    return box[0]


def _measure_now(dtype_name: str, threads: int) -> tuple[float, str, tuple[str, ...]]:
    dtype = TORCH_DTYPES[dtype_name]
    measured = measure_cpu_peak(dtype_name, threads=threads,
                                measure=lambda n: time_matmul_flops(n, dtype))
    return measured.flops, measured.source, measured.warnings


_warned_over_peak: set[str] = set()


def mfu(*, tokens_per_s_per_device: float, flops_per_token: int, peak: PeakFlops) -> float | None:
    """Achieved / peak, or None where it cannot be right: an unknown peak, or over 100%
    (the peak was under-measured). The first impossible value per peak is logged with both
    numbers."""
    if not peak.flops > 0:  # unknown device (nan) or no peak
        return None
    achieved = tokens_per_s_per_device * flops_per_token
    value = achieved / peak.flops
    if value <= 1.0:
        return value
    if peak.source not in _warned_over_peak:
        _warned_over_peak.add(peak.source)
        log.warning("MFU would be %.0f%%: achieved %.4g FLOP/s per device > peak %.4g FLOP/s (%s). "
                    "The peak is too low (a busy machine when it was measured?); MFU is left out "
                    "of the metrics. Fix: training.cpu_peak=remeasure on a quiet machine, or "
                    "training.cpu_peak_flops.",
                    100 * value, achieved, peak.flops, peak.source)
    return None


def mfu_fields(*, tokens_per_s_per_device: float, flops_per_token: int,
               peak: PeakFlops) -> dict[str, float]:
    """{"mfu": value} for a metrics row, or {} where MFU is not meaningful (see `mfu`)."""
    value = mfu(tokens_per_s_per_device=tokens_per_s_per_device,
                flops_per_token=flops_per_token, peak=peak)
    return {} if value is None else {"mfu": value}


def memory_stats(device: torch.device) -> dict[str, float]:
    """CUDA allocated/reserved now and their peaks since the run began (the plan's peak, and
    the caching allocator's reserve over it: parallel/cost/allocator_reserve.py), or the CPU
    process's peak resident set size, in GiB."""
    if device.type == "cuda":
        return {"mem_allocated_gib": torch.cuda.memory_allocated(device) / GIB,
                "mem_reserved_gib": torch.cuda.memory_reserved(device) / GIB,
                "mem_peak_gib": torch.cuda.max_memory_allocated(device) / GIB,
                "mem_reserved_peak_gib": torch.cuda.max_memory_reserved(device) / GIB}
    peak_kib = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss  # KiB on Linux
    return {"mem_peak_gib": peak_kib * 1024 / GIB}


def memory_by_rank(device: torch.device, *, extra: dict[str, float] | None = None
                   ) -> dict[str, list[float]]:
    """Every rank's `memory_stats` (and `extra`, e.g. its step times), gathered: {stat: one
    value per rank, in rank order}. A collective (one all_gather): every rank calls it;
    without a process group, this rank's."""
    stats = {**memory_stats(device), **(extra or {})}
    keys = sorted(stats)
    local = torch.tensor([stats[k] for k in keys], dtype=torch.float64, device=device)
    gathered = [local]
    if dist.is_initialized():
        gathered = [torch.empty_like(local) for _ in range(dist.get_world_size())]
        dist.all_gather(gathered, local)
    values = torch.stack(gathered).cpu().tolist()
    return {key: [row[i] for row in values] for i, key in enumerate(keys)}


def memory_fields(by_rank: dict[str, list[float]]) -> dict:
    """A train row's memory: each stat's largest value over the ranks, and every rank's."""
    return {**{key: max(values) for key, values in by_rank.items()}, PER_RANK_KEY: by_rank}


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
