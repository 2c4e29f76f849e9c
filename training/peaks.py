"""Dense peak FLOP/s per device, from vendor datasheets (never the 2:4-sparse numbers).

Torch-free: the plan and the MFU metric both use it. Keys match substrings of the device
name as CUDA reports it; the first match wins, so longer names come first.
"""
from __future__ import annotations

from dataclasses import dataclass

# name substring -> (bf16/fp16 dense tensor-core peak, fp32 peak used for fp32 runs (TF32 dense))
GPU_PEAKS: tuple[tuple[str, float, float], ...] = (
    ("GB200", 2.5e15, 1.25e15),
    ("B200", 2.25e15, 1.1e15),
    ("H200", 989e12, 494e12),
    ("H100 PCIe", 756e12, 378e12),
    ("H100", 989e12, 494e12),
    ("H800", 989e12, 494e12),
    ("A100", 312e12, 156e12),
    ("A800", 312e12, 156e12),
    ("L40S", 362e12, 183e12),
    ("L4", 121e12, 60e12),
    ("A10G", 70e12, 35e12),
    ("A10", 125e12, 62.5e12),
    ("RTX 4090", 165e12, 82.6e12),
    ("RTX 3090", 71e12, 35.6e12),
    ("V100", 125e12, 15.7e12),
    ("MI300X", 1307e12, 654e12),
    ("MI250X", 383e12, 95.7e12),
)


@dataclass(frozen=True, slots=True, kw_only=True)
class PeakFlops:
    flops: float
    source: str
    """Where the number comes from: 'table:<name>', 'measured matmul' or 'user'."""


def gpu_peak(device_name: str, dtype: str) -> PeakFlops | None:
    """Dense peak of a GPU for `dtype` (fp32 uses the TF32 tensor-core peak), None if unknown."""
    for key, low_precision, fp32 in GPU_PEAKS:
        if key.lower() in device_name.lower():
            flops = fp32 if dtype == "fp32" else low_precision
            return PeakFlops(flops=flops, source=f"table:{key} {dtype} dense")
    return None
