"""Build the device mesh for a `ParallelDims`: one mesh, named axes, passed explicitly.

Axes (size-1 axes included, so every name always exists): pp, dp_replicate, dp_shard, cp, tp.
Flattened axes, kept by `Meshes` (torch asks callers to keep flattened meshes themselves
rather than slice them from the root again):
  dp           = dp_replicate x dp_shard       ranks reading different data
  dp_shard_cp  = dp_shard x cp                 FSDP's shard axis (cp ranks hold the same weights)
  dp_cp        = dp_replicate x dp_shard x cp  gradient averaging and token counts
"""
from __future__ import annotations

from dataclasses import dataclass

import torch
from torch.distributed.device_mesh import DeviceMesh, init_device_mesh

from parallel.dims import MESH_AXES, ParallelDims

FLATTENED = {
    "dp": ("dp_replicate", "dp_shard"),
    "dp_shard_cp": ("dp_shard", "cp"),
    "dp_cp": ("dp_replicate", "dp_shard", "cp"),
}


@dataclass(frozen=True, slots=True)
class Meshes:
    root: DeviceMesh
    flattened: dict[str, DeviceMesh]

    def __getitem__(self, axis: str) -> DeviceMesh:
        """The 1-D mesh of a mesh axis or of a flattened axis."""
        return self.flattened[axis] if axis in self.flattened else self.root[axis]


def build_mesh(dims: ParallelDims, *, device: torch.device) -> Meshes:
    root = init_device_mesh(device.type, dims.shape, mesh_dim_names=MESH_AXES)
    flattened = {name: root[axes]._flatten(mesh_dim_name=name) for name, axes in FLATTENED.items()}
    return Meshes(root=root, flattened=flattened)


def fsdp_mesh(meshes: Meshes, dims: ParallelDims) -> DeviceMesh:
    """1-D shard mesh for FSDP, or 2-D (replicate, shard) for HSDP."""
    if dims.dp_replicate == 1:
        return meshes["dp_shard_cp"]
    if dims.cp == 1:
        return meshes.root["dp_replicate", "dp_shard"]
    return meshes.root["dp_replicate", "dp_shard_cp"]  # HSDP x CP: torch warns, still works
