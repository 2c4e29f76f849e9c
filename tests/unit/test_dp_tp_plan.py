"""DDP and ZeRO-1 with parallel.tp > 1 (parallel/dp_tp_grads.py): resolved, planned with the
tp-local gradients all-reduced over dp x cp after the backward (axis dp_tp, exposed, not
hidden under compute as DDP's overlapped buckets are), ZeRO-1's parameter gathers on top; and
the reducer's buckets. The gloo parity proof is tests/distributed/test_layout_parity.py
(test_ddp_and_zero1_under_tp_match_one_process)."""
from __future__ import annotations

import pytest

from parallel.cost.comm import Link, exposed_s, step_collectives
from parallel.cost.params import numel, parameter_shapes, tp_local_shape
from tests.support.specs import cpu_spec

TINY = ("model=tiny", "data=synthetic", "training.seq_len=32", "cluster.procs_per_node=4")
LINK = Link(name="x", gbps=1.0, latency_s=0.0)


def _dp(spec):
    return [c for c in step_collectives(spec, ranks_per_node=4, intra=LINK, inter=LINK)
            if c.axis in ("ddp", "dp_tp", "zero1")]


def test_ddp_and_zero1_with_tp_resolve():
    ddp = cpu_spec(*TINY, "parallel=ddp", "parallel.tp=2")
    zero1 = cpu_spec(*TINY, "parallel=zero1", "parallel.tp=2")
    assert (ddp.parallel.zero, ddp.parallel.dp_replicate, ddp.parallel.tp) == (0, 2, 2)
    assert (zero1.parallel.zero, zero1.parallel.dp_shard, zero1.parallel.tp) == (1, 2, 2)
    assert ddp.parallel.uses_ddp and zero1.parallel.uses_ddp


def test_the_tp_local_gradients_are_all_reduced_once_and_exposed():
    """Each tp rank reduces its shard: the tp-local gradients' bytes (split weights halved,
    norms whole on every tp rank), about half the same model's DDP without tp; and on the
    critical path: with overlap the tp=1 DDP all-reduce is mostly hidden, the dp_tp one not.
    (Mutation tried: the dp_tp axis put in OVERLAPPED_AXES -> the exposure check fails.)"""
    plain = cpu_spec("model=tiny", "data=synthetic", "training.seq_len=32",
                     "cluster.procs_per_node=2", "parallel=ddp")
    [whole] = _dp(plain)
    [shard] = _dp(cpu_spec(*TINY, "parallel=ddp", "parallel.tp=2"))
    assert (whole.axis, shard.axis) == ("ddp", "dp_tp")
    assert (shard.op, shard.group, shard.calls) == ("all_reduce", 2, 1)
    model = plain.model
    local = sum(numel(tp_local_shape(name, shape, 2, model.family))
                for name, shape in parameter_shapes(model))
    assert shard.size_bytes == 4 * local
    assert whole.size_bytes / 2 < shard.size_bytes < whole.size_bytes * 0.52
    compute = 10 * shard.seconds
    assert exposed_s([shard], compute_s=compute, layers=2, overlaps=True) == shard.seconds
    assert exposed_s([whole], compute_s=compute, layers=2, overlaps=True) < whole.seconds


def test_zero1_with_tp_also_gathers_the_updated_shards_from_their_owners():
    ops = {(c.axis, c.op) for c in _dp(cpu_spec(*TINY, "parallel=zero1", "parallel.tp=2"))}
    assert ops == {("dp_tp", "all_reduce"), ("zero1", "all_gather")}


def test_the_reducer_buckets_by_dtype_in_order_and_closes_a_full_bucket():
    import torch

    from parallel.dp_tp_grads import ShardGradAverage

    f32 = [torch.zeros(4) for _ in range(5)]  # 16 bytes each
    bf16 = torch.zeros(4, dtype=torch.bfloat16)
    reducer = ShardGradAverage([], group=None, group_size=2, bucket_bytes=40)
    buckets = reducer._buckets([f32[0], bf16, f32[1], f32[2], f32[3], f32[4]])
    assert [[id(t) for t in b] for b in buckets] == [
        [id(f32[0]), id(f32[1]), id(f32[2])], [id(bf16)], [id(f32[3]), id(f32[4])]]
