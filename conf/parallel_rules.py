"""Resolve and check the parallel degrees: at most one auto (-1), the product = world size."""
from __future__ import annotations

from conf.errors import ProblemList
from conf.schema import ParallelConfig
from conf.spec import ParallelSpec

DEGREES = ("dp_replicate", "dp_shard", "tp", "pp", "cp")
IMPLEMENTED = ("dp_replicate",)


def resolve_parallel(cfg: ParallelConfig, *, world_size: int, nodes: int,
                     problems: ProblemList) -> ParallelSpec:
    """Fill the auto degree; report bad degrees once each, and a world-size mismatch once."""
    given = {name: getattr(cfg, name) for name in DEGREES}
    bad = [n for n, v in given.items() if v == 0 or v < -1]
    for name in bad:
        problems.add(f"parallel.{name}", given[name], "must be positive, or -1 for auto",
                     "give a degree >= 1")
    autos = [n for n, v in given.items() if v == -1]
    if len(autos) > 1:
        problems.add("parallel", ", ".join(f"{n}=-1" for n in autos),
                     "at most one degree may be -1 (auto)", "set all but one of them explicitly")
    _check_implemented(cfg, given, problems)
    resolved = dict(given)
    if not bad and len(autos) <= 1:
        resolved = _fill_auto(given, autos, world_size=world_size, nodes=nodes,
                              problems=problems)
    resolved = {n: max(v, 1) for n, v in resolved.items()}
    return ParallelSpec(name=cfg.name, zero=cfg.zero, **resolved)


def _fill_auto(given: dict[str, int], autos: list[str], *, world_size: int, nodes: int,
               problems: ProblemList) -> dict[str, int]:
    fixed_product = 1
    for name, value in given.items():
        if value != -1:
            fixed_product *= value
    world = (f"world size {world_size} (cluster.nodes={nodes} x "
             f"cluster.procs_per_node={world_size // max(nodes, 1)})")
    if autos:
        (auto,) = autos
        if world_size % fixed_product:
            problems.add(f"parallel.{auto}", "-1 (auto)",
                         f"the other degrees multiply to {fixed_product}, which does not "
                         f"divide the {world}", "change the degrees or the process count")
            return given
        return {**given, auto: world_size // fixed_product}
    if fixed_product != world_size:
        product = "*".join(f"{n}({v})" for n, v in given.items())
        problems.add("parallel", given_summary(given),
                     f"{product}={fixed_product} != {world}",
                     "make the degrees multiply to the world size, or set one to -1")
    return given


def given_summary(given: dict[str, int]) -> str:
    return ",".join(f"{n}={v}" for n, v in given.items() if v != 1) or "all 1"


def _check_implemented(cfg: ParallelConfig, given: dict[str, int], problems: ProblemList) -> None:
    for name, value in given.items():
        if name not in IMPLEMENTED and value > 1:
            problems.add(f"parallel.{name}", value,
                         "is not implemented yet (only data parallel: dp_replicate)",
                         f"use parallel.{name}=1 (parallel=ddp or parallel=single)")
    if cfg.zero != 0:
        problems.add("parallel.zero", cfg.zero, "ZeRO stages are not implemented yet",
                     "use parallel.zero=0")
