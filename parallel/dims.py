"""`ParallelDims`: the frozen layout every parallel pass reads, and each rank's place in it.

Torch-free, so the dry run and the plan can show each rank's coordinates and groups.
Ranks are laid out row-major over MESH_AXES (the last axis, tp, varies fastest), exactly as
`init_device_mesh` numbers them: tensor-parallel peers are neighbours (one node), pipeline
stages are the farthest apart.
"""
from __future__ import annotations

from dataclasses import dataclass
from itertools import product

from conf.spec import ParallelSpec

MESH_AXES = ("pp", "dp_replicate", "dp_shard", "cp", "tp")


@dataclass(frozen=True, slots=True, kw_only=True)
class ParallelDims:
    pp: int
    dp_replicate: int
    dp_shard: int
    cp: int
    tp: int
    zero: int

    @classmethod
    def from_spec(cls, parallel: ParallelSpec) -> "ParallelDims":
        return cls(pp=parallel.pp, dp_replicate=parallel.dp_replicate,
                   dp_shard=parallel.dp_shard, cp=parallel.cp, tp=parallel.tp, zero=parallel.zero)

    @property
    def shape(self) -> tuple[int, ...]:
        return tuple(getattr(self, axis) for axis in MESH_AXES)

    @property
    def world_size(self) -> int:
        size = 1
        for degree in self.shape:
            size *= degree
        return size

    @property
    def dp(self) -> int:
        """Ranks that read different data (the batch is split over them)."""
        return self.dp_replicate * self.dp_shard

    @property
    def dp_cp(self) -> int:
        """Ranks that hold different tokens of a step: gradients are averaged over them."""
        return self.dp * self.cp

    @property
    def uses_fsdp(self) -> bool:
        return self.zero in (2, 3) and self.dp_shard * self.cp * self.dp_replicate > 1

    @property
    def uses_ddp(self) -> bool:
        return self.zero in (0, 1) and self.dp_cp > 1

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
    load = [0] * n
    owners = [0] * len(sizes)
    for index in sorted(range(len(sizes)), key=lambda i: (-sizes[i], i)):
        rank = min(range(n), key=lambda r: (load[r], r))
        owners[index] = rank
        load[rank] += sizes[index]
    return owners


def pipeline_stage_ids(*, pp: int, virtual_stages: int, pp_rank: int) -> list[int]:
    """Global stage indices pipeline rank `pp_rank` runs: r, r + pp, r + 2pp, ... (loop
    style, what every schedule meshrun offers expects)."""
    return [pp_rank + k * pp for k in range(virtual_stages)]
