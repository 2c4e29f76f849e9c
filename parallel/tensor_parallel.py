"""Tensor parallel (Megatron column/row pairs) with optional sequence parallel, via DTensor.

Per block: wq, wk, wv and w1, w3 are column-parallel (heads / hidden units split over tp
ranks), wo and w2 row-parallel (partial sums reduced). The embedding is split by vocabulary
rows; the output head by vocabulary columns (which module is which: the torch-free table in
parallel/tp_plan.py, which the cost model reads too). With sequence parallel the residual
stream, the norms and the dropout-free element-wise work between the TP regions are sharded
over the sequence (dim 1): all-gather before the column-parallel inputs, reduce-scatter after the
row-parallel outputs, instead of all-reduce. With loss parallel the logits stay sharded over
the vocabulary and cross entropy runs under `loss_parallel()` (training/step.py).

Works on a model or a pipeline stage (modules a stage dropped are None and skipped).
"""
from __future__ import annotations

from torch import nn
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.tensor import Replicate, Shard
from torch.distributed.tensor.parallel import (
    ColwiseParallel,
    PrepareModuleInput,
    RowwiseParallel,
    SequenceParallel,
    parallelize_module,
)

from parallel.tp_plan import (
    BLOCK_COLUMN_PARALLEL,
    BLOCK_ROW_PARALLEL,
    VOCAB_PARALLEL_EMBEDDING,
    VOCAB_PARALLEL_HEAD,
)


def apply_tp(model: nn.Module, *, tp_mesh: DeviceMesh, sequence_parallel: bool,
             loss_parallel: bool) -> None:
    """Shard `model` in place over `tp_mesh` (a 1-D mesh of the tp ranks)."""
    if tp_mesh.size() == 1:
        return
    parallelize_module(model, tp_mesh, _root_plan(model, sequence_parallel=sequence_parallel,
                                                  loss_parallel=loss_parallel))
    for block in model.layers.values():
        parallelize_module(block, tp_mesh, _block_plan(sequence_parallel=sequence_parallel))


def keep_embedding_grad_sharded(model: nn.Module) -> None:
    """Call once the parameters are materialised (a hook on a meta parameter is lost)."""
    if model.tok_embeddings is not None:
        model.tok_embeddings.weight.register_post_accumulate_grad_hook(_shard_grad_like_param)


def _shard_grad_like_param(param) -> None:
    """The vocabulary-sharded embedding's gradient comes back whole (Replicate) from DTensor's
    embedding backward on torch 2.13; keep only this rank's rows, as the parameter has."""
    if param.grad is not None and param.grad.placements != param.placements:
        param.grad = param.grad.redistribute(placements=param.placements)


def _root_plan(model: nn.Module, *, sequence_parallel: bool, loss_parallel: bool) -> dict:
    residual = Shard(1) if sequence_parallel else Replicate()
    plan = {}
    if model.tok_embeddings is not None:
        plan[VOCAB_PARALLEL_EMBEDDING] = RowwiseParallel(input_layouts=Replicate(),
                                                         output_layouts=residual)
    if model.norm is not None and sequence_parallel:
        plan["norm"] = SequenceParallel()
    if model.output is not None:
        plan[VOCAB_PARALLEL_HEAD] = ColwiseParallel(
            input_layouts=residual,
            output_layouts=Shard(-1) if loss_parallel else Replicate(),
            use_local_output=not loss_parallel,
        )
    return plan


def _block_plan(*, sequence_parallel: bool) -> dict:
    plan = {path: ColwiseParallel() for path in BLOCK_COLUMN_PARALLEL}
    if not sequence_parallel:
        return {**plan, **{path: RowwiseParallel() for path in BLOCK_ROW_PARALLEL}}
    gather = PrepareModuleInput(input_layouts=(Shard(1),), desired_input_layouts=(Replicate(),))
    return {
        **plan,
        "attention_norm": SequenceParallel(),
        "attention": gather,
        "ffn_norm": SequenceParallel(),
        "feed_forward": gather,
        **{path: RowwiseParallel(output_layouts=Shard(1)) for path in BLOCK_ROW_PARALLEL},
    }
