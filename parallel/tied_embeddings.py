"""Tied embeddings (model.tie_embeddings: the output head's weight is the token embedding's)
under tensor and pipeline parallelism, as Megatron-LM trains them.

Tensor parallel: the embedding is split by vocabulary rows (parallel/tensor_parallel.py), and
the head (the family's weightless `TiedHead`, training/loss.py) multiplies the whole hidden
states by that same sharded weight: each tp rank computes the logits of its own vocabulary
rows, gathered afterwards, or kept sharded for cross entropy under loss parallel. In backward
the head's gradient of the weight is already sharded by rows (no communication); the input
gradient is a partial sum, reduced (or reduce-scattered under sequence parallel) by DTensor.

Pipeline parallel: the first stage holds the embedding and the last stage a copy of it for
the head (`ModelFamily.stage_holds`). Both copies start equal (initialised by name, or read
from the same checkpoint or Hugging Face tensor by name); after each step's backward their
gradients are summed over the two ranks (`TiedCopy.sum_grads`, over the pp ranks of the
first and last stage), so each holds the gradient the single model's one weight gets and the
same optimizer update keeps them equal. The gradient norm counts the weight once (the first
stage's copy). A checkpoint saves the one name once (DCP keeps one of equal entries) and loads
it into both; an export writes it once.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.tensor import DTensor, Replicate, Shard, distribute_module
from torch.distributed.tensor.parallel import ParallelStyle

from parallel.dims import ParallelDims


class TiedHeadParallel(ParallelStyle):
    """The tied head over the tp ranks: forward(hidden, weight) with `weight` the embedding's
    vocabulary-sharded DTensor. The hidden states arrive as `input_layout` (Replicate, or
    Shard(1) under sequence parallel) and are made whole; the logits come out sharded over
    the vocabulary (a DTensor, for loss parallel) or gathered (a plain tensor)."""

    def __init__(self, *, input_layout, loss_parallel: bool):
        super().__init__()
        self.input_layout = input_layout
        self.loss_parallel = loss_parallel

    def _apply(self, module: nn.Module, device_mesh: DeviceMesh) -> nn.Module:
        return distribute_module(module, device_mesh, input_fn=self._whole_hidden,
                                 output_fn=self._logits)

    def _whole_hidden(self, _module, inputs: tuple, mesh: DeviceMesh) -> tuple:
        hidden, weight, *rest = inputs
        if not isinstance(hidden, DTensor):
            hidden = DTensor.from_local(hidden, mesh, (self.input_layout,), run_check=False)
        return (hidden.redistribute(placements=(Replicate(),)), weight, *rest)

    def _logits(self, _module, logits: torch.Tensor, _mesh: DeviceMesh):
        assert isinstance(logits, DTensor) and isinstance(logits.placements[0], Shard), logits
        if self.loss_parallel:
            return logits
        return logits.redistribute(placements=(Replicate(),)).to_local()


@dataclass(frozen=True, slots=True, kw_only=True)
class TiedCopy:
    """This rank's copy of a tied weight that another pipeline rank holds too."""

    param: torch.Tensor
    """The embedding's weight as this rank's part holds it (maybe a DTensor shard)."""
    group: object
    """The process group of the ranks holding the copies (the first and last stage's)."""
    counted: bool
    """Whether this copy counts in the gradient norm (the first stage's does; the last
    stage's would count the same gradient again)."""

    @torch.no_grad()
    def sum_grads(self) -> None:
        """Collective over `group`: each copy's gradient becomes the sum of both (the
        gradient of the one tied weight). Both copies are sharded alike (the same tp and
        FSDP coordinates), so their local shards match element for element."""
        if self.param.grad is None:  # never skip the collective: the other copy waits on it
            self.param.grad = torch.zeros_like(self.param)
        grad = self.param.grad
        local = grad.to_local() if isinstance(grad, DTensor) else grad
        dist.all_reduce(local, group=self.group)


def tied_copy_ranks(dims: ParallelDims) -> list[list[int]]:
    """For every pipeline group, [its first stage's rank, its last stage's rank]: the ranks
    holding the copies of the tied weight (the first stage is on pp rank 0 and the last on pp
    rank pp-1 in every schedule meshrun offers, parallel.dims.pipeline_stage_ids)."""
    groups = {tuple(dims.peers(rank, ("pp",))) for rank in range(dims.world_size)}
    return [[peers[0], peers[-1]] for peers in sorted(groups)]


def tied_copy_group(dims: ParallelDims, *, rank: int, pp_group):
    """The process group summing this rank's tied gradients: the pp group itself when pp=2,
    else a group of the first and last stage's ranks (collective: every rank builds every
    pipeline's group, in the same order)."""
    if dims.pp == 2:
        return pp_group
    mine = None
    for ranks in tied_copy_ranks(dims):
        group = dist.new_group(ranks)
        if rank in ranks:
            mine = group
    return mine


def find_tied_copy(parts: list[nn.Module], *, embedding: str, dims: ParallelDims, rank: int,
                   pp_group, first: bool) -> TiedCopy | None:
    """The tied weight this rank's pipeline parts hold (None without a pipeline, or on a
    rank holding neither the first nor the last stage)."""
    group = tied_copy_group(dims, rank=rank, pp_group=pp_group)  # on every rank: collective
    held = [module for module in (getattr(part, embedding, None) for part in parts)
            if module is not None]
    if not held:
        return None
    assert len(held) == 1 and group is not None, (len(held), group)
    return TiedCopy(param=held[0].weight, group=group, counted=first)
