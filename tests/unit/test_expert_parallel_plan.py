"""Expert parallelism before launch: its rules (house format, every problem at once), its
plan terms (expert bytes per rank, the dispatch/combine all-to-all, the imbalance knob) and
`plan --search` enumerating ep for MoE models only. The torch side is proven in
tests/distributed/test_expert_parallel.py."""
from __future__ import annotations

from collections import Counter
from functools import cache

import pytest

from conf.errors import ConfigError
from parallel.cost.comm import Link, all_to_all_bytes, collective_s, step_collectives
from parallel.cost.activation_types import activation_dtypes
from parallel.cost.activations import selective_targets
from parallel.cost.expert_activations import expert_bytes_per_copy
from parallel.cost.memory import estimate_memory, layout_activation_bytes, static_bytes
from parallel.cost.params import expert_params
from parallel.cost.search_space import ep_degrees
from parallel.cost.step_time import collectives_of, hardware_of
from tests.support.specs import cpu_spec
from tests.support.toy_moe_family import NAME as TOY_MOE, TOP_K

MOE = ("model=tiny", f"model.family={TOY_MOE}", "model.n_kv_heads=-1", "data=synthetic",
       "training.seq_len=32")
spec = cache(cpu_spec)
"""cpu_spec, once per override list: the same specs serve several checks."""
LINK = Link(name="intra-node", gbps=100.0, latency_s=1e-5)


def _problems(*overrides: str) -> str:
    with pytest.raises(ConfigError) as error:
        cpu_spec(*overrides)  # not cached: it raises
    return str(error.value)


def test_ep_rules_name_the_knob_and_the_fix():
    dense = _problems("model=tiny", "data=synthetic", "parallel=ep")
    assert "parallel.ep=2: splits routed experts" in dense and "is dense" in dense
    uneven = _problems(*MOE, "parallel=ep", "parallel.ep=3", "cluster.procs_per_node=3")
    assert "must divide the 4 routed experts" in uneven and "[1, 2, 4]" in uneven
    both = _problems(*MOE, "parallel=ddp", "parallel.ep=2")
    assert "borrows its ranks from dp_shard x cp = 1 x 1 = 1" in both
    assert "need FSDP (parallel.zero 2 or 3), not zero=0" in both
    assert "(2 problems)" in both
    assert "at least 1.0" in _problems(*MOE, "parallel=ep", "parallel.ep_imbalance=0.5")
    # ep x tp with sequence parallel resolves (proven in tests/distributed/test_expert_parallel.py)
    ep_tp = cpu_spec(*MOE, "parallel=ep", "parallel.tp=2", "cluster.procs_per_node=4")
    assert ep_tp.parallel.sequence_parallel and ep_tp.parallel.ep == 2


def test_expert_bytes_split_over_ep_then_their_fsdp_shards():
    one, two = (spec(*MOE, "cluster.procs_per_node=4", "parallel=zero3"),
                spec(*MOE, "cluster.procs_per_node=4", "parallel=ep"))
    experts, moe_layers = expert_params(one.model)
    assert moe_layers == one.model.n_layers and experts > 0
    # zero3: experts over 4 shards; ep=2: over 2 ep ranks x 2 efsdp shards: the same bytes,
    # held differently (rank 0 holds experts 0-1, half of their rows)
    assert static_bytes(one, 0).params == static_bytes(two, 0).params
    four = spec(*MOE, "cluster.procs_per_node=4", "parallel=ep", "parallel.ep=4")
    assert static_bytes(four, 0).params == static_bytes(one, 0).params


def test_all_to_all_volume_is_tokens_topk_dim_bytes_times_imbalance():
    ep2 = spec(*MOE, "cluster.procs_per_node=2", "parallel=ep")
    tokens = ep2.training.micro_batch_size * ep2.training.seq_len
    ep = [c for c in step_collectives(ep2, ranks_per_node=2, intra=LINK, inter=LINK)
          if c.axis == "ep" and not c.bare]
    (dispatch,) = ep
    assert dispatch.size_bytes == tokens * TOP_K * ep2.model.dim * 4
    assert dispatch.calls == 4 * ep2.model.n_layers * ep2.training.grad_accum_steps
    assert collective_s("all_to_all", n=2, size_bytes=2e9, link=LINK) == pytest.approx(
        1e-5 + 0.5 * 2e9 / 100e9)  # (ep-1)/ep of the buffer crosses
    assert all_to_all_bytes(ep2, tokens, imbalance=1.5) == 1.5 * dispatch.size_bytes
    skewed = spec(*MOE, "cluster.procs_per_node=2", "parallel=ep", "parallel.ep_imbalance=1.5")
    hw = hardware_of(skewed, calibration={})
    (skew,) = [c for c in collectives_of(skewed, hw) if c.axis == "ep" and not c.bare]
    assert hw.ep_imbalance == 1.5 and skew.size_bytes == 1.5 * dispatch.size_bytes
    dense = spec(*MOE, "cluster.procs_per_node=2", "parallel=zero3")
    assert not [c for c in step_collectives(dense, ranks_per_node=2, intra=LINK, inter=LINK)
                if c.axis in ("ep", "efsdp")]


def test_search_tries_ep_degrees_for_moe_models_only():
    moe = spec(*MOE, "cluster.procs_per_node=4", "parallel=zero3")
    assert ep_degrees(moe.parallel, moe, Counter()) == [1, 2, 4]
    dense = spec("model=tiny", "data=synthetic", "cluster.procs_per_node=4", "parallel=zero3")
    assert ep_degrees(dense.parallel, dense, Counter()) == [1]


def test_the_search_offers_an_moe_model_only_the_recompute_policies_its_family_runs():
    """ffn / swiglu targets (a dense MLP's) and alternate matmuls are refused for MoE models
    by resolve; the search drops them before it plans (counted by rule), as it does for dense
    models only what check_recompute refuses."""
    from conf.schema import RecomputeConfig, RecomputeMode, RecomputeTarget
    from launcher.plan.plan_search import recompute_policies
    from parallel.cost.search_space import valid_policies

    policies = {**recompute_policies(),  # a user's option (conf/recompute/*.yaml) beside ours
                "selective_ffn": RecomputeConfig(mode=RecomputeMode.selective,
                                                 targets=[RecomputeTarget.ffn])}
    moe, dense = Counter(), Counter()
    moe_kept = valid_policies(policies, moe, model=spec(*MOE).model)
    dense_kept = valid_policies(policies, dense, model=spec("model=tiny", "data=synthetic").model)
    assert {"selective", "full", "none"} <= set(moe_kept)
    refused = set(dense_kept) - set(moe_kept)
    assert {"selective_alternate", "selective_ffn"} <= refused, refused
    assert all(policies[name].mode.value == "selective" for name in refused)
    assert moe["recompute.targets"] + moe["recompute.ops_matmuls"] == len(refused)


def test_the_memory_plan_gives_the_busiest_ranks_experts_the_imbalance():
    """parallel.ep_imbalance moves the memory plan by the token copies the busiest rank's
    experts receive beyond the balanced load: (factor - 1) x tokens x top_k x the bytes each
    copy keeps, per MoE block; auto (0) plans the balanced load, as 1.0 does."""
    base = ("model=tiny_moe", "data=synthetic", "training.seq_len=32",
            "cluster.procs_per_node=2", "parallel=ep")
    auto, even, skewed = (spec(*base, f"parallel.ep_imbalance={f}") for f in (0, 1.0, 1.5))
    model, recompute = even.model, even.recompute
    per_copy = expert_bytes_per_copy(
        model, recompute=recompute, targets=selective_targets(recompute), ep=2,
        dtypes=activation_dtypes(even.precision, uses_fsdp=even.parallel.uses_fsdp))
    tokens = even.training.micro_batch_size * even.training.seq_len
    blocks = sum(model.is_moe_block(layer) for layer in range(model.n_layers))
    assert per_copy > 0 and blocks == 2
    extra = layout_activation_bytes(skewed, 0) - layout_activation_bytes(even, 0)
    assert extra == pytest.approx(0.5 * tokens * model.moe.top_k * per_copy * blocks, abs=blocks)
    assert layout_activation_bytes(auto, 0) == layout_activation_bytes(even, 0)
    assert estimate_memory(skewed).total - estimate_memory(even).total >= extra
