"""One optimizer step's forward/backward over its micro-batches, weighted by tokens."""
from __future__ import annotations

import contextlib
import math
from dataclasses import dataclass

import torch
import torch.distributed as dist
from torch.distributed.tensor import DTensor

from parallel.data_parallel import gradient_sync
from parallel.document_masking import document_ids_and_positions, own_document_targets
from parallel.grad_norm import clip_grads
from training.parallel_model import ParallelModel
from training.loss import IGNORE_INDEX, token_cross_entropy_sum
from training.router_losses import with_router_losses

__all__ = ["IGNORE_INDEX", "StepLoss", "clip_and_step", "eval_loss_sum", "forward_backward",
           "token_loss_sum"]


@dataclass(frozen=True, slots=True, kw_only=True)
class StepLoss:
    local_loss_sum: torch.Tensor
    """Sum of token losses this rank computed (detached; 0 on pipeline stages before the
    last). Tensor-parallel peers compute the same sum: add up only the ranks whose
    `ParallelModel.reports_loss` is true to count every token once."""
    global_tokens: int
    """Target tokens over all ranks and micro-batches of the step."""


def count_global_tokens(micro_batches: list, *, device: torch.device, dp_group=None) -> int:
    """Target tokens of the step summed over the data-parallel ranks (`dp_group`)."""
    local = sum(int((targets != IGNORE_INDEX).sum()) for _, targets in micro_batches)
    if dp_group is None:
        return local
    t = torch.tensor([local], dtype=torch.int64, device=device)
    dist.all_reduce(t, group=dp_group)
    return int(t.item())


def loss_context(model: ParallelModel):
    """Cross entropy on vocabulary-sharded logits when the model keeps them sharded."""
    if model.loss_parallel:
        from torch.distributed.tensor.parallel import loss_parallel

        return loss_parallel()
    return contextlib.nullcontext()


def token_loss_sum(model: torch.nn.Module, inputs: torch.Tensor, targets: torch.Tensor,
                   autocast, documents: dict | None = None, *, loss_chunks: int = 1
                   ) -> torch.Tensor:
    """Sum of the token losses of one micro-batch; with `loss_chunks` > 1 the model runs its
    head and the loss in row blocks (training.loss_chunks) and returns the sum itself."""
    if loss_chunks > 1:
        with autocast:
            return model(inputs, targets=targets, loss_chunks=loss_chunks, **(documents or {}))
    with autocast:
        logits = model(inputs, **(documents or {}))
    return token_cross_entropy_sum(logits, targets)


def document_inputs(model: ParallelModel, inputs: torch.Tensor) -> dict:
    """The model's document-masking keywords (`doc_ids`, `doc_positions`) for a whole
    [B, T] batch `inputs`, cut to this rank's share like the tokens (context parallel);
    {} when the run does not mask documents."""
    if model.document_eos_id is None:
        return {}
    ids, positions = document_ids_and_positions(inputs, eos_id=model.document_eos_id)
    return {"doc_ids": model.shard_tokens(ids), "doc_positions": model.shard_tokens(positions)}


def document_targets(model: ParallelModel, micro_batches: list) -> list:
    """Under document masking, each micro-batch's targets with those in the next document
    ignored (`own_document_targets`); the batches unchanged otherwise."""
    if model.document_eos_id is None:
        return micro_batches
    return [(inputs, own_document_targets(inputs, targets, eos_id=model.document_eos_id,
                                          ignore_index=IGNORE_INDEX))
            for inputs, targets in micro_batches]


def _whole(loss_sum: torch.Tensor) -> torch.Tensor:
    """A loss computed on vocabulary-sharded logits is a DTensor: take its full value."""
    return loss_sum.full_tensor() if isinstance(loss_sum, DTensor) else loss_sum


def forward_backward(model: ParallelModel, micro_batches: list, *, device: torch.device,
                     autocast, scaler=None) -> StepLoss:
    """Accumulate gradients of (sum of token losses over the global batch) / global tokens.

    DDP and FSDP average gradients over the dp x cp ranks, so each rank scales its loss by
    dp x cp to undo that average: the result equals one process computing the mean over the
    whole global batch. Context-parallel ranks each take their share of every sequence;
    pipeline stages run the micro-batch through the schedule (and sum the gradients of a tied
    embedding's two copies at the end). Under document masking a target
    in the next document is not learned (`document_targets`), nor counted.
    """
    micro_batches = document_targets(model, micro_batches)
    global_tokens = count_global_tokens(micro_batches, device=device, dp_group=model.group("dp"))
    scale = model.dims.dp_cp / global_tokens
    total = torch.zeros((), dtype=torch.float32, device=device)
    last = len(micro_batches) - 1
    for i, (inputs, targets) in enumerate(micro_batches):
        inputs = inputs.to(device, non_blocking=True)
        documents = document_inputs(model, inputs)
        inputs = model.shard_tokens(inputs)
        targets = model.shard_tokens(targets.to(device, non_blocking=True))
        with gradient_sync(model.parts, sync=i == last, reducers=model.grad_reducers):
            total += _micro_batch(model, inputs, targets, scale=scale, autocast=autocast,
                                  scaler=scaler, documents=documents)
    if model.tied is not None:
        model.tied.sum_grads()  # the first and last stage's copies: one weight's gradient
    model.sum_token_local_grads()  # MoE layers under sequence parallel: each tp rank's tokens
    return StepLoss(local_loss_sum=total, global_tokens=global_tokens)


def _micro_batch(model: ParallelModel, inputs: torch.Tensor, targets: torch.Tensor, *,
                 scale: float, autocast, scaler, documents: dict) -> torch.Tensor:
    if model.schedule is not None:
        from parallel.pipeline import pipeline_forward_backward

        loss_scale = scale * (scaler.scale_factor if scaler is not None else 1.0)
        return pipeline_forward_backward(
            model.schedule, inputs=inputs, targets=targets, is_first=model.is_first_stage,
            is_last=model.is_last_stage, loss=model.pp_loss, loss_scale=loss_scale,
            autocast=autocast, documents=documents)
    with loss_context(model):
        loss_sum = token_loss_sum(model.parts[0], inputs, targets, autocast, documents,
                                  loss_chunks=model.loss_chunks)
        scaled = with_router_losses(model.parts[0], loss_sum, targets) * scale
        (scaler.scale(scaled) if scaler is not None else scaled).backward()
    return _whole(loss_sum).detach()


def clip_and_step(model: ParallelModel, optimizers: list, *, grad_clip: float,
                  scaler=None, loss_finite: bool = True) -> float:
    """Unscale (fp16), clip the global gradient norm, step, zero grads; return the norm.

    No update is applied when the step's loss is not finite (`loss_finite`, all-reduced, so
    every rank agrees) or, without a loss scaler, when the global gradient norm is not."""
    params = model.parameters()
    if not loss_finite:
        for part in model.parts:
            part.zero_grad(set_to_none=True)
        return float("nan")
    if scaler is not None:
        scaler.unscale_(params)
    max_norm = grad_clip if grad_clip > 0 else float("inf")
    norm = clip_grads(params, max_norm=max_norm, pp_group=model.group("pp"),
                      uncounted=model.uncounted_in_norm())
    if scaler is None and not math.isfinite(norm):
        pass  # an inf/nan gradient: stepping would write nan into every weight
    elif scaler is None or scaler.update():
        for optimizer in optimizers:
            optimizer.step()
        if model.zero1 is not None:
            model.zero1.broadcast_updates()
    for part in model.parts:
        part.zero_grad(set_to_none=True)
    return norm


@torch.no_grad()
def eval_loss_sum(model: ParallelModel, inputs: torch.Tensor, targets: torch.Tensor, *,
                  device: torch.device, autocast) -> tuple[float, int]:
    """(sum of token losses, tokens) of this rank's share of one validation batch; only
    ranks with `model.reports_loss` hold a loss (pipeline: the last stage)."""
    [(inputs, targets)] = document_targets(model, [(inputs, targets)])
    inputs = inputs.to(device)
    documents = document_inputs(model, inputs)
    inputs = model.shard_tokens(inputs)
    targets = model.shard_tokens(targets.to(device))
    if model.schedule is not None:
        from parallel.pipeline import pipeline_eval_loss_sum

        loss_sum = pipeline_eval_loss_sum(
            model.schedule, inputs=inputs, targets=targets, is_first=model.is_first_stage,
            is_last=model.is_last_stage, loss=model.pp_loss, autocast=autocast,
            documents=documents)
    else:
        with loss_context(model):
            loss_sum = _whole(token_loss_sum(model.parts[0], inputs, targets, autocast,
                                             documents, loss_chunks=model.loss_chunks))
    return float(loss_sum), int((targets != IGNORE_INDEX).sum())
