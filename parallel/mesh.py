"""Build the device mesh for a `ParallelDims`: one mesh, named axes, passed explicitly.

Axes, in conf/degrees.py's mesh order (MESH_AXES: pp, dp_replicate, dp_shard, cp, tp); the
mesh holds only those of size > 1 (and dp_shard under HSDP, whose FSDP mesh is 2-D even
when the shard size is 1), as
torchtitan's does: every axis of a gloo mesh is a process group with its own TCP loop thread,
which wakes every 10 ms whether or not it is used (four idle ones for ZeRO-3 on two ranks
took 2-3x the compute threads' context switches). An absent axis has no group
(`Meshes.group` -> None), as a size-1 one had none to talk to.
Flattened axes (conf/degrees.py's FLATTENED_AXES), kept by `Meshes` (torch asks callers to
keep flattened meshes themselves rather than slice them from the root again); one of a single
axis of size > 1 is that axis:
  dp           = dp_replicate x dp_shard       ranks reading different data
  dp_shard_cp  = dp_shard x cp                 FSDP's shard axis (cp ranks hold the same weights)
  dp_cp        = dp_replicate x dp_shard x cp  gradient averaging and token counts
With expert parallelism (parallel.ep > 1) dp_cp is also unflattened into (efsdp, ep): ep the
innermost ep ranks of dp_cp (inside one dp_shard x cp group, as ep divides dp_shard x cp),
which hold different experts; efsdp the dp_cp / ep ranks that hold the same experts, over
which the experts' FSDP shards them (parallel/expert_parallel.py).
"""
from __future__ import annotations

from dataclasses import dataclass

import torch
from torch.distributed.device_mesh import DeviceMesh, init_device_mesh

from conf.degrees import FLATTENED_AXES, MESH_AXES
from parallel.dims import ParallelDims


@dataclass(frozen=True, slots=True)
class Meshes:
    root: DeviceMesh
    flattened: dict[str, DeviceMesh]

    def __getitem__(self, axis: str) -> DeviceMesh:
        """The 1-D mesh of a mesh axis or of a flattened axis (KeyError if it is absent:
        size 1, see the module docstring)."""
        if axis in self.flattened:
            return self.flattened[axis]
        if axis not in (self.root.mesh_dim_names or ()):
            raise KeyError(f"mesh axis {axis!r} has size 1: the mesh has no group for it")
        return self.root[axis]

    def group(self, axis: str):
        """Process group of `axis` (a mesh axis or a flattened one); None if it is size 1."""
        try:
            mesh = self[axis]
        except KeyError:  # absent: size 1
            return None
        return None if mesh.size() == 1 else mesh.get_group()


def build_mesh(dims: ParallelDims, *, device: torch.device) -> Meshes:
    kept = mesh_axes(dims)
    root = init_device_mesh(device.type, tuple(getattr(dims, axis) for axis in kept),
                            mesh_dim_names=kept)
    flattened = {}
    for name, axes in FLATTENED_AXES.items():
        present = tuple(axis for axis in axes if axis in kept)
        if len(present) > 1:
            flattened[name] = root[present]._flatten(mesh_dim_name=name)
        elif present:
            flattened[name] = root[present[0]]
    if dims.ep > 1:
        flattened.update(expert_meshes(flattened["dp_cp"], dims))
    return Meshes(root=root, flattened=flattened)


def expert_meshes(dp_cp: DeviceMesh, dims: ParallelDims) -> dict[str, DeviceMesh]:
    """The ep axis (ranks holding different experts) and the efsdp axis (ranks holding the
    same experts), from the dp_cp ranks (see the module docstring)."""
    split = dp_cp._unflatten(0, (dims.expert_fsdp_shards, dims.ep), ("efsdp", "ep"))
    return {"ep": split["ep"], "efsdp": split["efsdp"]}


def mesh_axes(dims: ParallelDims) -> tuple[str, ...]:
    """The axes the mesh holds: size > 1, and dp_shard under HSDP (see the docstring)."""
    hsdp = dims.uses_fsdp and dims.dp_replicate > 1
    return tuple(axis for axis in MESH_AXES
                 if getattr(dims, axis) > 1 or (axis == "dp_shard" and hsdp))


def fsdp_mesh(meshes: Meshes, dims: ParallelDims) -> DeviceMesh:
    """1-D shard mesh for FSDP, or 2-D (replicate, shard) for HSDP."""
    if dims.dp_replicate == 1:
        return meshes["dp_shard_cp"]
    if dims.cp == 1:
        return meshes.root["dp_replicate", "dp_shard"]
    return meshes.root["dp_replicate", "dp_shard_cp"]  # HSDP x CP: torch warns, still works
