"""On CUDA with fp8 tensor cores (cc >= 8.9) and torchao: precision=fp8 under tensor parallel
(parallel/float8_tp.py, torchao's Float8 TP styles).

1. One GPU: the TP pass (root plan + every block's plan, sequence parallel on, fp8) applied
   on a 1-rank tp mesh of a world of 1 (NCCL), against the same fp8 model unsharded: the loss
   and every gradient agree. On one rank the gathers and reduce-scatters move nothing, so
   this proves the Float8 styles compose with meshrun's blocks (DTensor(Float8Tensor) inputs
   into the converted linears, the plain styles on the embedding and the bf16 head, the
   backward's fp8 gradient casts), not the communication itself.
2. Two GPUs: `meshrun run parallel=tp precision=fp8` over NCCL learns (skipped with fewer).

Skipped without CUDA (no GPU on this project's CI machines); run with `pytest tests/gpu`.
"""
from __future__ import annotations

import json

import pytest
import torch

pytestmark = [pytest.mark.gpu,
              pytest.mark.skipif(not torch.cuda.is_available()
                                 or torch.cuda.get_device_capability() < (8, 9),
                                 reason="needs a CUDA GPU with fp8 (cc >= 8.9)")]

OVERRIDES = ("logging=disabled", "model=tiny", "precision=fp8", "parallel=single",
             "data=synthetic", "cluster.procs_per_node=1", "training.seq_len=32")


def _fp8_spec():
    from conf.compose import compose_config
    from conf.resolve import resolve
    from conf.spec import HostSpec

    major, minor = torch.cuda.get_device_capability()
    host = HostSpec(gpu_name=torch.cuda.get_device_name(), gpu_count=1,
                    compute_capability=major + minor / 10, cpu_count=1)
    return resolve(compose_config(list(OVERRIDES)), host=host, check_paths=False)


def _fp8_model(spec, device, tp_mesh=None):
    from torch.distributed.tensor.parallel import parallelize_module

    from parallel.tensor_parallel import _root_plan, block_plan
    from training.init import materialize
    from training.model_builder import build_model_on_meta
    from training.models import family_of
    from training.models.family import BLOCKS
    from training.precision import apply_fp8

    model = build_model_on_meta(spec.model)
    apply_fp8(model, spec.precision)
    if tp_mesh is not None:  # apply_tp without its one-rank shortcut
        tp = family_of(spec.model).tp
        parallelize_module(model, tp_mesh, _root_plan(model, tp, sequence_parallel=True,
                                                      loss_parallel=False))
        for block in getattr(model, BLOCKS).values():
            plan = block_plan(block, tp, sequence_parallel=True, fp8=True)
            assert {type(s).__name__ for s in plan.values()} >= {
                "Float8ColwiseParallel", "Float8RowwiseParallel", "PrepareFloat8ModuleInput"}
            parallelize_module(block, tp_mesh, plan)
    materialize(model, model=spec.model, device=device, seed=spec.training.seed)
    return model


def _loss_and_grads(model, tokens, targets):
    from training.loss import token_cross_entropy_sum

    with torch.autocast("cuda", dtype=torch.bfloat16):
        loss = token_cross_entropy_sum(model(tokens), targets)
    loss.backward()
    grads = {}
    for name, param in model.named_parameters():
        grad = param.grad
        grads[name] = grad.full_tensor() if hasattr(grad, "full_tensor") else grad
    return loss.detach(), grads


def test_float8_tp_styles_on_a_one_rank_tp_mesh_match_the_unsharded_fp8_model(tmp_path):
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh

    device = torch.device("cuda", 0)
    torch.cuda.set_device(device)
    store = dist.FileStore(str(tmp_path / "store"), 1)
    dist.init_process_group("nccl", store=store, rank=0, world_size=1)
    try:
        spec = _fp8_spec()
        mesh = init_device_mesh("cuda", (1,), mesh_dim_names=("tp",))
        gen = torch.Generator(device="cpu").manual_seed(0)
        tokens = torch.randint(0, spec.model.vocab_size, (2, 33), generator=gen).to(device)
        ref_loss, ref_grads = _loss_and_grads(_fp8_model(spec, device), tokens[:, :-1],
                                              tokens[:, 1:])
        loss, grads = _loss_and_grads(_fp8_model(spec, device, mesh), tokens[:, :-1],
                                      tokens[:, 1:])
        torch.testing.assert_close(loss, ref_loss, rtol=1e-4, atol=1e-4)
        assert grads.keys() == ref_grads.keys()
        for name, want in ref_grads.items():
            torch.testing.assert_close(grads[name], want, rtol=1e-3, atol=1e-5, msg=name)
    finally:
        dist.barrier()
        dist.destroy_process_group()


@pytest.mark.skipif(torch.cuda.device_count() < 2, reason="needs 2 CUDA GPUs")
def test_fp8_with_tp_runs_on_two_gpus_and_learns(tmp_path):
    from tests.support.meshrun_cli import meshrun

    result = meshrun("run", "parallel=tp", "precision=fp8", "cluster.procs_per_node=2",
                     "training.steps=20", "training.eval_every=0", f"runs_dir={tmp_path}",
                     timeout=600)
    assert result.returncode == 0, result.stdout + result.stderr
    (run_dir,) = list(tmp_path.iterdir())
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    train = [r for r in rows if r["kind"] == "train"]
    assert train[-1]["loss"] < train[0]["loss"]
