"""The search's fast paths (memoised memory by layout, phase terms by what they read,
predictions only for the layouts whose step-time floor could rank them high) rank exactly as
the slow, obvious way: every candidate planned on its own with make_plan (estimate_memory),
predicted with predict, the misfits dropped by memory_verdict's rule, the rest sorted by
(-tokens/s per device, memory). Same top layouts in the same order, same counts, same
smallest misfit - over every recompute option of the group, and layouts with pipelines
(every schedule), tp, cp and each ZeRO stage."""
from __future__ import annotations

from collections import Counter

from conf.compose import compose_config
from conf.resolve import resolve
from conf.spec import HostSpec
from launcher.plan.plan_search import neutral_layout, recompute_policies
from parallel.cost.fit import memory_verdict
from parallel.cost.plan import make_plan
from parallel.cost.search import predict, search
from parallel.cost.search_space import enumerate_candidates
from parallel.cost.search import SEARCH_LOSS_CHUNKS
from parallel.cost.step_time import estimate_time, hardware_of, step_floor_s

HOST = HostSpec(gpu_name="", gpu_count=0, compute_capability=0.0, cpu_count=2)
OVERRIDES = ["model=llama3_8b", "training.seq_len=8192", "cluster=slurm", "cluster.nodes=1",
             "cluster.gpus_per_node=4", "cluster.gpu_name=H100",
             "cluster.gpu_compute_capability=9.0", "data=synthetic"]
GLOBAL_BATCH = 8


def _brute_force(cfg, base, policies):
    """(candidates that fit, best first; misfit count; smallest misfit) the obvious way; and
    asserts that no layout's step time is below its floor (step_time.step_floor_s)."""
    usable = memory_verdict(base, 0).usable_bytes
    hardware = hardware_of(base)
    fitting, misfits = [], []
    for candidate in enumerate_candidates(cfg, base, global_batch_size=GLOBAL_BATCH,
                                          policies=policies, rejected=Counter()):
        spec = candidate.spec(base)
        plan = make_plan(spec)
        if plan.memory.total > usable and candidate.parallel.tp == candidate.parallel.pp == 1:
            chunked = candidate.with_loss_chunks(SEARCH_LOSS_CHUNKS)  # the head in row blocks
            chunked_plan = make_plan(chunked.spec(base))
            if chunked_plan.memory.total <= usable:
                candidate, spec, plan = chunked, chunked.spec(base), chunked_plan
        if plan.memory.total > usable:
            misfits.append(plan.memory.total)
            continue
        speed = predict(spec, plan).tokens_per_s_per_device
        floor = step_floor_s(spec, plan, hardware)
        assert 0 < floor <= estimate_time(spec, plan).step_s, candidate
        fitting.append(((-speed, plan.memory.total), candidate))
    fitting.sort(key=lambda entry: entry[0])
    return [candidate for _, candidate in fitting], len(misfits), min(misfits)


def test_the_search_ranks_its_top_layouts_as_planning_each_alone_does():
    cfg = compose_config(OVERRIDES)
    base = resolve(neutral_layout(cfg), host=HOST, check_paths=False)
    policies = recompute_policies()
    ranked, misfits, smallest = _brute_force(cfg, base, policies)
    for top in (1, 10, len(ranked)):
        result = search(cfg, base, global_batch_size=GLOBAL_BATCH, policies=policies, top=top)
        assert [r.candidate for r in result.top] == ranked[:top], top
        assert (result.fits, result.does_not_fit, result.smallest_misfit_bytes) == (
            len(ranked), misfits, smallest)
    shapes = {(c.parallel.pp_schedule if c.parallel.pp > 1 else None, c.parallel.tp > 1,
               c.parallel.cp > 1, c.parallel.zero, c.recompute_name) for c in ranked}
    assert {s[0] for s in shapes} >= {None, "gpipe", "1f1b", "interleaved_1f1b"}
    assert {s[3] for s in shapes} == {0, 1, 2, 3} and len({s[4] for s in shapes}) >= 5
    assert any(s[1] for s in shapes) and any(s[2] for s in shapes) and misfits > 0
