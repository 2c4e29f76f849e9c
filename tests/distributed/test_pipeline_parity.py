"""2-stage pipelines against one process on the same global batch: loss sum, every gradient,
every parameter after one AdamW step with the global grad-norm clip (fp32, atol 5e-6, rtol
1e-4), and the forward-only (eval) loss before and after the step, for every schedule; also
with FSDP2-wrapped stages (re-shard after forward, as zero=3), which zero bubble once broke."""
from __future__ import annotations

import pytest
import torch

from conf.spec import RunSpec
from conf.run_dir.spec_io import spec_from_dict, spec_to_dict
from tests.support.layout_parity import ATOL, RTOL, reference_batches
from tests.support.spawn import run_on_ranks
from tests.support.specs import synthetic_spec

pytestmark = pytest.mark.distributed

CPU = torch.device("cpu")
NO_AUTOCAST = torch.autocast("cpu", enabled=False)


def pp_spec(*overrides: str) -> RunSpec:
    return synthetic_spec("model.n_layers=4", "parallel=pp", "training.micro_batch_size=4",
                          "parallel.pp_microbatches=2", *overrides)


CASES = {
    "gpipe": pp_spec("parallel.pp_schedule=gpipe"),
    "1f1b": pp_spec("parallel.pp_schedule=1f1b"),
    "interleaved_1f1b": pp_spec("parallel.pp_schedule=interleaved_1f1b",
                                "parallel.pp_virtual_stages=2"),
    "looped_bfs": pp_spec("parallel.pp_schedule=looped_bfs", "parallel.pp_virtual_stages=2"),
    "interleaved_zero_bubble": pp_spec("parallel.pp_schedule=interleaved_zero_bubble",
                                       "parallel.pp_virtual_stages=2"),
    "1f1b_accum2": pp_spec("parallel.pp_schedule=1f1b", "training.micro_batch_size=2",
                           "training.grad_accum_steps=2"),
    "interleaved_uneven": pp_spec("model.n_layers=5", "parallel.pp_schedule=interleaved_1f1b",
                                  "parallel.pp_virtual_stages=2",
                                  "parallel.pp_layer_split=[1,2,1,1]"),
}
FSDP_CASES = {  # stages wrapped by fully_shard (on a 1-rank dp axis) before the schedule
    "interleaved_zero_bubble_fsdp": CASES["interleaved_zero_bubble"],
    "1f1b_accum2_fsdp": CASES["1f1b_accum2"],
}


def assert_close(actual, expected, what: str) -> None:
    torch.testing.assert_close(actual, expected, atol=ATOL, rtol=RTOL, msg=what)


def reference_eval_sums(model, micro_batches) -> list[torch.Tensor]:
    from training.step import token_loss_sum

    with torch.no_grad():
        return [token_loss_sum(model, x, y, NO_AUTOCAST) for x, y in micro_batches]


def pipeline_eval_sums(schedule, micro_batches, *, first: bool, last: bool, loss) -> list:
    from parallel.pipeline import pipeline_eval_loss_sum

    return [pipeline_eval_loss_sum(schedule, inputs=x, targets=y, is_first=first, is_last=last,
                                   loss=loss, autocast=NO_AUTOCAST) for x, y in micro_batches]


def shard_parts(parts: list, dp_mesh) -> None:
    """zero=3-style FSDP2: each block its own unit, re-sharded after forward; then the stage."""
    from torch.distributed.fsdp import fully_shard

    for part in parts:
        for block in part.layers.values():
            fully_shard(block, mesh=dp_mesh, reshard_after_forward=True)
        fully_shard(part, mesh=dp_mesh, reshard_after_forward=True)


def full(tensor: torch.Tensor) -> torch.Tensor:
    return (tensor.full_tensor() if hasattr(tensor, "full_tensor") else tensor).detach().clone()


def pipeline_update(spec: RunSpec, *, rank: int, pp_group, micro_batches, dp_mesh=None) -> dict:
    """Eval, one training step (all micro-batches, clip, AdamW), eval again, on this rank;
    the stages are sharded over `dp_mesh` first when one is given."""
    from parallel.grad_norm import total_grad_norm
    from parallel.pipeline import (PipelineLoss, build_schedule, is_first_stage, is_last_stage,
                                   pipeline_forward_backward, split_model)
    from training.loss import IGNORE_INDEX, token_cross_entropy_sum
    from training.model_builder import build_model
    from training.optim import build_optimizer

    parts = split_model(build_model(spec.model, device=CPU, seed=spec.training.seed),
                        parallel=spec.parallel, pp_rank=rank)
    if dp_mesh is not None:
        shard_parts(parts, dp_mesh)
    loss = PipelineLoss(token_cross_entropy_sum)
    schedule = build_schedule(parts, parallel=spec.parallel, pp_rank=rank, pp_group=pp_group,
                              device=CPU, loss=loss)
    first = is_first_stage(parallel=spec.parallel, pp_rank=rank)
    last = is_last_stage(parallel=spec.parallel, pp_rank=rank)
    eval_before = pipeline_eval_sums(schedule, micro_batches, first=first, last=last, loss=loss)
    tokens = sum(int((y != IGNORE_INDEX).sum()) for _, y in micro_batches)
    loss_sum = sum(pipeline_forward_backward(
        schedule, inputs=x, targets=y, is_first=first, is_last=last, loss=loss,
        loss_scale=1.0 / tokens, autocast=NO_AUTOCAST) for x, y in micro_batches)
    named = [(n, p) for part in parts for n, p in part.named_parameters()]
    grads = {n: full(p.grad) for n, p in named}
    optimizer = build_optimizer(torch.nn.ModuleList(parts), optim=spec.optim)
    norm = total_grad_norm([p for part in parts for p in part.parameters()], pp_group=pp_group)
    torch.nn.utils.clip_grads_with_norm_([p for _, p in named], spec.optim.grad_clip, norm)
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)
    eval_after = pipeline_eval_sums(schedule, micro_batches, first=first, last=last, loss=loss)
    return {"first": first, "last": last, "loss_sum": loss_sum, "grads": grads,
            "params": {n: full(p) for n, p in named}, "norm": float(norm),
            "eval_before": eval_before, "eval_after": eval_after}


def reference_update(spec: RunSpec) -> dict:
    """One process, the whole global batch as one micro-batch: mean token loss, clip, AdamW."""
    from training.model_builder import build_model
    from training.optim import build_optimizer
    from training.step import IGNORE_INDEX, token_loss_sum

    model = build_model(spec.model, device=CPU, seed=spec.training.seed)
    optimizer = build_optimizer(model, optim=spec.optim)
    ((inputs, targets),) = reference_batches(spec)
    loss_sum = token_loss_sum(model, inputs, targets, NO_AUTOCAST)
    (loss_sum / int((targets != IGNORE_INDEX).sum())).backward()
    grads = {n: p.grad.detach().clone() for n, p in model.named_parameters()}
    norm = torch.nn.utils.clip_grad_norm_(model.parameters(), spec.optim.grad_clip)
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)
    return {"model": model, "loss_sum": loss_sum.detach(), "grads": grads, "norm": float(norm),
            "params": {n: p.detach().clone() for n, p in model.named_parameters()}}


def check_against_reference(spec: RunSpec, mine: dict, micro_batches) -> None:
    """Compare this rank's pipeline results with a single-process run on the same data."""
    from training.model_builder import build_model

    ref_eval_before = reference_eval_sums(
        build_model(spec.model, device=CPU, seed=spec.training.seed), micro_batches)
    ref = reference_update(spec)
    ref_eval_after = reference_eval_sums(ref["model"], micro_batches)
    assert len(mine["eval_before"]) == len(mine["eval_after"]) == len(micro_batches)
    if mine["last"]:
        assert_close(mine["loss_sum"], ref["loss_sum"], "training loss sum")
        for i, (got, want) in enumerate(zip(mine["eval_before"], ref_eval_before)):
            assert_close(got, want, f"eval loss sum before the step, micro-batch {i}")
        for i, (got, want) in enumerate(zip(mine["eval_after"], ref_eval_after)):
            assert_close(got, want, f"eval loss sum after the step, micro-batch {i}")
    else:
        assert float(mine["loss_sum"]) == 0.0
        assert all(float(x) == 0.0 for x in mine["eval_before"] + mine["eval_after"])
    norms = (mine["norm"], ref["norm"])  # > grad_clip here, so the clip is exercised
    assert abs(norms[0] - norms[1]) <= ATOL + RTOL * norms[1], norms
    for name, grad in mine["grads"].items():
        assert_close(grad, ref["grads"][name], f"grad {name}")
    for name, param in mine["params"].items():
        assert_close(param, ref["params"][name], f"param {name}")


def pipeline_rank(*, rank: int, world_size: int, cases: dict[str, dict],
                  fsdp_cases: set[str]) -> dict[str, dict]:
    from torch.distributed.device_mesh import init_device_mesh

    from training.data.build import build_train_batches

    mesh = init_device_mesh("cpu", (world_size, 1), mesh_dim_names=("pp", "dp"))
    pp_group = mesh["pp"].get_group()
    report = {}
    for name, spec_dict in cases.items():
        spec = spec_from_dict(RunSpec, spec_dict)
        micro_batches = build_train_batches(spec.data, spec.training, dp_rank=0,
                                            dp_size=1).next_step()
        mine = pipeline_update(spec, rank=rank, pp_group=pp_group, micro_batches=micro_batches,
                               dp_mesh=mesh["dp"] if name in fsdp_cases else None)
        check_against_reference(spec, mine, micro_batches)
        report[name] = {"first": mine["first"], "last": mine["last"],
                        "names": sorted(mine["params"]),
                        "n_micro_batches": len(micro_batches)}
    return report


def test_pipeline_schedules_match_single_process(tmp_path):
    cases = {**CASES, **FSDP_CASES}
    results = run_on_ranks(pipeline_rank, world_size=2, workdir=tmp_path,
                           kwargs={"cases": {k: spec_to_dict(s) for k, s in cases.items()},
                                   "fsdp_cases": set(FSDP_CASES)})
    from training.model_builder import build_model

    assert list(results[0]) == list(cases)
    for name, spec in cases.items():
        model = build_model(spec.model, device=CPU, seed=0)
        expected = {n for n, _ in model.named_parameters()}
        first, second = (set(r[name]["names"]) for r in results)
        assert not first & second, f"{name}: parameters on both ranks: {sorted(first & second)}"
        assert first | second == expected, f"{name}: missing {sorted(expected - (first | second))}"
        assert [r[name]["first"] for r in results] == [True, False], name
        assert [r[name]["last"] for r in results] == [False, True], name
    assert results[0]["1f1b_accum2"]["n_micro_batches"] == 2
