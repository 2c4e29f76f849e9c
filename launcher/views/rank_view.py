"""The dry run's picture of the parallel layout: each rank's coordinates, the ranks it shares
each axis with, and its memory estimate under this layout."""
from __future__ import annotations

from rich.table import Table

from conf.degrees import MESH_AXES
from conf.spec import RunSpec
from parallel.cost.devices import GIB
from parallel.cost.memory import estimate_memory
from parallel.dims import ParallelDims

MAX_RANK_ROWS = 16
GROUP_AXES = {"tp": ("tp",), "dp": ("dp_replicate", "dp_shard"), "pp": ("pp",), "cp": ("cp",)}


def layout_line(spec: RunSpec) -> str:
    p = spec.parallel
    degrees = " x ".join(f"{axis} {getattr(p, axis)}" for axis in MESH_AXES)
    zero = {0: "replicated (DDP)", 1: "ZeRO-1: optimizer state sharded",
            2: "ZeRO-2: + gradients sharded (FSDP2)", 3: "ZeRO-3: + parameters sharded (FSDP2)"}
    parts = [f"{p.name}: {degrees}", f"zero {p.zero} = {zero[p.zero]}"]
    if p.tp > 1:
        parts.append(f"sequence parallel {'on' if p.sequence_parallel else 'off'}, "
                     f"loss parallel {'on' if p.loss_parallel else 'off'}")
    if p.pp > 1:
        parts.append(f"schedule {p.pp_schedule}, {p.pp_microbatches} micro-batches, "
                     f"{p.pp_virtual_stages} stage(s) per rank")
    if p.cp > 1:
        parts.append(f"cp sharding {'balanced (2 chunks per rank)' if p.cp_balanced else 'contiguous'}")
    if p.ep > 1:
        parts.append(f"experts over ep {p.ep} (borrowed from dp_shard x cp), their FSDP over "
                     f"{p.expert_fsdp_shards} rank(s)")
    return "; ".join(parts)


def rank_table(spec: RunSpec) -> Table:
    """One row per rank (the first MAX_RANK_ROWS): coordinates, groups, memory."""
    dims = ParallelDims.from_spec(spec.parallel)
    shown = min(dims.world_size, MAX_RANK_ROWS)
    more = dims.world_size - shown
    title = f"Ranks ({shown} of {dims.world_size} shown)" if more else "Ranks"
    table = Table(title=title, title_justify="left",
                  caption="coordinates; the ranks sharing each axis (its process group); sizes "
                          "(M = MiB, G = GiB) of parameters + gradients + optimizer state, and "
                          "of activations (estimate)")
    # at 80 columns only the group lists wrap (folded at the column's width): rank,
    # coordinates and sizes stay whole (rich shrinks wrappable columns first)
    table.add_column("rank", justify="right", no_wrap=True)
    table.add_column("pp,dp,cp,tp", no_wrap=True)
    experts = dims.ep > 1
    for axis in (*GROUP_AXES, *(["ep"] if experts else [])):
        table.add_column(f"{axis} with", overflow="fold")
    for column in ("state", "activ."):
        table.add_column(column, no_wrap=True)
    for rank in range(shown):
        c, m = dims.coordinates(rank), estimate_memory(spec, rank=rank)
        groups = [_ranks(dims.peers(rank, axes)) for axes in GROUP_AXES.values()]
        groups += [_ranks(dims.ep_peers(rank))] if experts else []
        coords = f"{c['pp']},{dims.dp_rank(rank)},{c['cp']},{c['tp']}"
        table.add_row(str(rank), coords, *groups, _size(m.params + m.grads + m.optimizer),
                      _size(m.activations))
    return table


def _ranks(ranks: list[int]) -> str:
    if len(ranks) == 1:
        return "-"
    if ranks == list(range(ranks[0], ranks[-1] + 1)):
        return f"{ranks[0]}-{ranks[-1]}"
    return ",".join(map(str, ranks)) if len(ranks) <= 4 else f"{ranks[0]},{ranks[1]},..,{ranks[-1]}"


def _size(n: int) -> str:
    return f"{n / 1024**2:.2f}M" if n < GIB else f"{n / GIB:.2f}G"
