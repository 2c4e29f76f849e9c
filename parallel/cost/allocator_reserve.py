"""What a GPU rank's caching allocator reserves beyond the bytes the plan counts. Torch-free.

The memory plan counts allocated bytes: the tensors a rank holds at its fullest moment (exact
on gloo ranks, tests/distributed/test_activation_memory.py). What a GPU shows (nvidia-smi,
torchtitan's and Megatron's memory logs, `torch.cuda.max_memory_reserved`) is the CUDA
caching allocator's reserved peak, and that is larger:
- freed blocks stay cached, and a cached block serves only the stream that freed it, so the
  collective streams (FSDP's all-gathers and reduce-scatters, NCCL's) keep pools of their own;
- a large cached block split for a smaller tensor cannot later serve a larger one, so
  activations of changing sizes, recompute's transients and the optimizer's temporaries
  leave gaps (fragmentation) that a new segment has to cover.
Neither follows from the layout alone (they depend on the order of allocations and on
PYTORCH_CUDA_ALLOC_CONF), so the plan takes the ratio of the reserved peak to the allocated
peak as one constant per device:

    reserved = reserved_ratio x the plan's peak

- `cluster.reserved_ratio` when set (>= 1);
- else the device's calibration (`meshrun plan --calibrate` on runs that logged both peaks:
  `fit_reserved_ratio`);
- else DEFAULT_RESERVED_RATIO, the public record's.

The fit verdict (parallel.cost.fit) stays on the allocated peak: its USABLE_FRACTION is the
allocator's slack, and a reserved pool at the device's size only makes the allocator free
its cache and retry (slower, not out of memory). The reserved figure is what to compare
with what a GPU shows.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path

from conf.run_dir.metrics_rows import read_metrics_rows
from conf.run_dir.paths import RunDir
from conf.spec import RunSpec
from parallel.cost.calibrate_store import load_entry

FITTED_KEY = "reserved_ratio"
"""The calibration entry's key, and the cluster knob's name."""
RESERVED_KEY, ALLOCATED_KEY = "mem_reserved_peak_gib", "mem_peak_gib"
"""What a CUDA run logs in each train row (training/metrics.memory_stats): the largest rank's
`torch.cuda.max_memory_reserved` and `max_memory_allocated`, in GiB, since the run began."""
DEFAULT_RESERVED_RATIO = 1.20
"""The median (1.196) over torchtitan's 18 published memory rows (Llama 3.1 8B, 70B and 405B on
H100: FSDP, FSDP+TP, FSDP+TP+PP, CP up to 256k tokens, fp8, compile; the reserved peak, the
max over ranks) of published / planned allocated peak, with cluster.calibration=none; for the
405B pipeline rows the planned peak includes the last stage's outputs the torch of Dec 2024
kept (benchmarks/published_rows.Row.kept_outputs), which are not the allocator's.
`benchmarks/published_record.py` prints each row's ratio, their median, and every row's error
under the median of the other 17 (leave one out: median 5.9%, 17 of 18 within 15%). The
ratios run from 1.08 (8B, compiled, on 128 GPUs) to 1.42 (70B under FSDP 32 x TP 8); a
calibration from the user's own runs replaces the default."""


@dataclass(frozen=True, slots=True, kw_only=True)
class Reserved:
    """A GPU rank's estimated reserved peak."""

    bytes: int
    ratio: float
    source: str
    """Where the ratio came from: cluster | calibration | default."""


def reserved_ratio(spec: RunSpec, calibration: dict) -> tuple[float, str]:
    """(ratio, source) for `spec`'s device: the knob, else `calibration` (the device's entry,
    calibrate_store.load_entry), else the default."""
    if spec.cluster.reserved_ratio > 0:
        return spec.cluster.reserved_ratio, "cluster"
    fitted = calibration.get(FITTED_KEY)
    if fitted is not None:
        return float(fitted), "calibration"
    return DEFAULT_RESERVED_RATIO, "default"


def estimate_reserved(spec: RunSpec, peak_bytes: int, *,
                      calibration: dict | None = None) -> Reserved | None:
    """The reserved peak of a rank whose allocated peak is `peak_bytes`; None off CUDA (a CPU
    rank's memory is the process's, and glibc's arenas follow no such ratio). `calibration`:
    the device's entry (default: read, calibrate_store.load_entry)."""
    if spec.training.device != "cuda":
        return None
    ratio, source = reserved_ratio(spec, load_entry(spec) if calibration is None
                                   else calibration)
    return Reserved(bytes=round(peak_bytes * ratio), ratio=ratio, source=source)


def _ratio(row: dict) -> float | None:
    """reserved / allocated peak of one train row; None where either is missing, not a finite
    positive number, or the ratio is below 1 (no allocator reserves less than it hands out)."""
    values = [row.get(key) for key in (RESERVED_KEY, ALLOCATED_KEY)]
    if not all(isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)
               and v > 0 for v in values):
        return None
    ratio = values[0] / values[1]
    return ratio if ratio >= 1.0 else None


def fit_reserved_ratio(rows: list[dict]) -> float | None:
    """The largest reserved/allocated ratio of the train rows in `rows` (metrics.jsonl rows),
    None when none logged both peaks (a CPU run, or one from before they were logged). Both
    peaks are running maxima since the run began, so later rows hold the earlier ones' peaks;
    the max over rows is the run's ratio at its fullest, as the plan wants it."""
    ratios = [r for r in (_ratio(row) for row in rows if row.get("kind") == "train")
              if r is not None]
    return max(ratios) if ratios else None


def read_reserved_ratio(run_dir: Path) -> float | None:
    """The fitted ratio of one run dir (fit_reserved_ratio of its metrics.jsonl)."""
    return fit_reserved_ratio(read_metrics_rows(RunDir(run_dir).metrics_file))
