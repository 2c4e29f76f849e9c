"""The step's fullest phase (parallel.cost.peak): the new terms, each from the model's shapes
by hand. The whole peak is checked against real ranks' storages in
tests/distributed/test_activation_memory.py."""
from __future__ import annotations

import dataclasses

import pytest

from parallel.cost.activations import activation_bytes
from parallel.cost.memory import estimate_memory, layout_activation_bytes, static_bytes
from parallel.cost.params import numel, parameter_shapes
from parallel.cost.peak import (
    collective_buffer_bytes,
    grads_outlive_backward,
    recompute_working_set_bytes,
    step_phase_bytes,
)
from parallel.cost.step_memory_terms import (
    activation_kwargs,
    embedding_grad_transient_bytes,
    optimizer_transient_bytes,
    pipeline_buffer_bytes,
    resident_bytes,
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
    holds them all and AdamW's per-tensor temporaries; the last block's backward holds the
    head's gradients, the blocks' activations and the collective buffers; every phase the
    RoPE tables."""
    spec = cpu_spec(*TINY, "cluster.procs_per_node=2", "parallel=zero3", "recompute=full")
    static = static_bytes(spec, 0)
    act = layout_activation_bytes(spec, 0)
    memory = estimate_memory(spec, rank=0)
    phases = step_phase_bytes(spec, 0, grads=static.grads, optimizer=static.optimizer,
                              activations=act, loss_peak=memory.loss_peak)
    tables = 3 * spec.model.max_seq_len * spec.model.head_dim * 4  # cos, sin, signed sin
    assert resident_bytes(spec, 0) == tables
    assert phases["loss"] == tables + act + memory.loss_peak
    assert phases["optimizer step"] == (tables + static.grads
                                        + optimizer_transient_bytes(spec, 0))
    kwargs = activation_kwargs(spec, 0)
    head = activation_bytes(spec.model, recompute=spec.recompute, layers=[],
                            with_embedding=False, **kwargs)
    root_grads = static.grads - 4 * sum(  # the shards of the blocks' gradients
        (n + 1) // 2 for n in [_block_numel(spec.model)] * spec.model.n_layers)
    last = spec.model.n_layers - 1
    assert phases[f"backward layers.{last}"] == (
        tables + act - head + recompute_working_set_bytes(spec, last, kwargs) + root_grads
        + collective_buffer_bytes(spec, 0))
    assert memory.total == (memory.params + memory.optimizer + memory.weight_copies
                            + max(phases.values()))


def test_adamw_on_cpu_makes_the_temporaries_of_its_kernel():
    """foreach (training/optim.py's CPU choice): one list the size of the larger group's
    second moments. The single-tensor loop (tp without sequence parallelism: plain norms
    beside DTensors): sqrt of the second moment and its quotient alive together, beside the
    previous tensor's denominator; matrices and vectors are separate groups. tiny: the head
    [vocab, dim] follows w3 [ffn, dim] in the matrices' group."""
    cpu = cpu_spec(*TINY)
    m = cpu.model
    matrices = sum(numel(shape) for _, shape in parameter_shapes(m) if len(shape) == 2)
    assert optimizer_transient_bytes(cpu, 0) == 4 * matrices
    zero1 = cpu_spec(*TINY, "cluster.procs_per_node=2", "parallel=zero1")  # owned tensors only
    assert sum(optimizer_transient_bytes(zero1, rank) for rank in (0, 1)) == 4 * matrices
    tp = cpu_spec(*TINY, "parallel=tp", "parallel.sequence_parallel=false")
    assert optimizer_transient_bytes(tp, 0) == 4 * (m.ffn_dim * m.dim + 2 * m.vocab_size * m.dim) // 2
    bf16_state = cpu_spec(*TINY, "precision.optimizer_state_dtype=bf16")
    assert optimizer_transient_bytes(bf16_state, 0) == 0
    cuda = dataclasses.replace(cpu, training=dataclasses.replace(cpu.training, device="cuda"))
    assert optimizer_transient_bytes(cuda, 0) == 0  # fused


PP = ("cluster.procs_per_node=2", "parallel=pp")  # tiny: 2 blocks, 2 micro-batches of 1


def test_a_pipeline_rank_keeps_each_chunks_stage_output():
    """torch's schedule keeps every in-flight chunk's stage output until its backward: the
    last block's output on the first stage (fp32 [tokens, dim]), the logits on the last
    (compute dtype, whole vocabulary without loss parallel). 1F1B: pp - rank chunks."""
    spec = cpu_spec(*TINY, *PP, "precision=bf16")
    kwargs = activation_kwargs(spec, 0)
    tokens, m = kwargs["tokens"], spec.model

    def blocks(layer):
        return activation_bytes(m, recompute=spec.recompute, layers=[layer], with_head=False,
                                with_embedding=False, **kwargs)
    head = activation_bytes(m, recompute=spec.recompute, layers=[], with_embedding=False,
                            **kwargs)
    assert layout_activation_bytes(spec, 0) == 2 * blocks(0) + 2 * 4 * tokens * m.dim
    assert layout_activation_bytes(spec, 1) == blocks(1) + head + 2 * tokens * m.vocab_size


def test_pipeline_receive_buffers_beyond_the_inputs_in_flight():
    """One activation buffer per micro-batch on a stage that receives, one gradient buffer
    per micro-batch on a stage that sends; the in-flight chunks' inputs are activations."""
    spec = cpu_spec(*TINY, *PP)
    one = 4 * activation_kwargs(spec, 0)["tokens"] * spec.model.dim
    assert pipeline_buffer_bytes(spec, 0) == 2 * one  # gradients of 2 micro-batches
    assert pipeline_buffer_bytes(spec, 1) == (2 - 1) * one  # 2 inputs, 1 in flight
    assert resident_bytes(spec, 1) == resident_bytes(cpu_spec(*TINY), 0) + one


def test_the_embeddings_dense_gradient_under_tp():
    """Vocabulary-parallel embedding: a whole-vocabulary dense gradient, then the shard."""
    tp = cpu_spec(*TINY, "cluster.procs_per_node=2", "parallel=tp")
    assert embedding_grad_transient_bytes(tp, 0) == 4 * tp.model.vocab_size * tp.model.dim
    assert embedding_grad_transient_bytes(cpu_spec(*TINY), 0) == 0
    assert step_phase_bytes(tp, 0, grads=0, optimizer=0, activations=0, loss_peak=0)[
        "backward embedding"] == resident_bytes(tp, 0) + embedding_grad_transient_bytes(tp, 0)


def test_a_pipeline_keeps_autocasts_weight_copies_whatever_it_recomputes():
    """The schedule runs in one autocast region: its cast cache keeps every matmul weight's
    bf16 copy to the step's end; without pipelining a re-computed block keeps none."""
    from parallel.cost.memory import weight_copy_bytes

    def copies(*overrides):
        return weight_copy_bytes(cpu_spec(*TINY, "precision=bf16", *overrides), 0)
    assert copies(*PP, "recompute=full") == copies(*PP) > 0
    assert copies("recompute=full") < copies()


def test_without_a_steady_state_the_gradients_come_after_the_fullest_moment():
    """GPipe runs every forward first: at its first backward no gradient exists, and once
    they do a chunk is freed. 1F1B's last stage runs a forward after a backward."""
    gpipe = cpu_spec(*TINY, *PP, "parallel.pp_schedule=gpipe")
    one_f_one_b = cpu_spec(*TINY, *PP)
    counts = dict(grads=1000, optimizer=0, activations=600, loss_peak=0)
    for spec, grads_at_loss, freed in ((gpipe, 0, 300), (one_f_one_b, 1000, 0)):
        phases = step_phase_bytes(spec, 1, **counts)
        resident = resident_bytes(spec, 1)
        assert phases["loss"] == resident + grads_at_loss + 600
        assert phases["backward"] == resident + 1000 + 600 - freed + recompute_working_set_bytes(
            spec, 1, activation_kwargs(spec, 1))


def test_zero3_prefetches_a_gather_only_where_a_next_block_is():
    one_block = cpu_spec(*TINY, "cluster.procs_per_node=4", "parallel=pp", "parallel.pp=2",
                         "parallel.dp_shard=-1", "parallel.zero=3")
    assert collective_buffer_bytes(one_block, 0) == 4 * _block_numel(one_block.model)
