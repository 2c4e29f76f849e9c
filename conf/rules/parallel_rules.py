"""Resolve the parallel degrees (at most one auto, product = world size) and the ZeRO stage.

Cross-section rules (heads, vocabulary, layers, sequence and micro-batches against the degrees)
live in conf/rules/split_rules.py.
"""
from __future__ import annotations

from dataclasses import replace

from conf.degrees import DEGREES
from conf.errors import ProblemList
from conf.schema import ParallelConfig
from conf.spec import ParallelSpec, spec_from_config

PP_SCHEDULES = {  # name -> needs virtual stages (more than one stage per rank)
    "gpipe": False, "1f1b": False,
    "interleaved_1f1b": True, "looped_bfs": True, "interleaved_zero_bubble": True,
}
SPLIT_BACKWARD_SCHEDULES = frozenset({"interleaved_zero_bubble"})
"""Schedules that run backward as separate input (I) and weight (W) passes; under FSDP their
units stay gathered from forward to backward (parallel/pipeline.py), whatever the zero stage."""


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
    resolved = dict(given)
    if not bad and len(autos) <= 1:
        resolved = _fill_auto(given, autos, world_size=world_size, nodes=nodes,
                              problems=problems)
    resolved = {n: max(v, 1) for n, v in resolved.items()}
    check_zero(cfg.zero, resolved, problems)
    spec = spec_from_config(ParallelSpec, cfg, pp_microbatches=1,
                            pp_virtual_stages=max(cfg.pp_virtual_stages, 1), **resolved)
    microbatches = spec.n_stages if cfg.pp_microbatches == -1 else cfg.pp_microbatches
    check_pipeline_options(cfg, spec, microbatches=microbatches, problems=problems)
    return replace(spec, pp_microbatches=max(microbatches, 1))


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


def check_zero(zero: int, degrees: dict[str, int], problems: ProblemList) -> None:
    """ZeRO shards over dp_shard (stages 2/3 also over cp, whose ranks hold the same weights)."""
    if zero not in (0, 1, 2, 3):
        problems.add("parallel.zero", zero, "must be 0, 1, 2 or 3", "use parallel.zero=3 (FSDP)")
        return
    shard, cp = degrees["dp_shard"], degrees["cp"]
    dp, dp_cp = degrees["dp_replicate"] * shard, degrees["dp_replicate"] * shard * cp
    if shard > 1 and zero == 0:
        problems.add("parallel.dp_shard", shard,
                     "shards training state over ranks, which needs parallel.zero 1, 2 or 3",
                     "set parallel.zero=3 (or 1/2), or use parallel.dp_replicate for DDP")
    if zero == 1 and shard == 1:
        problems.add("parallel.zero", 1, "shards optimizer state over parallel.dp_shard, which is 1",
                     "set parallel.dp_shard=-1 (and dp_replicate=1), or parallel.zero=0")
    if zero in (2, 3) and shard * cp == 1 and dp > 1:
        problems.add("parallel.zero", zero,
                     "shards over parallel.dp_shard (and cp), and both are 1: nothing to shard",
                     "set parallel.dp_shard=-1, or parallel.zero=0 for DDP")


def check_pipeline_options(cfg: ParallelConfig, spec: ParallelSpec, *, microbatches: int,
                           problems: ProblemList) -> None:
    """Schedule, virtual stages and micro-batches as given (`cfg`; `microbatches` with auto
    filled in) against the degrees of the spec being resolved."""
    if cfg.pp_schedule not in PP_SCHEDULES:
        problems.add("parallel.pp_schedule", cfg.pp_schedule, "is not a pipeline schedule",
                     f"use one of {', '.join(PP_SCHEDULES)}")
    if cfg.pp_virtual_stages < 1:
        problems.add("parallel.pp_virtual_stages", cfg.pp_virtual_stages, "must be >= 1",
                     "give 1, or 2+ for interleaved schedules")
    if cfg.pp_microbatches == 0 or cfg.pp_microbatches < -1:
        problems.add("parallel.pp_microbatches", cfg.pp_microbatches,
                     "must be positive, or -1 for auto (= number of stages)", "give a value >= 1")
    pp, virtual = spec.pp, cfg.pp_virtual_stages
    if pp == 1 or cfg.pp_schedule not in PP_SCHEDULES or virtual < 1:
        return
    if PP_SCHEDULES[cfg.pp_schedule] and virtual < 2:
        problems.add("parallel.pp_virtual_stages", virtual,
                     f"schedule {cfg.pp_schedule} runs several stages per rank",
                     "set parallel.pp_virtual_stages=2 (or more)")
    if not PP_SCHEDULES[cfg.pp_schedule] and virtual > 1:
        problems.add("parallel.pp_virtual_stages", virtual,
                     f"schedule {cfg.pp_schedule} runs one stage per rank",
                     "use parallel.pp_schedule=interleaved_1f1b, or pp_virtual_stages=1")
    if cfg.pp_microbatches > 0 and microbatches < pp:
        problems.add("parallel.pp_microbatches", microbatches,
                     f"must be at least parallel.pp={pp} to fill the pipeline",
                     f"use parallel.pp_microbatches>={pp}")
    if PP_SCHEDULES[cfg.pp_schedule] and microbatches % pp:
        problems.add("parallel.pp_microbatches", microbatches,
                     f"schedule {cfg.pp_schedule} needs a multiple of parallel.pp={pp}",
                     f"use a multiple of {pp}")
