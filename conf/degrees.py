"""The parallel degrees and the device mesh's axes: one table, said once.

Each degree is a knob `parallel.<key>` (conf/schema.py documents it for the user), a size on
ParallelSpec / ParallelDims, and an axis of the device mesh of the same name. Read from here:
the degree order of the schema and of error messages (DEGREES), the mesh order (MESH_AXES),
and the flattened axes the mesh keeps (FLATTENED_AXES), by ParallelSpec / ParallelDims
(parallel/dims.py), the mesh builder (parallel/mesh.py), the rules (conf/rules/
parallel_rules.py), the cost model's links (parallel/cost/comm.py) and the dry run.

A parallelism's pass, its rules and its cost terms are indexed in parallel/parallelisms.py:
adding a parallelism starts there, and its degree (if it brings one) starts here.
"""
from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class Degree:
    """One parallel degree: the knob parallel.<key> and the mesh axis named <key>."""

    key: str
    """Its schema key (`parallel.<key>`), its ParallelSpec field and its mesh axis' name."""
    mesh_position: int
    """Its place in the mesh order, 0 outermost: ranks are numbered row-major over the axes in
    this order (the last varies fastest), as `init_device_mesh` numbers them."""
    shards: str
    """What it splits over its ranks."""
    doc: str
    """One line: what it is."""

    @property
    def axis(self) -> str:
        """Its mesh axis: named as its key, so a layout, a rank's coordinates and the mesh
        are read by one name."""
        return self.key


DEGREE_TABLE = (
    Degree(key="dp_replicate", mesh_position=1, shards="the batch",
           doc="data-parallel replicas (DDP, or the replicate axis of HSDP)"),
    Degree(key="dp_shard", mesh_position=2,
           shards="the batch, and the training state under ZeRO/FSDP",
           doc="data-parallel ranks that shard state (the ZeRO/FSDP axis)"),
    Degree(key="tp", mesh_position=4,
           shards="attention heads and MLP columns (and the sequence between them under SP)",
           doc="tensor parallel (Megatron column/row pairs); neighbours, one node"),
    Degree(key="pp", mesh_position=0, shards="the blocks (pipeline stages)",
           doc="pipeline parallel; stages are the ranks farthest apart"),
    Degree(key="cp", mesh_position=3, shards="the sequence (exact causal attention)",
           doc="context parallel; its ranks hold the same weights (FSDP shards over them)"),
)
"""Every degree, in the schema's order."""

DEGREES = tuple(d.key for d in DEGREE_TABLE)
"""The parallel degrees in the schema's order (that of error messages); their product is the
world size."""

MESH_AXES = tuple(d.axis for d in sorted(DEGREE_TABLE, key=lambda d: d.mesh_position))
"""The mesh axes in mesh order: pipeline stages farthest apart, tensor-parallel peers next to
each other."""

FLATTENED_AXES = {
    "dp": ("dp_replicate", "dp_shard"),
    "dp_shard_cp": ("dp_shard", "cp"),
    "dp_cp": ("dp_replicate", "dp_shard", "cp"),
}
"""Groups over several mesh axes, by name: dp reads different data, dp_shard_cp is FSDP's
shard axis (cp ranks hold the same weights), dp_cp averages gradients and counts tokens."""
