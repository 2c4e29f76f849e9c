"""The device catalogue: dense peak FLOP/s per dtype and memory (HBM) per GPU. Torch-free.

Peaks from vendor datasheets, never the 2:4-sparse numbers: the bf16/fp16 dense tensor-core
peak, and for fp32 runs the TF32 dense peak. Keys match substrings of the device name as CUDA
(or `cluster.gpu_name`) reports it; the first entry that matches and knows the fact asked for
wins, so longer names come first. The plan, the sweep preview and the MFU metric all read it.
"""
from __future__ import annotations

import re
from dataclasses import dataclass

GIB = 1024**3
"""Bytes in a GiB: every module that prints or compares GiB uses this one."""


@dataclass(frozen=True, slots=True)
class Device:
    key: str
    """A substring of the device name."""
    low_precision_flops: float | None
    """bf16/fp16 dense tensor-core peak; None: not in the table (a shorter key answers)."""
    fp32_flops: float | None
    """fp32 (TF32 dense) peak."""
    memory_gib: float | None
    """Device memory in GiB, for names that do not say it (e.g. "...-80GB" does)."""


DEVICES: tuple[Device, ...] = (
    Device("GB200", 2.5e15, 1.25e15, 186),
    Device("B200", 2.25e15, 1.1e15, 180),
    Device("H200", 989e12, 494e12, 141),
    Device("H100 PCIe", 756e12, 378e12, 80),
    Device("H100 NVL", None, None, 94),
    Device("H100", 989e12, 494e12, 80),
    Device("H800", 989e12, 494e12, 80),
    Device("A100", 312e12, 156e12, 40),
    Device("A800", 312e12, 156e12, 80),
    Device("L40S", 362e12, 183e12, 48),
    Device("L4", 121e12, 60e12, 24),
    Device("A10G", 70e12, 35e12, 24),
    Device("A10", 125e12, 62.5e12, 24),
    Device("RTX 4090", 165e12, 82.6e12, 24),
    Device("RTX 3090", 71e12, 35.6e12, 24),
    Device("V100", 125e12, 15.7e12, 16),
    Device("MI300X", 1307e12, 654e12, 192),
    Device("MI250X", 383e12, 95.7e12, 128),
)


@dataclass(frozen=True, slots=True, kw_only=True)
class PeakFlops:
    flops: float
    source: str
    """Where the number comes from: 'table:<name>', 'measured matmul' or 'user'."""


def gpu_peak(device_name: str, dtype: str) -> PeakFlops | None:
    """Dense peak of a GPU for `dtype` (fp32 uses the TF32 tensor-core peak), None if unknown.
    The name matches without regard to case."""
    field = "fp32_flops" if dtype == "fp32" else "low_precision_flops"
    device = _find(device_name, field, match_case=False)
    if device is None:
        return None
    return PeakFlops(flops=getattr(device, field), source=f"table:{device.key} {dtype} dense")


def gpu_memory_bytes(gpu_name: str) -> float | None:
    """Bytes of one GPU: from its name ("...-80GB"), else from the table (the name matches
    case-sensitively here, unlike `gpu_peak`); None if neither says."""
    match = re.search(r"(\d+)\s*GB", gpu_name)
    if match:
        return float(match.group(1)) * GIB
    device = _find(gpu_name, "memory_gib", match_case=True)
    return device.memory_gib * GIB if device is not None else None


def _find(device_name: str, field: str, *, match_case: bool) -> Device | None:
    name = device_name if match_case else device_name.lower()
    for device in DEVICES:
        key = device.key if match_case else device.key.lower()
        if key in name and getattr(device, field) is not None:
            return device
    return None
