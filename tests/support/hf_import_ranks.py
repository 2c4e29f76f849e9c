"""Rank-side code of tests/distributed/test_hf_import_layouts.py: build a run's model under its
layout with a Hugging Face folder's weights, and report what this rank holds, reads and
computes."""
from __future__ import annotations

import contextlib

import torch
from safetensors.torch import load_file
from torch.distributed.tensor import DTensor

from conf.spec import RunSpec
from conf.run_dir.spec_io import spec_from_dict
from training.export import hf_name
from training.models import family_of
from training.hf_import import load_hf_weights, weight_files

CPU = torch.device("cpu")


def _hf_tensors(folder: str) -> dict[str, torch.Tensor]:
    """Every tensor of the folder, read whole (the reference the shards are checked against)."""
    return {name: t for path in set(weight_files(folder).values())
            for name, t in load_file(path).items()}


def hf_layout_rank(*, rank: int, world_size: int, spec_dicts: list[dict],
                   tokens: torch.Tensor) -> list[dict]:
    """Per spec: every parameter, gathered whole, equals its Hugging Face tensor (checked here,
    by name); this rank's mesh coordinates, the names it holds, how many it holds only a shard
    of, their local shapes and element count, the files the loader opens and the slices it
    reads for them, the logits
    (when one forward gives them) and the token-loss sum of tokens[:, 1:] (last stage)."""
    from parallel.data_parallel import unwrap
    from training.parallel_model import build_parallel_model
    from training.step import eval_loss_sum

    reports = []
    for spec_dict in spec_dicts:
        spec = spec_from_dict(RunSpec, spec_dict)
        layout = build_parallel_model(spec, rank=rank, device=CPU)
        hf = _hf_tensors(spec.model.path)
        held, sharded, shapes, local_numel = [], 0, {}, 0
        family = family_of(spec.model)
        for part in layout.parts:
            for name, param in unwrap(part).named_parameters():
                local = param.to_local() if isinstance(param, DTensor) else param
                whole = param.full_tensor() if isinstance(param, DTensor) else param
                assert torch.equal(whole.detach(), hf[hf_name(name, family)]), \
                    (spec.parallel.name, name)
                held.append(name)
                shapes[name] = tuple(local.shape)
                sharded += local.numel() < param.numel()
                local_numel += local.numel()
        # The loader's own record of what it opens and reads for these parts (the call
        # materialize made).
        records = [load_hf_weights(unwrap(part), folder=spec.model.path) for part in layout.parts]
        reads = [r for record in records for r in record.reads]
        opened = [name for record in records for name in record.opened]
        logits = None
        if layout.dims.pp == 1:
            with torch.no_grad():
                logits = unwrap(layout.parts[0])(tokens[:, :-1])
            logits = logits.full_tensor() if isinstance(logits, DTensor) else logits
        loss_sum, _ = eval_loss_sum(layout, tokens[:, :-1], tokens[:, 1:], device=CPU,
                                    autocast=contextlib.nullcontext())
        reports.append({"layout": spec.parallel.name, "coords": layout.coords,
                        "held": sorted(held), "sharded": sharded, "local_shapes": shapes,
                        "local_numel": local_numel, "reads": reads, "opened": opened,
                        "logits": logits,
                        "loss_sum": loss_sum if layout.reports_loss else None})
    return reports
