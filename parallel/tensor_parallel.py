"""Tensor parallel (Megatron column/row pairs) with optional sequence parallel, via DTensor.

Per block, the model family's column-parallel modules (Llama: the q/k/v projections and the
SwiGLU gate and up) split heads / hidden units over tp ranks and its row-parallel ones (the
output and down projections) reduce partial sums. The embedding is split by vocabulary rows; the
output head by vocabulary columns (a tied head uses the embedding's vocabulary-sharded weight:
parallel/tied_embeddings.py; which module is which: the family's torch-free `TpPlan`,
training/models/, which the cost model reads too through parallel/tp_plan.py). With sequence
parallel the residual
stream, the norms and the dropout-free element-wise work between the TP regions are sharded
over the sequence (dim 1): all-gather before the column-parallel inputs, reduce-scatter after the
row-parallel outputs, instead of all-reduce. With loss parallel the logits stay sharded over
the vocabulary and cross entropy runs under `loss_parallel()` (training/step.py). With fp8 the
linears fp8 converted get torchao's Float8 styles instead (parallel/float8_tp.py). Per-head
norms (Qwen3's q/k norms) run on each rank's heads with their weight replicated (DTensor sums
its gradient over tp). Token-local modules (the MoE feed-forward: router and experts whole on
every rank) take, under sequence parallel, the rank's share of the sequence as a plain tensor
and return one; their gradients are summed over tp by parallel/tp_replicated.py.

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

from parallel.tied_embeddings import TiedHeadParallel
from training.models import family_of
from training.models.family import BLOCKS, TpPlan


def apply_tp(model: nn.Module, *, tp_mesh: DeviceMesh, sequence_parallel: bool,
             loss_parallel: bool, fp8: bool = False) -> list[nn.Module]:
    """Shard `model` in place over `tp_mesh` (a 1-D mesh of the tp ranks); `fp8`: the model's
    linears were converted to torchao's Float8Linear (precision=fp8). Return the token-local
    modules whose gradients must be summed over tp (parallel/tp_replicated.py)."""
    if tp_mesh.size() == 1:
        return []
    tp = family_of(model.spec).tp
    parallelize_module(model, tp_mesh, _root_plan(model, tp, sequence_parallel=sequence_parallel,
                                                  loss_parallel=loss_parallel))
    local = []
    for block in getattr(model, BLOCKS).values():
        parallelize_module(block, tp_mesh,
                           block_plan(block, tp, sequence_parallel=sequence_parallel, fp8=fp8))
        if sequence_parallel:
            local += _token_local(block, tp, group=tp_mesh.get_group())
    return local


def block_plan(block: nn.Module, tp: TpPlan, *, sequence_parallel: bool, fp8: bool) -> dict:
    """One block's {module path: style}: the plain DTensor styles, or torchao's Float8 ones for
    the modules fp8 converted."""
    if not fp8:
        return _block_plan(tp, sequence_parallel=sequence_parallel)
    from parallel.float8_tp import float8_paths, float8_styles

    return _block_plan(tp, sequence_parallel=sequence_parallel,
                       float8=(float8_paths(block, tp), float8_styles()))


def _token_local(block: nn.Module, tp: TpPlan, *, group) -> list[nn.Module]:
    """The block's token-local modules, each told it sees its rank's share of the sequence."""
    found = []
    for path in tp.token_local:
        try:
            module = block.get_submodule(path)
        except AttributeError:  # a dense block (dense layers before the first MoE layer)
            continue
        if hasattr(module, "shard_tokens"):
            module.shard_tokens(group)
        found.append(module)
    return found


def keep_embedding_grad_sharded(model: nn.Module) -> None:
    """Call once the parameters are materialised (a hook on a meta parameter is lost)."""
    embedding = getattr(model, family_of(model.spec).tp.embedding)
    if embedding is not None:
        embedding.weight.register_post_accumulate_grad_hook(_shard_grad_like_param)


def _shard_grad_like_param(param) -> None:
    """The vocabulary-sharded embedding's gradient comes back whole (Replicate) from DTensor's
    embedding backward on torch 2.13; keep only this rank's rows, as the parameter has."""
    if param.grad is not None and param.grad.placements != param.placements:
        param.grad = param.grad.redistribute(placements=param.placements)


def _root_plan(model: nn.Module, tp: TpPlan, *, sequence_parallel: bool,
               loss_parallel: bool) -> dict:
    residual = Shard(1) if sequence_parallel else Replicate()
    plan = {}
    if getattr(model, tp.embedding) is not None:
        plan[tp.embedding] = RowwiseParallel(input_layouts=Replicate(), output_layouts=residual)
    if getattr(model, tp.final_norm) is not None and sequence_parallel:
        plan[tp.final_norm] = SequenceParallel()
    if getattr(model, tp.head) is not None and model.spec.tie_embeddings:
        plan[tp.head] = TiedHeadParallel(input_layout=residual, loss_parallel=loss_parallel)
    elif getattr(model, tp.head) is not None:
        plan[tp.head] = ColwiseParallel(
            input_layouts=residual,
            output_layouts=Shard(-1) if loss_parallel else Replicate(),
            use_local_output=not loss_parallel,
        )
    return plan


PLAIN = (ColwiseParallel, RowwiseParallel, PrepareModuleInput)


def _block_plan(tp: TpPlan, *, sequence_parallel: bool,
                float8: tuple[frozenset[str], tuple[type, type, type]] = (frozenset(), PLAIN),
                ) -> dict:
    """`float8`: the paths that take the Float8 styles, and those (column, row, gather) styles."""
    paths, styles = float8

    def style(path: str) -> tuple[type, type, type]:
        return styles if path in paths else PLAIN

    plan = {path: style(path)[0]() for path in tp.column}
    # a per-head norm on the column-parallel output [B, T, heads, head_dim]: split over heads
    plan |= {path: SequenceParallel(sequence_dim=2, use_local_output=True)
             for path in tp.head_norms}
    if not sequence_parallel:
        return {**plan, **{path: style(path)[1]() for path in tp.row}}
    own_share = PrepareModuleInput(input_layouts=(Shard(1),), desired_input_layouts=(Shard(1),),
                                   use_local_output=True)
    return {
        **plan,
        **{path: SequenceParallel() for path in tp.sequence_norms},
        **{path: style(path)[2](input_layouts=(Shard(1),), desired_input_layouts=(Replicate(),))
           for path in tp.gathered_inputs},
        **{path: own_share for path in tp.token_local},
        **{path: style(path)[1](output_layouts=Shard(1)) for path in tp.row},
    }
