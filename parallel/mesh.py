"""Build the device mesh for a `ParallelDims`: one mesh, named axes, passed explicitly.

Axes (size-1 axes included, so every name always exists): pp, dp_replicate, dp_shard, cp, tp.
Flattened axes:
  dp           = dp_replicate x dp_shard       ranks reading different data
  dp_shard_cp  = dp_shard x cp                 FSDP's shard axis (cp ranks hold the same weights)
  dp_cp        = dp_replicate x dp_shard x cp  gradient averaging and token counts
"""
from __future__ import annotations

import torch
from torch.distributed.device_mesh import DeviceMesh, init_device_mesh

from parallel.dims import MESH_AXES, ParallelDims

FLATTENED = {
    "dp": ("dp_replicate", "dp_shard"),
    "dp_shard_cp": ("dp_shard", "cp"),
    "dp_cp": ("dp_replicate", "dp_shard", "cp"),
}


def build_mesh(dims: ParallelDims, *, device: torch.device) -> DeviceMesh:
    mesh = init_device_mesh(device.type, dims.shape, mesh_dim_names=MESH_AXES)
    for name, axes in FLATTENED.items():
        mesh[axes]._flatten(mesh_dim_name=name)
    return mesh


def fsdp_mesh(mesh: DeviceMesh, dims: ParallelDims) -> DeviceMesh:
    """1-D shard mesh for FSDP, or 2-D (replicate, shard) for HSDP."""
    if dims.dp_replicate > 1:
        return mesh["dp_replicate", "dp_shard_cp"]
    return mesh["dp_shard_cp"]
