"""Replicated data parallel (DDP) over the ranks that hold different tokens (dp x cp)."""
from __future__ import annotations

import contextlib

import torch
from torch.nn.parallel import DistributedDataParallel


def apply_ddp(model: torch.nn.Module, *, device: torch.device, group=None) -> torch.nn.Module:
    """Wrap in DDP over `group` (None = every rank); gradients are averaged over it.

    forward_sync_buffers=False: the model's only buffers are the RoPE tables, which every rank
    computes alike; broadcasting them before every forward (DDP's default) would move
    3 x max_seq_len x head_dim fp32 per step (about 200 MB for Llama 3 8B) for nothing. They
    are broadcast once at wrap time with the parameters (torch 2.13 deprecates the older
    broadcast_buffers=False, which skipped that too, with a warning in every rank's log)."""
    device_ids = [device.index] if device.type == "cuda" else None
    return DistributedDataParallel(model, device_ids=device_ids, process_group=group,
                                   gradient_as_bucket_view=True, forward_sync_buffers=False)


def unwrap(model: torch.nn.Module) -> torch.nn.Module:
    return model.module if isinstance(model, DistributedDataParallel) else model


def gradient_sync(parts: list[torch.nn.Module], *, sync: bool, reducers: tuple = ()):
    """Reduce gradients only on the last micro-batch of a step: DDP's no_sync(), FSDP2's
    set_requires_gradient_sync(); a no-op for a module that reduces nothing. `reducers`
    (DDP under tp, parallel/dp_tp_grads.py) average the gradients once the block's backward
    has run, when `sync`."""
    stack = contextlib.ExitStack()
    for part in parts:
        if isinstance(part, DistributedDataParallel) and not sync:
            stack.enter_context(part.no_sync())
        elif hasattr(part, "set_requires_gradient_sync"):
            part.set_requires_gradient_sync(sync)
    if sync and reducers:
        stack.enter_context(_reduce_after(reducers))
    return stack


@contextlib.contextmanager
def _reduce_after(reducers: tuple):
    yield  # not on an exception: the step is failing, and its peers may not reach the reduce
    for reducer in reducers:
        reducer.all_reduce()
