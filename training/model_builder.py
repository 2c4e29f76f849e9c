"""Build a run's model: the torch module of its model family (training/models/), on the meta
device or materialised, and count what it holds.

The family's module is imported here, on demand: its torch-free facts (training/models/) stay
importable by the dry run without torch.
"""
from __future__ import annotations

import importlib

import torch
from torch import nn

from conf.spec import ModelSpec
from training.models import family_of


def build_model_on_meta(model: ModelSpec) -> nn.Module:
    """The model's structure with no memory behind it (split and shard it, then materialise)."""
    module_path, class_name = family_of(model).module_class.split(":")
    module_class = getattr(importlib.import_module(module_path), class_name)
    with torch.device("meta"):
        return module_class(model)


def build_model(model: ModelSpec, *, device: torch.device, seed: int,
                hf_dir: str = "") -> nn.Module:
    """The whole model on `device`, initialised under `seed` (training/init.py), or with the
    weights of the Hugging Face folder `hf_dir`."""
    from training.init import materialize

    module = build_model_on_meta(model)
    materialize(module, model=model, device=device, seed=seed, hf_dir=hf_dir)
    return module


def count_params(model: nn.Module) -> tuple[int, int]:
    """(total, token-embedding) parameter counts; shared (tied) tensors are counted once."""
    total = sum(p.numel() for p in model.parameters())  # parameters() yields each tensor once
    embeddings = getattr(model, family_of(model.spec).embedding, None)  # a stage may not hold it
    return total, (embeddings.weight.numel() if embeddings is not None else 0)
