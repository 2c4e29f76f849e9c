"""The straggler rule (conf/run_dir/stragglers.py) on metrics rows, and the summary's line."""
from __future__ import annotations

from conf.run_dir.stragglers import (MIN_STEPS, TIME_BY_RANK_KEY, WAIT_PARTIAL_KEY,
                                      describe_straggler, stragglers, wait_partial,
                                      why_wait_is_partial)


def _row(step: int, compute: list[float]) -> dict:
    return {"kind": "train", "step": step, TIME_BY_RANK_KEY: {
        "compute_s": compute, "wait_s": [max(compute) - c for c in compute],
        "step_time_s": [max(compute)] * len(compute)}}


def test_a_rank_slower_on_most_recent_steps_is_named():
    rows = [_row(s, [0.1, 0.1, 0.1, 0.2 if s % 4 else 0.1]) for s in range(1, 21)]
    [found] = stragglers(rows)
    assert found["rank"] == 3 and found["slow_steps"] == 15 and found["steps"] == 20
    assert describe_straggler(found).startswith("rank 3 is a straggler")


def test_occasional_slowness_short_runs_and_an_earlier_leg_name_nobody():
    assert stragglers([_row(s, [0.1, 0.3 if s % 3 == 0 else 0.1]) for s in range(20)]) == []
    assert stragglers([_row(s, [0.1, 0.3]) for s in range(MIN_STEPS - 1)]) == []
    slow_leg = [_row(s, [0.1, 0.3]) for s in range(10)]
    even_leg = [_row(s, [0.1, 0.1]) for s in range(10, 20)]
    assert stragglers(slow_leg + [{"kind": "resume", "step": 10}] + even_leg) == []
    assert stragglers([{"kind": "train", "step": 1, "loss": 1.0}] * 10) == []



def test_the_wait_is_called_partial_where_it_misses_collectives(tmp_path):
    from dataclasses import replace

    from conf.run_dir.run_states import RunState
    from launcher.views.run_status import progress_notes
    from tests.support.specs import cpu_spec
    from training.rank_times import time_fields

    eager_tp = cpu_spec("model=tiny", "parallel=tp", "cluster.procs_per_node=2")
    assert why_wait_is_partial(eager_tp) == ""
    compiled = replace(eager_tp, training=replace(eager_tp.training, compile=True))
    assert "tensor-parallel collectives compiled" in why_wait_is_partial(compiled)
    on_cuda = replace(eager_tp, training=replace(eager_tp.training, device="cuda"))
    assert why_wait_is_partial(on_cuda).startswith("wait is partial: on CUDA")

    def rows(spec) -> list[dict]:
        split = {"step_time_s": [0.2, 0.2], "wait_s": [0.1, 0.0], "compute_s": [0.1, 0.2]}
        return [{"kind": "train", "step": s,
                 **time_fields({**split, "mem_peak_gib": [1.0, 1.0]}, spec=spec)}
                for s in range(1, 8)]

    assert wait_partial(rows(eager_tp)) == "" and WAIT_PARTIAL_KEY not in rows(eager_tp)[0]
    assert wait_partial(rows(on_cuda)) == why_wait_is_partial(on_cuda)
    notes = progress_notes(tmp_path, rows(on_cuda), RunState.paused)
    assert notes["wait_partial"] == why_wait_is_partial(on_cuda)
