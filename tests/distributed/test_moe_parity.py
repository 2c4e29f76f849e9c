"""tiny_moe under two-rank layouts (ZeRO-3 / FSDP2 and DDP, gloo) against one process running
the same micro-batches: loss, every gradient (routers' included, with the balancing loss
and z-loss on), every parameter after one AdamW step, the sigmoid router's balancing bias
after its update, and the plan's static memory per rank (expert weights, gradients, AdamW
state), fp32. tp2 with sequence parallel (sigmoid router, shared experts): router, routed
and shared experts whole on each tp rank, each routing its share of the sequence."""
from __future__ import annotations

import pytest

from conf.run_dir.spec_io import spec_to_dict
from parallel.cost.params import parameter_shapes
from tests.support.moe_parity import moe_parity_rank
from tests.support.spawn import run_on_ranks
from tests.support.specs import PARITY_LR, cpu_spec

pytestmark = pytest.mark.distributed

BASE = ("model=tiny_moe", "data=synthetic", "training.seq_len=16", "optim.lr=1e-3",
        "training.micro_batch_size=2", "training.grad_accum_steps=2",
        "cluster.procs_per_node=2", "model.moe.aux_loss_coef=0.05", "model.moe.z_loss_coef=0.01")
SIGMOID = ("model.moe.score=sigmoid", "model.moe.num_shared_experts=1",
           "model.moe.bias_update_rate=0.01", "checkpoint.export_safetensors=false")
LAYOUTS = {"zero3": ["parallel=zero3"], "ddp": ["parallel=ddp", *SIGMOID],
           # each tp rank routes its sequence share; the protocol's lr (tests/support/specs.py):
           # at 1e-3 one near-zero wv gradient element's first Adam step differs by 7.7e-6
           "tp_sp": ["parallel=tp", *SIGMOID, PARITY_LR]}


def test_tiny_moe_two_rank_layouts_match_one_process(tmp_path):
    specs = [cpu_spec(*BASE, *extra) for extra in LAYOUTS.values()]
    results = run_on_ranks(moe_parity_rank, world_size=2, workdir=tmp_path, timeout_s=300,
                           kwargs={"spec_dicts": [spec_to_dict(s) for s in specs]})
    for index, spec in enumerate(specs):
        rows = [rank_rows[index] for rank_rows in results]
        covered = set().union(*(row["names"] for row in rows))
        assert covered == {name for name, _ in parameter_shapes(spec.model)}
        assert "layers.2.moe.experts.w2" in covered
        assert all(row["router_grad"] > 0 for row in rows)
        assert len({round(row["loss"], 6) for row in rows}) == 1
    assert results[0][1]["biases"] == ["layers.1.moe.expert_bias", "layers.2.moe.expert_bias"]
