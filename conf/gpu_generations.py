"""Compute capability by GPU model name, for a cluster config that names its GPUs
(`cluster.gpu_name`) without `cluster.gpu_compute_capability`: the precision rules (bf16
needs 8.0, fp8 8.9) then judge the GPUs the run will have, not a default. Torch-free."""
from __future__ import annotations

import re

COMPUTE_CAPABILITY = {
    "V100": 7.0, "T4": 7.5, "A100": 8.0, "A800": 8.0, "A30": 8.0, "A10": 8.6, "A40": 8.6,
    "A6000": 8.6, "L4": 8.9, "L40": 8.9, "L40S": 8.9, "H100": 9.0, "H800": 9.0, "H200": 9.0,
    "H20": 9.0, "GH200": 9.0, "B200": 10.0, "GB200": 10.0, "B300": 10.3,
}
"""NVIDIA's table (developer.nvidia.com/cuda-gpus), by the model word in a GPU's name."""


def known_compute_capability(gpu_name: str) -> float:
    """The compute capability of the model `gpu_name` names ("A100 80GB", "NVIDIA H100 80GB
    HBM3"), or 0.0 (unknown) when no word of it is a model in the table."""
    for word in re.split(r"[\s_-]+", gpu_name.upper()):
        if word in COMPUTE_CAPABILITY:
            return COMPUTE_CAPABILITY[word]
    return 0.0
