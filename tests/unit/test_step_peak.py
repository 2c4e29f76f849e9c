"""The step's fullest phase (parallel.cost.peak): the new terms, each from the model's shapes
by hand. The whole peak is checked against real ranks' storages in
tests/distributed/test_activation_memory.py."""
from __future__ import annotations

import dataclasses

import pytest

from parallel.cost.activations import activation_bytes
from parallel.cost.memory import estimate_memory, layout_activation_bytes, static_bytes
from parallel.cost.peak import (
    activation_kwargs,
    collective_buffer_bytes,
    grads_outlive_backward,
    optimizer_transient_bytes,
    recompute_working_set_bytes,
    step_phase_bytes,
)
from tests.support.specs import cpu_spec

TINY = ("model=tiny", "training.seq_len=32", "training.micro_batch_size=2")


def _block_numel(m, tp: int = 1) -> int:
    """One block's parameters, by hand: attention, SwiGLU (their matmuls split over tp) and
    two norms (whole)."""
    kv = m.n_kv_heads * m.head_dim
    attention = 2 * m.dim * m.n_heads * m.head_dim + 2 * m.dim * kv
    return (attention + 3 * m.dim * m.ffn_dim) // tp + 2 * m.dim


@pytest.mark.parametrize(("overrides", "want"), [
    (("parallel=zero3", "precision=bf16"), lambda n: 4 * n + 2 * n),  # reduce-scatter + gather
    (("parallel=zero3",), lambda n: 4 * n + 4 * n),
    (("parallel=zero2", "precision=bf16"), lambda n: 4 * n),  # no re-gather in backward
    (("parallel=ddp", "precision=bf16"), lambda n: 0),  # buckets are the gradients
    (("parallel=tp",), lambda n: 0),
])
def test_collective_buffers_are_the_reduce_scatter_input_and_the_prefetched_gather(
        overrides, want):
    spec = cpu_spec(*TINY, "cluster.procs_per_node=2", *overrides)
    assert collective_buffer_bytes(spec, 0) == want(_block_numel(spec.model))


def test_collective_buffers_hold_the_tp_local_unit():
    spec = cpu_spec(*TINY, "cluster.procs_per_node=4", "parallel=fsdp_tp", "precision=bf16")
    assert collective_buffer_bytes(spec, 0) == 6 * _block_numel(spec.model, tp=2)


def test_full_recompute_re_creates_one_blocks_activations_less_its_input():
    spec = cpu_spec(*TINY, "recompute=full")
    kwargs = activation_kwargs(spec, 0)
    none = dataclasses.replace(spec, recompute=cpu_spec(*TINY).recompute)
    whole = activation_bytes(none.model, recompute=none.recompute, layers=[0],
                             with_head=False, with_embedding=False, **kwargs)
    block_input = 4 * kwargs["tokens"] * spec.model.dim  # what the checkpoint keeps (fp32)
    assert recompute_working_set_bytes(spec, 0, kwargs) == whole - block_input > 0
    assert recompute_working_set_bytes(none, 0, kwargs) == 0


def test_gradients_outlive_backward_only_where_something_keeps_them():
    assert grads_outlive_backward(cpu_spec(*TINY, "cluster.procs_per_node=2", "parallel=ddp"))
    assert not grads_outlive_backward(cpu_spec(*TINY, "cluster.procs_per_node=2",
                                               "parallel=zero3"))
    assert grads_outlive_backward(cpu_spec(*TINY, "cluster.procs_per_node=2", "parallel=zero3",
                                           "training.grad_accum_steps=2"))


def test_the_phases_of_a_zero3_step():
    """At the loss no gradient exists yet (zero_grad(set_to_none=True)); the optimizer step
    holds them all and one moment-sized temporary; the last block's backward holds the
    head's gradients, the blocks' activations and the collective buffers."""
    spec = cpu_spec(*TINY, "cluster.procs_per_node=2", "parallel=zero3", "recompute=full")
    static = static_bytes(spec, 0)
    act = layout_activation_bytes(spec, 0)
    memory = estimate_memory(spec, rank=0)
    phases = step_phase_bytes(spec, 0, grads=static.grads, optimizer=static.optimizer,
                              activations=act, loss_peak=memory.loss_peak)
    assert phases["loss"] == act + memory.loss_peak
    assert phases["optimizer step"] == static.grads + static.optimizer // 2  # CPU: foreach
    kwargs = activation_kwargs(spec, 0)
    head = activation_bytes(spec.model, recompute=spec.recompute, layers=[],
                            with_embedding=False, **kwargs)
    root_grads = static.grads - 4 * sum(  # the shards of the blocks' gradients
        (n + 1) // 2 for n in [_block_numel(spec.model)] * spec.model.n_layers)
    last = spec.model.n_layers - 1
    assert phases[f"backward layers.{last}"] == (
        act - head + recompute_working_set_bytes(spec, last, kwargs) + root_grads
        + collective_buffer_bytes(spec, 0))
    assert memory.total == (memory.params + memory.optimizer + memory.weight_copies
                            + max(phases.values()))


def test_adamw_makes_a_moment_sized_temporary_only_in_its_foreach_form():
    cpu = cpu_spec(*TINY)
    assert optimizer_transient_bytes(cpu, 1000) == 500  # foreach sqrt of the second moments
    bf16_state = cpu_spec(*TINY, "precision.optimizer_state_dtype=bf16")
    assert optimizer_transient_bytes(bf16_state, 1000) == 0
    cuda = dataclasses.replace(cpu, training=dataclasses.replace(cpu.training, device="cuda"))
    assert optimizer_transient_bytes(cuda, 1000) == 0  # fused
