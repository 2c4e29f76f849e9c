"""Pipeline parallelism: split the model into stages, build torch's schedule, run one step.

A stage is a pruned deep copy of the whole model: it keeps only its blocks (keys unchanged, so
state-dict names equal the full model's), the model family's `first_stage` modules (the
embedding) only on the first stage and its `last_stage` ones (final norm, head) only on the
last; with tied embeddings the last stage holds a copy of the embedding too (its weight is the
head's), kept equal to the first stage's by summing their gradients
(parallel/tied_embeddings.py). There are `ParallelSpec.n_stages` stages; in the loop
layout every supported schedule uses, pp rank r owns stages r, r + pp, r + 2 pp, ...

Schedules are torch.distributed.pipelining's, built with `scale_grads=False`: the loss of each
pipeline micro-batch is already a token-sum times `loss_scale` (the caller's global
normalisation), so torch must not divide gradients by the number of micro-batches again.

Shapes are inferred by torch at the first `step()` (a real forward, and a backward with respect
to stage inputs only, of micro-batch 0) and again whenever the schedule switches between
training and `eval()`. So every batch of one mode must have the same shape, and an evaluation
must not fall between the accumulation steps of one optimizer step (with FSDP parts the
re-inference clears `.grad`). A per-token loss a stage computes itself (MoE router losses)
enters through that stage's output, weighed by its pipeline micro-batch's target tokens
(`MicroBatchStage`); torch's shape-inference forward is not one of those forwards.
"""
from __future__ import annotations

import contextlib
import copy

import torch
from torch import nn
from torch.distributed.fsdp import FSDPModule
from torch.distributed.tensor import DTensor
from torch.distributed.pipelining import PipelineStage
from torch.distributed.pipelining.schedules import PipelineScheduleSingle, get_schedule_class

from conf.rules.parallel_rules import SPLIT_BACKWARD_SCHEDULES
from conf.rules.split_rules import stage_split
from conf.spec import ParallelSpec
from parallel.data_parallel import unwrap
from parallel.dims import pipeline_stage_ids
from training.models import family_of
from training.models.family import BLOCKS

SCHEDULE_CLASSES = {
    "gpipe": "GPipe",
    "1f1b": "1F1B",
    "interleaved_1f1b": "Interleaved1F1B",
    "looped_bfs": "LoopedBFS",
    "interleaved_zero_bubble": "InterleavedZeroBubble",
}
"""meshrun schedule name -> torch.distributed.pipelining schedule name (`get_schedule_class`)."""



# ---------------------------------------------------------------------------------------------
# Stage layout and model split
# ---------------------------------------------------------------------------------------------

def stage_ids(*, parallel: ParallelSpec, pp_rank: int) -> list[int]:
    """Global stage indices `pp_rank` owns, ascending (loop layout: r, r + pp, ...)."""
    assert parallel.pp_schedule in SCHEDULE_CLASSES, parallel.pp_schedule
    assert 0 <= pp_rank < parallel.pp, (pp_rank, parallel.pp)
    return pipeline_stage_ids(pp=parallel.pp, virtual_stages=parallel.pp_virtual_stages,
                              pp_rank=pp_rank)


def is_first_stage(*, parallel: ParallelSpec, pp_rank: int) -> bool:
    """Whether this rank holds stage 0 (it feeds the token inputs)."""
    return 0 in stage_ids(parallel=parallel, pp_rank=pp_rank)


def is_last_stage(*, parallel: ParallelSpec, pp_rank: int) -> bool:
    """Whether this rank holds the last stage (it takes the targets and computes the loss)."""
    return parallel.n_stages - 1 in stage_ids(parallel=parallel, pp_rank=pp_rank)


def stage_layers(*, parallel: ParallelSpec, n_layers: int, stage: int) -> list[str]:
    """Keys (global block indices) of the blocks stage `stage` runs."""
    split = stage_split(parallel, n_layers)
    start = sum(split[:stage])
    return [str(i) for i in range(start, start + split[stage])]


def build_stage_module(model: nn.Module, *, keep_layers: list[str], first: bool,
                       last: bool) -> nn.Module:
    """Deep copy of `model` holding only `keep_layers` (+ embeddings if first, head if last,
    and the embedding too if last with tied embeddings: `ModelFamily.stage_holds`).

    Dropped submodules are never copied: deepcopy's memo maps each of them to None.
    """
    family = family_of(model.spec)
    dropped = [block for key, block in getattr(model, BLOCKS).items() if key not in keep_layers]
    dropped += [getattr(model, name) for name in (*family.first_stage, *family.last_stage)
                if not family.stage_holds(name, first=first, last=last,
                                          tied=model.spec.tie_embeddings)]
    memo = {id(module): None for module in dropped if module is not None}
    stage = copy.deepcopy(model, memo)
    blocks = getattr(stage, BLOCKS)
    for key in [k for k in blocks.keys() if k not in keep_layers]:
        del blocks[key]
    return stage


def split_model(model: nn.Module, *, parallel: ParallelSpec, pp_rank: int) -> list[nn.Module]:
    """One pruned copy of `model` per stage this rank owns, in `stage_ids` order.

    `model` is left untouched; the caller drops it to free its memory.
    """
    last = parallel.n_stages - 1
    n_layers = len(getattr(model, BLOCKS))
    return [
        build_stage_module(model, first=s == 0, last=s == last,
                           keep_layers=stage_layers(parallel=parallel, n_layers=n_layers, stage=s))
        for s in stage_ids(parallel=parallel, pp_rank=pp_rank)
    ]


# ---------------------------------------------------------------------------------------------
# Loss and schedule
# ---------------------------------------------------------------------------------------------

class PipelineLoss:
    """Loss of one pipeline micro-batch: `token_loss(logits, targets)` (the training loss's
    sum over tokens, given by the caller) times `scale`.

    `scale` is set per step by the caller (dp group size / global target tokens). Each call
    also records the unscaled sum in `token_loss_sums`, from which the step's loss is read.
    """

    def __init__(self, token_loss, *, vocab_sharded: bool = False,
                 ignore_index: int = -100) -> None:
        self.token_loss = token_loss
        self.vocab_sharded = vocab_sharded
        """The last stage's logits stay sharded over the vocabulary (tp with loss parallel):
        the schedule runs under torch's `loss_parallel()`, forward and backward."""
        self.ignore_index = ignore_index
        """The target value `token_loss` skips (not a target token)."""
        self.scale: float = 1.0
        self.token_loss_sums: list[torch.Tensor] = []
        self.microbatch_weights: list[torch.Tensor] | None = None
        """Per pipeline micro-batch of the running step: its target tokens x `scale`, the
        weight of a per-token loss a stage adds (router losses); None outside training and
        where no stage adds one."""
        self.weighs = False
        """A stage of this rank adds a per-token loss (MicroBatchStage sets it)."""

    def weigh_microbatches(self, targets: torch.Tensor, n_microbatches: int) -> None:
        """`microbatch_weights` of `targets` split as torch's schedule splits it (dim 0),
        where a stage needs them (`weighs`)."""
        if not self.weighs:
            return
        self.microbatch_weights = [(part != self.ignore_index).sum() * self.scale
                                   for part in torch.tensor_split(targets, n_microbatches)]

    def __call__(self, logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        loss_sum = self.token_loss(logits, targets)
        whole = loss_sum.full_tensor() if isinstance(loss_sum, DTensor) else loss_sum
        self.token_loss_sums.append(whole.detach())
        return loss_sum * self.scale

    def context(self):
        """Where the schedule runs: under loss parallel when the logits are sharded."""
        if not self.vocab_sharded:
            return contextlib.nullcontext()
        from torch.distributed.tensor.parallel import loss_parallel

        return loss_parallel()


class MicroBatchStage(PipelineStage):
    """torch's stage. A stage module with `pipeline_microbatch` (an MoE model: router losses,
    routing loads) runs each real forward of pipeline micro-batch i inside
    `pipeline_microbatch(loss.microbatch_weights[i])`, and every other forward (torch's
    shape inference) outside it (`as_pipeline_stage`)."""

    def __init__(self, submod: nn.Module, *args, loss: PipelineLoss, **kwargs) -> None:
        super().__init__(submod, *args, **kwargs)
        self.weights_from = loss
        module = unwrap(submod)
        self.microbatch = getattr(module, "pipeline_microbatch", None)
        if self.microbatch is not None:
            module.as_pipeline_stage()
            loss.weighs = True

    def forward_one_chunk(self, fwd_chunk_id: int, *args, **kwargs):
        if self.microbatch is None:
            return super().forward_one_chunk(fwd_chunk_id, *args, **kwargs)
        weights = self.weights_from.microbatch_weights
        with self.microbatch(None if weights is None else weights[fwd_chunk_id]):
            return super().forward_one_chunk(fwd_chunk_id, *args, **kwargs)


def build_schedule(parts: list[nn.Module], *, parallel: ParallelSpec, pp_rank: int, pp_group,
                   device: torch.device, loss: PipelineLoss):
    """torch's schedule over `parts` (from `split_model`, possibly already wrapped by
    FSDP2 / TP), one `PipelineStage` per part, communicating over `pp_group`."""
    ids = stage_ids(parallel=parallel, pp_rank=pp_rank)
    if len(parts) != len(ids):
        raise ValueError(f"{len(parts)} parts for stages {ids} of pp rank {pp_rank}")
    stages = [MicroBatchStage(part, stage_index=index, num_stages=parallel.n_stages,
                              device=torch.device(device), group=pp_group, loss=loss)
              for part, index in zip(parts, ids)]
    assert stages[0].group_rank == pp_rank, (stages[0].group_rank, pp_rank)
    if parallel.pp_schedule in SPLIT_BACKWARD_SCHEDULES:
        keep_unsharded_after_forward(parts)
    schedule_class = get_schedule_class(SCHEDULE_CLASSES[parallel.pp_schedule])
    single = issubclass(schedule_class, PipelineScheduleSingle)
    return schedule_class(stages[0] if single else stages,
                          n_microbatches=parallel.pp_microbatches, loss_fn=loss,
                          scale_grads=False)


def keep_unsharded_after_forward(parts: list[nn.Module]) -> None:
    """Zero-bubble I/W split: torch finds the weights of the W pass by walking autograd from
    `part.parameters()` after forward. An FSDP2 unit that re-sharded after forward (zero=3)
    then exposes its sharded parameters, which are not in the graph, and its weight gradients
    are silently lost (seen in torch 2.13). Keep every FSDP unit unsharded until backward."""
    for part in parts:
        if isinstance(part, FSDPModule):
            part.set_reshard_after_forward(False)  # recurses into the block units


# ---------------------------------------------------------------------------------------------
# Running it
# ---------------------------------------------------------------------------------------------

def _step_args(*, inputs: torch.Tensor, targets: torch.Tensor, is_first: bool,
               is_last: bool, documents: dict | None) -> tuple[tuple, dict]:
    """Positional inputs only to the first stage, `target=` only to the last (else None).
    The `documents` keyword tensors (`doc_ids`, `doc_positions`: document masking) go to
    every stage: torch's schedule splits keyword tensors into micro-batches along the batch
    dim like the inputs, and hands each stage its micro-batch's share."""
    return ((inputs,) if is_first else ()), {"target": targets if is_last else None,
                                             **(documents or {})}


def _loss_sum(loss: PipelineLoss, *, n_microbatches: int, is_last: bool,
              device: torch.device) -> torch.Tensor:
    """Sum of the last `n_microbatches` recorded losses (earlier ones: shape inference)."""
    if not is_last:
        return torch.zeros((), dtype=torch.float32, device=device)
    sums = loss.token_loss_sums[-n_microbatches:]
    assert len(sums) == n_microbatches, (len(sums), n_microbatches)
    return torch.stack(sums).sum().float()


def schedule_microbatches(schedule) -> int:
    """Pipeline micro-batches per `step()` of `schedule`."""
    return schedule._n_microbatches


def pipeline_forward_backward(schedule, *, inputs: torch.Tensor, targets: torch.Tensor,
                              is_first: bool, is_last: bool, loss: PipelineLoss,
                              loss_scale: float, autocast,
                              documents: dict | None = None) -> torch.Tensor:
    """Forward and backward of one training micro-batch through the pipeline.

    Every pp rank passes its (identical) batch; only the first stage uses `inputs`, only the
    last `targets`. Gradients accumulate into the parts' `.grad`, scaled by `loss_scale`.
    Returns the unscaled token-loss sum (0-dim fp32, detached) on the last stage, 0 elsewhere.
    `documents`: the model's document-masking keywords for this micro-batch, or None.
    """
    loss.scale = float(loss_scale)
    loss.weigh_microbatches(targets, schedule_microbatches(schedule))
    try:
        return _run(schedule.step, schedule, inputs=inputs, targets=targets, is_first=is_first,
                    is_last=is_last, loss=loss, autocast=autocast, documents=documents)
    finally:
        loss.microbatch_weights = None


@torch.no_grad()
def pipeline_eval_loss_sum(schedule, *, inputs: torch.Tensor, targets: torch.Tensor,
                           is_first: bool, is_last: bool, loss: PipelineLoss,
                           autocast, documents: dict | None = None) -> torch.Tensor:
    """Forward-only token-loss sum of one micro-batch (torch's `schedule.eval`), no grads.

    Same conventions as `pipeline_forward_backward`. Call it between optimizer steps only: the
    switch to eval (and back) re-infers shapes, which clears `.grad` of FSDP parts.
    """
    return _run(schedule.eval, schedule, inputs=inputs, targets=targets, is_first=is_first,
                is_last=is_last, loss=loss, autocast=autocast, documents=documents)


def _run(method, schedule, *, inputs: torch.Tensor, targets: torch.Tensor, is_first: bool,
         is_last: bool, loss: PipelineLoss, autocast, documents: dict | None
         ) -> torch.Tensor:
    """`schedule.step` or `schedule.eval` on one micro-batch; the unscaled loss sum."""
    loss.token_loss_sums.clear()
    args, kwargs = _step_args(inputs=inputs, targets=targets, is_first=is_first, is_last=is_last,
                              documents=documents)
    with autocast, loss.context():
        method(*args, return_outputs=False, **kwargs)
    return _loss_sum(loss, n_microbatches=schedule_microbatches(schedule), is_last=is_last,
                     device=targets.device)

