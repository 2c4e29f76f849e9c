"""On one CUDA GPU: the plan's peak memory per rank (parallel.cost.memory, `estimate_memory`
.total: parameters, gradients, AdamW state, autocast weight copies, activations kept for
backward, the loss's transient) is within 10% of torch.cuda.max_memory_allocated over a
training step of a 1B-class model (llama3_1b, bf16 autocast, seq 2048, micro-batch 2), for
each recompute policy family, and with the head and loss in 8 row blocks (training.loss_chunks:
no whole [tokens, 128k] logits; the plan's peak drops by about 2 GiB). Skipped without CUDA; run with `pytest tests/gpu`.

The step is the trainer's own (training.step.forward_backward and clip_and_step) on the rank's
model (training.parallel_model.build_parallel_model), measured on the second step, so the
optimizer state already exists, as in every step after the first."""
from __future__ import annotations

import gc

import pytest
import torch

pytestmark = [pytest.mark.gpu,
              pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")]

POLICIES = ["none", "full", "selective", "selective_attention", "offload"]
CASES = [(policy, ()) for policy in POLICIES] + [
    (policy, ("training.loss_chunks=8",)) for policy in ("none", "full")]
OVERRIDES = ("logging=disabled", "model=llama3_1b", "precision=bf16", "parallel=single",
             "data=synthetic", "cluster.procs_per_node=1", "training.seq_len=2048",
             "training.micro_batch_size=2", "training.grad_accum_steps=1")
TOLERANCE = 0.10


def _cuda_spec(policy: str, extra: tuple[str, ...] = ()):
    from conf.compose import compose_config
    from conf.resolve import resolve
    from conf.spec import HostSpec

    major, minor = torch.cuda.get_device_capability()
    host = HostSpec(gpu_name=torch.cuda.get_device_name(), gpu_count=1,
                    compute_capability=major + minor / 10, cpu_count=1)
    return resolve(compose_config([*OVERRIDES, f"recompute={policy}", *extra]), host=host,
                   check_paths=False)


def _peak_of_second_step(spec) -> int:
    from training.data.build import build_train_batches
    from training.optim import build_optimizers
    from training.parallel_model import build_parallel_model
    from training.precision import autocast_context
    from training.step import clip_and_step, forward_backward

    device = torch.device("cuda")
    layout = build_parallel_model(spec, rank=0, device=device)
    optimizers = build_optimizers(layout, optim=spec.optim,
                                  state_dtype=spec.precision.optimizer_state_dtype)
    batches = build_train_batches(spec.data, spec.training, dp_rank=0, dp_size=1)
    autocast = autocast_context(spec.precision, device)
    for step in range(2):
        if step == 1:
            torch.cuda.synchronize()
            torch.cuda.reset_peak_memory_stats()
        forward_backward(layout, batches.next_step(), device=device, autocast=autocast)
        clip_and_step(layout, optimizers, grad_clip=spec.optim.grad_clip)
    torch.cuda.synchronize()
    peak = torch.cuda.max_memory_allocated()
    del layout, optimizers
    gc.collect()
    torch.cuda.empty_cache()
    return peak


@pytest.mark.parametrize("policy, extra", CASES, ids=[" ".join((p, *e)) for p, e in CASES])
def test_plan_peak_memory_matches_max_memory_allocated(policy, extra):
    from parallel.cost.memory import estimate_memory

    spec = _cuda_spec(policy, extra)
    plan = estimate_memory(spec)
    measured = _peak_of_second_step(spec)
    error = (plan.total - measured) / measured
    print(f"{policy} {' '.join(extra)}: measured {measured / 2**30:.2f} GiB, plan {plan.total / 2**30:.2f} GiB "
          f"(activations {plan.activations / 2**30:.2f}, copies "
          f"{plan.weight_copies / 2**30:.2f}, loss peak {plan.loss_peak / 2**30:.2f}), "
          f"error {error:+.1%}")
    assert abs(error) <= TOLERANCE, (policy, measured, plan)
