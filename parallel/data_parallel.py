"""Replicated data parallel (DDP) over the data-parallel ranks."""
from __future__ import annotations

import torch
from torch.nn.parallel import DistributedDataParallel

from conf.spec import ParallelSpec


def apply_ddp(model: torch.nn.Module, *, parallel: ParallelSpec,
              device: torch.device) -> torch.nn.Module:
    """Wrap in DDP when dp_replicate > 1; gradients are averaged over the dp ranks."""
    if parallel.dp_replicate <= 1:
        return model
    device_ids = [device.index] if device.type == "cuda" else None
    return DistributedDataParallel(model, device_ids=device_ids, gradient_as_bucket_view=True)


def unwrap(model: torch.nn.Module) -> torch.nn.Module:
    return model.module if isinstance(model, DistributedDataParallel) else model


def no_sync_unless(model: torch.nn.Module, sync: bool):
    """DDP's no_sync() for all but the last micro-batch of a step; a no-op otherwise."""
    import contextlib

    if sync or not isinstance(model, DistributedDataParallel):
        return contextlib.nullcontext()
    return model.no_sync()
