"""`ParallelDims`: the frozen layout every parallel pass reads, and each rank's place in it.

Torch-free, so the dry run and the plan can show each rank's coordinates and groups.
Ranks are laid out row-major over MESH_AXES (conf/degrees.py: the last axis, tp, varies
fastest), exactly as `init_device_mesh` numbers them: tensor-parallel peers are neighbours
(one node), pipeline stages are the farthest apart.
"""
from __future__ import annotations

import heapq
from dataclasses import dataclass
from itertools import product

from conf.degrees import DEGREES, MESH_AXES
from conf.schema import ParallelConfig
from conf.spec import ParallelSpec, spec_from_config

CHECKPOINT_LAYOUT_KEYS = (*DEGREES, "zero", "pp_virtual_stages", "ep")
"""Besides the world size, what a checkpoint's layout must match for an exact resume."""
LAYOUT_DEFAULTS = {"ep": 1}
"""A layout key a checkpoint may predate, and the value it was saved under then."""


SPEC_SIZES = ("zero", "dp", "dp_cp", "fsdp_shards", "world_size", "uses_fsdp", "uses_ddp", "ep",
              "expert_fsdp_shards")
"""Besides the degrees, what ParallelDims reads through from its ParallelSpec."""


def _reads_spec(cls: type) -> type:
    """Give `cls` a read-through property for each degree and each of SPEC_SIZES."""
    for name in (*DEGREES, *SPEC_SIZES):
        setattr(cls, name, property(lambda self, name=name: getattr(self.parallel, name),
                                    doc=f"`ParallelSpec.{name}` of the layout."))
    return cls


@_reads_spec
@dataclass(frozen=True, slots=True)
class ParallelDims:
    """Each rank's place in the layout of `parallel`, the one source of the degrees (and of
    the sizes derived from them, which are ParallelSpec properties): each degree of
    conf/degrees.py and each of SPEC_SIZES reads through to it (`dims.cp`, `dims.dp`)."""

    parallel: ParallelSpec

    @classmethod
    def from_spec(cls, parallel: ParallelSpec) -> "ParallelDims":
        return cls(parallel)

    @classmethod
    def single(cls) -> "ParallelDims":
        """One process: every degree 1 (the schema's defaults otherwise)."""
        config = ParallelConfig(name="single", **dict.fromkeys(DEGREES, 1))
        return cls(spec_from_config(ParallelSpec, config, pp_microbatches=1))

    def checkpoint_degrees(self) -> dict:
        """What must match for an exact resume (per-rank files): world size and degrees."""
        return {"world_size": self.world_size,
                **{key: getattr(self.parallel, key) for key in CHECKPOINT_LAYOUT_KEYS}}

    @property
    def shape(self) -> tuple[int, ...]:
        return tuple(getattr(self, axis) for axis in MESH_AXES)

    def coordinates(self, rank: int) -> dict[str, int]:
        """{axis: index} of `rank` on every mesh axis."""
        coords, rest = {}, rank
        for axis in reversed(MESH_AXES):
            size = getattr(self, axis)
            coords[axis] = rest % size
            rest //= size
        return {axis: coords[axis] for axis in MESH_AXES}

    def rank_of(self, coords: dict[str, int]) -> int:
        rank = 0
        for axis in MESH_AXES:
            rank = rank * getattr(self, axis) + coords[axis]
        return rank

    def peers(self, rank: int, axes: tuple[str, ...]) -> list[int]:
        """Ranks that share every coordinate of `rank` except along `axes` (its group there)."""
        base = self.coordinates(rank)
        ranges = [range(getattr(self, axis)) for axis in axes]
        return sorted(self.rank_of({**base, **dict(zip(axes, values))})
                      for values in product(*ranges))

    def ep_peers(self, rank: int) -> list[int]:
        """The ranks holding the other experts of `rank`'s ep group: the innermost ep of its
        dp x cp ranks (parallel/mesh.py `expert_meshes`); [rank] without EP."""
        group = self.peers(rank, ("dp_replicate", "dp_shard", "cp"))  # rank order = dp_cp order
        start = group.index(rank) // self.ep * self.ep
        return group[start:start + self.ep]

    def dp_rank(self, rank: int) -> int:
        """Index of `rank`'s data shard among the dp ranks."""
        c = self.coordinates(rank)
        return c["dp_replicate"] * self.dp_shard + c["dp_shard"]

    def reports_loss(self, rank: int) -> bool:
        """One rank per distinct set of tokens counts the loss: tp index 0, last pipeline stage."""
        c = self.coordinates(rank)
        return c["tp"] == 0 and c["pp"] == self.pp - 1


def zero1_owners(sizes: list[int], n: int) -> list[int]:
    """Owner (0..n-1) of each parameter: largest first, each to the least-loaded rank
    (ties to the lower rank). Deterministic, so every rank and the planner agree."""
    loads = [(0, rank) for rank in range(n)]  # a heap of (load, rank): its top is the
    owners = [0] * len(sizes)                  # least-loaded rank, ties to the lower one
    for index in sorted(range(len(sizes)), key=lambda i: (-sizes[i], i)):
        load, rank = heapq.heappop(loads)
        owners[index] = rank
        heapq.heappush(loads, (load + sizes[index], rank))
    return owners


def pipeline_stage_ids(*, pp: int, virtual_stages: int, pp_rank: int) -> list[int]:
    """Global stage indices pipeline rank `pp_rank` runs: r, r + pp, r + 2pp, ... (loop
    style, what every schedule meshrun offers expects)."""
    return [pp_rank + k * pp for k in range(virtual_stages)]
