"""The device and network catalogue: dense peak FLOP/s per dtype, memory (HBM) size and
bandwidth, the intra-node (NVLink) and inter-node (InfiniBand) bandwidth per GPU and the GPUs
per node, and the link to host memory. Torch-free.

Peaks from vendor datasheets, never the 2:4-sparse numbers: the bf16/fp16 dense tensor-core
peak, and for fp32 runs the TF32 dense peak. Keys match substrings of the device name as CUDA
(or `cluster.gpu_name`) reports it; the first entry that matches and knows the fact asked for
wins, so longer names come first. The plan, the sweep preview and the MFU metric all read it.

Bandwidths are GB/s (1e9 bytes/s) per GPU in one direction, the figure a ring collective
moves data at (NVLink's "900 GB/s" for H100 is both directions summed: 450 per direction;
an NDR InfiniBand port is 400 Gb/s = 50 GB/s, one port per GPU on DGX/HGX nodes). Sources:
NVIDIA datasheets (A100 SXM4 40/80GB, H100 SXM5 and NVL (bf16 1,671 / TF32 835 TFLOP/s
with sparsity, halved here), H200 SXM, HGX B200) and the DGX A100/H100/
B200 user guides for the one-NIC-per-GPU InfiniBand fabric. The last row, `CPU_KEY`, is one
CPU core of a CPU run (gloo over shared memory/loopback): rough figures that
`meshrun plan --calibrate` replaces with this machine's own.
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
    hbm_gbps: float | None = None
    """Device memory (HBM) bandwidth, GB/s."""
    intra_node_gbps: float | None = None
    """Bandwidth to the other GPUs of its node (NVLink), GB/s per direction per GPU."""
    inter_node_gbps: float | None = None
    """Bandwidth to other nodes (InfiniBand, one NIC per GPU), GB/s per direction per GPU."""
    gpus_per_node: int | None = None
    """GPUs in the usual node of this device (HGX/DGX: 8)."""
    host_link_gbps: float | None = None
    """Bandwidth between the GPU and host memory (PCIe, or NVLink-C2C on Grace superchips),
    GB/s per direction as a device<->pinned-host copy reaches it: what activation offload
    moves over (parallel.cost.offload)."""
    fp8_flops: float | None = None
    """Dense fp8 tensor-core peak (E4M3/E5M2, fp32 accumulate); None: no fp8 tensor cores
    (A100 and older) or not known. Datasheet fp8 figures with sparsity, halved."""
    name_size_is_the_superchip: bool = False
    """Grace superchips name the CPU's and GPU's memory together ("NVIDIA GH200 480GB": 480 GB
    LPDDR5X beside 96 GB HBM3): a size in the name is not the GPU's."""


CPU_KEY = "CPU core"
"""The catalogue row of one CPU core (peaks per core; the plan multiplies by the cores a rank
gets)."""

_NVLINK3, _NVLINK4, _NVLINK5 = 300.0, 450.0, 900.0  # GB/s per direction per GPU
_IB_HDR, _IB_NDR = 25.0, 50.0  # 200 / 400 Gb/s per GPU
# Host link, per direction: a PCIe x16 link carries 32 GB/s raw at Gen4 and 64 at Gen5 per
# direction (the "64 / 128 GB/s" of the A100 / H100 datasheets are both directions summed);
# pinned device<->host copies reach about 80% of that after packet overhead (CUDA's
# bandwidthTest: ~25 GB/s on Gen4, ~50 on Gen5). HGX B200 hosts attach each GPU with PCIe
# Gen5 x16 as well. Grace superchips (GH200, GB200) reach the CPU's memory over
# NVLink-C2C, 900 GB/s both directions: 450 per direction (nominal; calibrate). Sources:
# NVIDIA A100/H100/H200 datasheets (PCIe Gen4 64 GB/s, Gen5 128 GB/s), the Grace Hopper
# superchip datasheet (NVLink-C2C 900 GB/s), the PCI-SIG per-generation rates.
_PCIE4, _PCIE5, _C2C = 25.0, 50.0, 450.0

DEVICES: tuple[Device, ...] = (
    Device("GB200", 2.5e15, 1.25e15, 186, hbm_gbps=8000, intra_node_gbps=_NVLINK5,
           inter_node_gbps=_IB_NDR, gpus_per_node=4, host_link_gbps=_C2C, fp8_flops=5e15,
           name_size_is_the_superchip=True),
    Device("B200", 2.25e15, 1.1e15, 180, hbm_gbps=8000, intra_node_gbps=_NVLINK5,
           inter_node_gbps=_IB_NDR, gpus_per_node=8,
           host_link_gbps=_PCIE5, fp8_flops=4.5e15),  # HGX B200: 18 PF dense bf16 / 8 GPUs
    # GH200 before H200 (its name contains "H200"): an H100-class GPU with HBM3 96 GB at
    # 4 TB/s (the 144 GB HBM3e part says its size in its name), its Grace CPU over C2C
    Device("GH200", 989e12, 494e12, 96, hbm_gbps=4000, intra_node_gbps=_NVLINK4,
           inter_node_gbps=_IB_NDR, gpus_per_node=4, host_link_gbps=_C2C, fp8_flops=1979e12,
           name_size_is_the_superchip=True),
    Device("H200", 989e12, 494e12, 141, hbm_gbps=4800, intra_node_gbps=_NVLINK4,
           inter_node_gbps=_IB_NDR, gpus_per_node=8, host_link_gbps=_PCIE5, fp8_flops=1979e12),
    Device("H100 PCIe", 756e12, 378e12, 80, hbm_gbps=2000, intra_node_gbps=32.0,
           inter_node_gbps=_IB_NDR, gpus_per_node=8,
           host_link_gbps=_PCIE5, fp8_flops=1513e12),  # PCIe Gen5 x16 between GPUs
    Device("H100 NVL", 835e12, 417e12, 94, hbm_gbps=3900, intra_node_gbps=300.0,
           inter_node_gbps=_IB_NDR, gpus_per_node=8,
           host_link_gbps=_PCIE5, fp8_flops=1671e12),  # NVLink bridge 600 GB/s both ways
    Device("H100", 989e12, 494e12, 80, hbm_gbps=3350, intra_node_gbps=_NVLINK4,
           inter_node_gbps=_IB_NDR, gpus_per_node=8, host_link_gbps=_PCIE5,
           fp8_flops=1979e12),  # H100 SXM5
    Device("H800", 989e12, 494e12, 80, hbm_gbps=3350, intra_node_gbps=200.0,
           inter_node_gbps=_IB_NDR, gpus_per_node=8,
           host_link_gbps=_PCIE5, fp8_flops=1979e12),  # NVLink cut to 400 GB/s both ways
    Device("A100-SXM4-80GB", 312e12, 156e12, 80, hbm_gbps=2039, intra_node_gbps=_NVLINK3,
           inter_node_gbps=_IB_HDR, gpus_per_node=8, host_link_gbps=_PCIE4),
    Device("A100 80GB", 312e12, 156e12, 80, hbm_gbps=2039, intra_node_gbps=_NVLINK3,
           inter_node_gbps=_IB_HDR, gpus_per_node=8, host_link_gbps=_PCIE4),
    Device("A100", 312e12, 156e12, 40, hbm_gbps=1555, intra_node_gbps=_NVLINK3,
           inter_node_gbps=_IB_HDR, gpus_per_node=8, host_link_gbps=_PCIE4),  # SXM4 40GB
    Device("A800", 312e12, 156e12, 80),
    Device("L40S", 362e12, 183e12, 48, fp8_flops=733e12),
    Device("L4", 121e12, 60e12, 24, fp8_flops=242e12),
    Device("A10G", 70e12, 35e12, 24),
    Device("A10", 125e12, 62.5e12, 24),
    Device("RTX 4090", 165e12, 82.6e12, 24),
    Device("RTX 3090", 71e12, 35.6e12, 24),
    Device("V100", 125e12, 15.7e12, 16),
    Device("MI300X", 1307e12, 654e12, 192, fp8_flops=2615e12),
    Device("MI250X", 383e12, 95.7e12, 128),
    # One core, AVX2 FMA at ~2.5 GHz: 2 x 8 fp32 lanes x 2 = 32 FLOP/cycle; gloo between
    # processes of one machine: a few GB/s and ~50 us per message (rough: calibrate).
    Device(CPU_KEY, None, 80e9, None, hbm_gbps=10, intra_node_gbps=2.0, inter_node_gbps=1.0),
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


def gpu_fp8_peak(device_name: str) -> float | None:
    """Dense fp8 peak FLOP/s of a GPU; None where it has no fp8 tensor cores (or unknown)."""
    device = _find(device_name, "low_precision_flops", match_case=False)
    return device.fp8_flops if device is not None else None


def gpu_memory_bytes(gpu_name: str) -> float | None:
    """Bytes of one GPU: from its name ("...-80GB"), else from the table (the name matches
    case-sensitively here, unlike `gpu_peak`); None if neither says. A Grace superchip's name
    sizes the superchip, so its row answers (the 144 GB HBM3e GH200 then reads as 96 GB: the
    verdict errs on the safe side)."""
    device = _find(gpu_name, "memory_gib", match_case=True)
    match = re.search(r"(\d+)\s*GB", gpu_name)
    if match and not (device is not None and device.name_size_is_the_superchip):
        return float(match.group(1)) * GIB
    return device.memory_gib * GIB if device is not None else None


def _find(device_name: str, field: str, *, match_case: bool) -> Device | None:
    name = device_name if match_case else device_name.lower()
    for device in DEVICES:
        key = device.key if match_case else device.key.lower()
        if key in name and getattr(device, field) is not None:
            return device
    return None


def device_facts(device_name: str) -> Device | None:
    """The first catalogue row whose key is in `device_name` (any case), whatever it knows."""
    name = device_name.lower()
    return next((d for d in DEVICES if d.key.lower() in name), None)
