"""Initialise parameters by name, the same values however the model is split or sharded.

Each parameter's full value comes from its own generator, seeded by (run seed, parameter
name); a rank keeps only its part (a pipeline stage's blocks, an FSDP or TP shard). So every
layout starts from exactly the weights of the single-process model, and no rank ever builds
the whole model: the model is built on the meta device, split and sharded there, and only
then materialised, one parameter at a time (whole on CPU, then this rank's shard kept).

Conventions (Llama/torchtitan): norms 1; biases 0; every other weight N(0, init_std), except
the outputs of the residual branches, N(0, init_std / sqrt(2 * n_layers)) (which parameters
are norms and residual outputs: the model family's `init_ones` and `residual_outputs`).
A run that starts from a Hugging Face model (`hf_dir`) reads its values from there instead,
each rank only its part (training/hf_import.py).
"""
from __future__ import annotations

import math
import zlib

import torch
from torch import nn
from torch.distributed.tensor import DTensor, distribute_tensor

from conf.spec import ModelSpec
from training.models import family_of


def parameter_value(name: str, shape: torch.Size, *, model: ModelSpec, seed: int) -> torch.Tensor:
    """The full fp32 CPU value of parameter `name` (its state-dict key) for this seed."""
    family = family_of(model)
    if name.endswith(family.init_ones):
        return torch.ones(shape)
    if name.endswith(".bias"):
        return torch.zeros(shape)
    std = model.init_std
    if name.endswith(family.residual_outputs):
        std = std / math.sqrt(2 * model.n_layers)
    generator = torch.Generator().manual_seed((seed * 1_000_003 + zlib.crc32(name.encode()))
                                              % 2**63)
    return torch.randn(shape, generator=generator) * std


@torch.no_grad()
def materialize(module: nn.Module, *, model: ModelSpec, device: torch.device, seed: int,
                hf_dir: str = "") -> None:
    """Allocate `module` (a model or a stage, possibly TP/FSDP-sharded, on meta) on `device`
    and fill its parameters (by seed, or from the Hugging Face folder `hf_dir`) and RoPE tables."""
    module.to_empty(device=device)
    module.reset_rope_tables()
    if hf_dir:
        from training.hf_import import load_hf_weights

        load_hf_weights(module, folder=hf_dir)
        return
    for name, param in module.named_parameters():
        # A DTensor's shape is its global shape: the full value, then this rank's part.
        value = parameter_value(name, param.shape, model=model, seed=seed).to(device)
        if isinstance(param, DTensor):
            value = distribute_tensor(value, param.device_mesh, param.placements,
                                      src_data_rank=None).to_local()
            param.to_local().copy_(value)
        else:
            param.copy_(value)
