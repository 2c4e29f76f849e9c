"""torch.compile per transformer block, in place.

Each block of `model.layers` is compiled on its own (`nn.Module.compile`, which keeps the
module and its parameter names: checkpoints, export and FSDP see the same names), as
torchtitan does: the blocks share one forward, so Dynamo captures it once per layout and every
block reuses that graph. It runs after TP/SP, context parallel and recompute (the graph
captures their DTensor ops and checkpoint regions) and before FSDP, whose per-block hooks stay
outside the compiled forward. Embeddings, the final norm and the output projection stay eager.
Context parallel's attention (gloo/NCCL collectives) stays eager inside each compiled block
(parallel/context_parallel.py); conf/rules/compile_rules.py refuses the combination where that
leaves nothing compiled.
"""
from __future__ import annotations

import torch
from torch import nn

from conf.schema import CompileBackend
from training.models import family_of
from training.models.family import BLOCKS


def apply_compile(model: nn.Module, *, backend: CompileBackend) -> None:
    """Compile every block of `model.layers` (a whole model or a pipeline stage)."""
    embedding = getattr(model, family_of(model.spec).embedding, None)
    if embedding is not None:
        embedding.register_forward_hook(_settle_async_output)
    for block in getattr(model, BLOCKS).values():
        block.compile(backend=str(backend))


def _settle_async_output(module: nn.Module, args, output: torch.Tensor) -> torch.Tensor:
    """The first block's input as a plain tensor. Under TP the vocabulary-parallel embedding
    returns its all-reduce (or SP reduce-scatter) still in flight, as an AsyncCollectiveTensor;
    a compiled block taking that as input hands back a plain gradient where DTensor's
    backward of the embedding's redistribute expects a DTensor (torch 2.13: AttributeError
    '_local_tensor'). One copy waits for the collective and keeps autograd intact."""
    from torch.distributed._functional_collectives import AsyncCollectiveTensor

    return output.clone() if isinstance(output, AsyncCollectiveTensor) else output
