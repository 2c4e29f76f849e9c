"""Pipeline chunks in flight (parallel/cost/activations.py `pipeline_in_flight`) against the
op lists torch's schedules really run: the largest number of (micro-batch, virtual stage)
chunks a rank has run forward and not yet backward. Interleaved 1F1B: torch's own
`ScheduleInterleaved1F1B._calculate_single_rank_operations`; 1F1B: its warm-up rule
(pipelining/schedules.py `Schedule1F1B`: min(micro-batches, stages - stage)); looped BFS:
`ScheduleLoopedBFS._calculate_single_rank_operations`."""
from __future__ import annotations

import dataclasses
import functools
import types

from torch.distributed.pipelining.schedules import (
    ScheduleInterleaved1F1B,
    ScheduleLoopedBFS,
    _ComputationType,
)

from parallel.cost.activations import pipeline_in_flight
from tests.support.specs import cpu_spec


@functools.cache
def _pp_base():
    return cpu_spec("model=tiny", "parallel=pp", "cluster.procs_per_node=2").parallel


def _parallel(**fields):
    return dataclasses.replace(_pp_base(), **fields)


def _torch_in_flight(*, pp: int, v: int, m: int, rank: int,
                     schedule=ScheduleInterleaved1F1B) -> int:
    rounds = max(1, m // pp)
    fake = types.SimpleNamespace(n_local_stages=v, pp_group_size=pp, _n_microbatches=m,
                                 number_of_rounds=rounds, microbatches_per_round=m // rounds,
                                 _stages=[None] * v)
    ops = schedule._calculate_single_rank_operations(fake, rank)
    alive = most = 0
    for op in ops:
        if op is None:
            continue
        if op.computation_type is _ComputationType.FORWARD:
            alive += 1
            most = max(most, alive)
        elif op.computation_type is _ComputationType.FULL_BACKWARD:
            alive -= 1
    return most


def test_interleaved_in_flight_is_what_torchs_schedule_runs():
    """Mutation tried: the old (pp - rank) x v chunks: fails at pp=4, v=2."""
    for pp in (2, 4, 8):
        for v in (2, 3):
            for m in (pp, 2 * pp, 4 * pp):
                p = _parallel(pp=pp, pp_virtual_stages=v, pp_microbatches=m,
                              pp_schedule="interleaved_1f1b")
                for rank in range(pp):
                    assert pipeline_in_flight(p, rank) == _torch_in_flight(
                        pp=pp, v=v, m=m, rank=rank), (pp, v, m, rank)


def test_looped_bfs_in_flight_is_what_torchs_schedule_runs():
    for pp, v, m in ((2, 2, 4), (4, 2, 8), (4, 3, 4)):
        p = _parallel(pp=pp, pp_virtual_stages=v, pp_microbatches=m, pp_schedule="looped_bfs")
        for rank in range(pp):
            assert pipeline_in_flight(p, rank) == _torch_in_flight(
                pp=pp, v=v, m=m, rank=rank, schedule=ScheduleLoopedBFS), (pp, v, m, rank)


def test_1f1b_and_gpipe_in_flight():
    for pp, m in ((2, 2), (4, 8), (8, 4)):
        p = _parallel(pp=pp, pp_virtual_stages=1, pp_microbatches=m, pp_schedule="1f1b")
        assert [pipeline_in_flight(p, r) for r in range(pp)] == [min(m, pp - r)
                                                                for r in range(pp)]
        gpipe = dataclasses.replace(p, pp_schedule="gpipe")
        assert {pipeline_in_flight(gpipe, r) for r in range(pp)} == {m}
