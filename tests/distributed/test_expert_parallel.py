"""Expert parallelism (parallel.ep) against one process, as every layout is proven
(tests/support/layout_parity.py): with dropless routing, after one AdamW update on the same
global batch, the loss, every gradient (the router's, which the router losses reach, and
every expert's, gathered from its ep rank) and every parameter equal one process running
the layout's micro-batches (fp32, atol 5e-6, rtol 1e-4), and each rank holds the bytes the
plan says. Models: the test-only MoE family (tests/support/toy_moe_family: 4 experts, top-2,
the z-loss in the loss) and the shipped tiny_moe (training/models/moe) with its balancing
loss and z-loss on. One spawn per world size: 2 ranks (ep2 on both models, ep2 over the cp
ranks, tp2 on tiny_moe with and without sequence parallel, and a checkpoint ep2 <-> ep1),
4 ranks (ep2 x zero3: each expert's FSDP over 2 ranks; ep2 x tp2 without sequence parallel,
and on tiny_moe with it; ep2 x pp2, 1F1B and interleaved zero bubble). Under sequence
parallel each tp rank routes its share of the sequence: the router and expert gradients are
summed over tp and the router losses reduced over it (its q/k norms' gradients are summed
over tp with or without it). Under cp, zero bubble and tp with sequence parallel the logged
routing metrics and the gradient norm equal one process's too."""
from __future__ import annotations

import pytest

from conf.run_dir.spec_io import spec_to_dict
from parallel.cost.params import parameter_shapes
from tests.support.layout_parity import parity_rank
from tests.support.moe_parity import routing_parity_rank
from tests.support.spawn import run_on_ranks
from tests.support.specs import cpu_spec
from tests.support.toy_moe_family import NAME as TOY_MOE

pytestmark = pytest.mark.distributed

BASE = ("model=tiny", f"model.family={TOY_MOE}", "model.n_kv_heads=-1", "model.n_layers=2",
        "data=synthetic", "training.seq_len=32", "optim.lr=1e-4",
        "training.micro_batch_size=2", "training.grad_accum_steps=2")
SHIPPED = ("model=tiny_moe", *BASE[4:], "model.moe.aux_loss_coef=0.1",
           "model.moe.z_loss_coef=0.01")
"""The shipped MoE family's tiny model (block 0 dense), router losses on. The balancing loss
is per forward (a rank's micro-batch; a pipeline micro-batch; whole sequences under cp): the
reference runs the same micro-batches (`parity_rank(micro_batched=True)`)."""
FOUR_RANKS = {
    "ep2_tp2": ["parallel=ep", "parallel.tp=2", "parallel.sequence_parallel=false"],
}
ZERO3 = ("parallel=ep",)
"""ep2 x zero3 on tiny_moe: dp_shard 4, each expert's FSDP over 2 ranks."""
PIPELINED = ("parallel=ep", "parallel.pp=2", "parallel.dp_shard=2", "parallel.pp_layer_split=[2,1]")
"""ep2 x pp2 (1F1B) on tiny_moe: each stage's router losses reach its gradient through its
output (training/models/moe/model/router_loss_grad.py)."""
ZERO_BUBBLE = ("parallel=ep", "parallel.pp=2", "parallel.dp_shard=2", "model.n_layers=5",
               "parallel.pp_schedule=interleaved_zero_bubble", "parallel.pp_virtual_stages=2",
               "parallel.pp_layer_split=[2,1,1,1]", "training.micro_batch_size=4",
               "training.grad_accum_steps=1")
"""Four stages (two per rank; each with experts: ep shards every stage), four pipeline
micro-batches."""


def ep_rank(*, rank: int, world_size: int, spec_dicts: list[dict], routing_dicts: list[dict],
            root: str = "", pairs: list = ()) -> tuple[list, list, list]:
    """One spawn per world size: parity, the routing metrics, then (with `pairs`)
    checkpoints across ep degrees."""
    from tests.distributed.test_layout_checkpoint import reshard_rank

    parity = parity_rank(rank=rank, world_size=world_size, spec_dicts=spec_dicts,
                         micro_batched=True)
    routing = routing_parity_rank(rank=rank, world_size=world_size, spec_dicts=routing_dicts)
    return parity, routing, (reshard_rank(rank=rank, world_size=world_size, root=root,
                                          pairs=pairs) if pairs else [])


def _spawn(tmp_path, world: int, specs: list, routing: list, **more) -> tuple:
    """Every rank's (parity, routing, reshard) rows, regrouped by kind; parity checked."""
    results = run_on_ranks(ep_rank, world_size=world, workdir=tmp_path, timeout_s=400,
                           kwargs={"spec_dicts": [spec_to_dict(s) for s in specs],
                                   "routing_dicts": [spec_to_dict(s) for s in routing], **more})
    parity, routing_rows, reshard = zip(*results)
    _check(specs, list(parity))
    assert all(rows[index]["moe_aux_loss"] > 0 for rows in routing_rows
               for index in range(len(routing)))
    return parity, routing_rows, reshard
SEQUENCE_AUX = "model.moe.seq_aux_loss=true"
"""The balancing loss per sequence, which a data split of the batch keeps."""


def covered(rows: list[dict]) -> set[str]:
    return set().union(*(row["names"] for row in rows))


def _check(specs: list, results: list) -> None:
    for index, spec in enumerate(specs):
        rows = [rank_rows[index] for rank_rows in results]
        assert {row["layout"] for row in rows} == {spec.parallel.name}
        assert any(name.endswith("moe.experts.w2") for name in rows[0]["names"])
        assert any(name.endswith("moe.router.weight") for name in rows[0]["names"])
        assert covered(rows) == {name for name, _ in parameter_shapes(spec.model)}
        assert len({round(row["loss"], 6) for row in rows}) == 1


def test_ep2_matches_one_process_and_its_checkpoints_reshard_to_ep1(tmp_path):
    """Parity of ep=2 (over cp: the balancing loss per batch and per sequence; the routing
    metrics), of ep2 under selective recompute and under ZeRO-2, and of tp2 on tiny_moe (with sequence
    parallel: the routing metrics); then a checkpoint saved under ep=2 loads (by name, DCP
    resharding the expert DTensors and their AdamW moments) under ep=1 and the reverse,
    refused without allow_reshard, and the next step equals the saving layout's."""
    over_cp = cpu_spec(*SHIPPED, "cluster.procs_per_node=2", "parallel.name=ep2_cp2",
                       "parallel=ep", "parallel.dp_shard=1", "parallel.cp=2")  # ep: the cp ranks
    per_sequence = cpu_spec(*SHIPPED, "cluster.procs_per_node=2", "parallel.name=ep2_cp2_seq",
                            "parallel=ep", "parallel.dp_shard=1", "parallel.cp=2",
                            "model.moe.seq_aux_loss=true")  # DeepSeek's loss per sequence
    tp2_sp = cpu_spec(*SHIPPED, "cluster.procs_per_node=2", "parallel.name=tp2_sp_moe",
                      "parallel=tp")  # router and experts whole, each rank its tokens
    specs = [cpu_spec(*BASE, "cluster.procs_per_node=2", "parallel.name=ep2", "parallel=ep"),
             cpu_spec(*SHIPPED, "cluster.procs_per_node=2", "parallel.name=ep2_tiny_moe",
                      "parallel=ep"), over_cp, per_sequence, tp2_sp,
             cpu_spec(*SHIPPED, "cluster.procs_per_node=2", "parallel.name=tp2_moe",
                      "parallel=tp", "parallel.sequence_parallel=false", SEQUENCE_AUX),
             # ops policy over blocks holding the experts' own FSDP unit (its hooks' profiler
             # markers once failed backward: parallel/recompute.py `selective_contexts`)
             cpu_spec(*SHIPPED, "cluster.procs_per_node=2", "parallel.name=ep2_selective",
                      "parallel=ep", "recompute=selective"),
             # ZeRO-2: the experts' and the dense weights' FSDP keeps them gathered after forward
             cpu_spec(*SHIPPED, "cluster.procs_per_node=2", "parallel.name=ep2_zero2",
                      "parallel=ep", "parallel.zero=2")]
    ckpt = [cpu_spec(*SHIPPED, "cluster.procs_per_node=2", "training.global_batch_size=8",
                     "training.grad_accum_steps=-1", *extra)
            for extra in (["parallel=ep"], ["parallel=zero3"])]
    pairs = [(spec_to_dict(ckpt[0]), spec_to_dict(ckpt[1])),
             (spec_to_dict(ckpt[1]), spec_to_dict(ckpt[0]))]
    (tmp_path / "ckpt").mkdir()
    _, _, reshard = _spawn(tmp_path, 2, specs, [over_cp, tp2_sp], root=str(tmp_path / "ckpt"),
                           pairs=pairs)
    every = {name for rows in reshard for row in rows for name in row["names"]}
    assert any(name.endswith("moe.experts.w1") for name in every)
    assert [row["pair"] for row in reshard[0]] == [("ep", "zero3"), ("zero3", "ep")]


def test_ep2_with_zero3_with_tp_and_with_pp_match_one_process(tmp_path):
    """Parity of ep2 x zero3, ep2 x tp2 (with and without sequence parallel), ep2 x pp2
    (1F1B, and interleaved zero bubble: two stages per rank, split backward); the routing
    metrics of zero bubble gathered over the stages, and of ep2 x tp2 under sequence
    parallel."""
    zero_bubble = cpu_spec(*SHIPPED, "cluster.procs_per_node=4", "parallel.name=ep2_pp2_zb",
                           *ZERO_BUBBLE)
    ep_tp_sp = cpu_spec(*SHIPPED, "cluster.procs_per_node=4", "parallel.name=ep2_tp2_sp_moe",
                        "parallel=ep", "parallel.tp=2", SEQUENCE_AUX)
    specs = [cpu_spec(*BASE, "cluster.procs_per_node=4", f"parallel.name={name}", *extra)
             for name, extra in FOUR_RANKS.items()]
    specs += [cpu_spec(*SHIPPED, "cluster.procs_per_node=4", "parallel.name=ep2_zero3", *ZERO3),
              cpu_spec(*SHIPPED, "cluster.procs_per_node=4", "parallel.name=ep2_pp2", *PIPELINED),
              zero_bubble, ep_tp_sp]
    _spawn(tmp_path, 4, specs, [zero_bubble, ep_tp_sp])
