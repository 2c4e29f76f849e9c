"""The plan's tensor-parallel terms for MoE models (issue 26): routers and experts are whole on
every tp rank (parallel/tensor_parallel.py `TpPlan.token_local`), so FSDP gathers them whole
on each tp rank, a MoE block's feed-forward takes no tp collective, and under sequence
parallel their gradients (this rank's FSDP/ep shards) are all-reduced over tp once a step
(parallel/tp_replicated.py). The torch side is proven in tests/distributed/test_expert_parallel.py
(and each rank's held bytes against the plan there)."""
from __future__ import annotations

from functools import cache

from parallel.cost.comm import Link, step_collectives
from parallel.cost.params import numel, parameter_shapes, token_local_params, tp_local_params
from tests.support.specs import cpu_spec

LINK = Link(name="x", gbps=1.0, latency_s=0.0)
MOE = ("model=tiny_moe", "data=synthetic", "training.seq_len=32", "cluster.procs_per_node=4")
spec = cache(cpu_spec)


def _collectives(*overrides: str) -> dict[tuple[str, str], list]:
    found: dict[tuple[str, str], list] = {}
    for c in step_collectives(spec(*overrides), ranks_per_node=4, intra=LINK, inter=LINK):
        found.setdefault((c.axis, c.op), []).append(c)
    return found


def test_routers_experts_and_norms_count_whole_on_each_tp_rank():
    model = spec(*MOE, "parallel=fsdp_tp").model
    whole = sum(numel(shape) for name, shape in parameter_shapes(model)
                if ".moe." in name or name.endswith("norm.weight"))
    total = sum(numel(shape) for _, shape in parameter_shapes(model))
    assert whole > 0 and token_local_params(model)[0] < whole  # routers+experts, and norms
    assert tp_local_params(model, 2) == (total - whole) / 2 + whole
    assert tp_local_params(model, 1) == total
    # FSDP (zero 3 over 2 ranks) gathers each tp rank's parameters: units x per-unit volume
    fsdp = _collectives(*MOE, "parallel=fsdp_tp")
    gather = fsdp[("fsdp", "all_gather")][0]
    units = model.n_layers + 2  # the blocks, the embedding, the final norm with the head
    assert gather.size_bytes * units == tp_local_params(model, 2) * 4


def test_moe_blocks_take_attention_collectives_only_and_sum_their_gradients_under_sp():
    model = spec(*MOE, "parallel=fsdp_tp").model
    moe_blocks = model.n_layers - model.moe.first_dense_layers
    micro = spec(*MOE, "parallel=fsdp_tp").training.grad_accum_steps
    sp = _collectives(*MOE, "parallel=fsdp_tp")
    assert sp[("tp", "all_gather")][0].calls == (4 * model.n_layers - 2 * moe_blocks) * micro
    (summed,) = sp[("tp", "all_reduce")]
    assert summed.calls == 1  # once a step, each rank's FSDP shard (dp_shard 2) in fp32
    assert summed.size_bytes == token_local_params(model)[0] / 2 * 4
    no_sp = _collectives(*MOE, "parallel=fsdp_tp", "parallel.sequence_parallel=false")
    (reduce,) = no_sp[("tp", "all_reduce")]  # the activations' all-reduce only
    assert reduce.calls == (4 * model.n_layers - 2 * moe_blocks) * micro
    # expert parallel: the experts' share is their ep shard over their own FSDP ranks
    ep = _collectives(*MOE, "parallel=ep", "parallel.tp=2")
    local, experts = token_local_params(model)
    (ep_summed,) = [c for c in ep[("tp", "all_reduce")]]
    assert ep_summed.size_bytes == ((local - experts) / 2 + experts / 2) * 4


def test_dense_models_keep_four_tp_collectives_per_block_and_no_gradient_sum():
    dense = spec("model=tiny", "data=synthetic", "cluster.procs_per_node=4", "parallel=fsdp_tp")
    found = _collectives("model=tiny", "data=synthetic", "cluster.procs_per_node=4",
                         "parallel=fsdp_tp")
    assert found[("tp", "all_gather")][0].calls == (
        4 * dense.model.n_layers * dense.training.grad_accum_steps)
    assert ("tp", "all_reduce") not in found
