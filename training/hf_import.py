"""Start a run from a Hugging Face model's safetensors, under any layout.

The model is built on the meta device, split and sharded as usual (training/parallel_model.py);
then each rank allocates its parts and reads, for every parameter it holds, only its own slice
of the matching Hugging Face tensor (`safe_open(...).get_slice`): a pipeline stage reads only
its blocks, an FSDP or TP shard only its rows or columns. No rank ever holds the whole model.
Names map through the model family's one table (`ModelFamily.hf_names`,
training/models/hf_names.py); the folder is checked first with the launcher's torch-free check
(conf/hf_weights.py). One file (`model.safetensors`) or shards listed by
`model.safetensors.index.json`. The folder's config.json was checked by resolve()
(conf/hf_model_config.py).
"""
from __future__ import annotations

import logging
from contextlib import ExitStack
from dataclasses import dataclass
from pathlib import Path

import torch
from safetensors import safe_open
from torch import nn
from torch.distributed.tensor import DTensor
from torch.distributed.tensor._utils import compute_local_shape_and_global_offset

from conf.hf_model_config import is_hf_model_dir
from conf.hf_weights import BadWeights, check_weights, weight_map
from conf.spec import ModelSpec, RunSpec
from training.models import family_of
from training.models.hf_names import hf_tensors

log = logging.getLogger("meshrun.hf_import")


class HfWeightsError(ValueError):
    """The folder's weights cannot fill the model (found in the ranks: a file changed after
    the launcher checked it, or a read failed). One line, never a traceback."""


def hf_start_dir(spec: RunSpec) -> str:
    """The Hugging Face folder whose weights this run starts from; '' = initialise by seed.
    checkpoint.load_from names one (or a meshrun checkpoint, which wins); else model.path."""
    load_from = spec.checkpoint.load_from
    if load_from:
        return load_from if is_hf_model_dir(load_from) else ""
    return spec.model.path


def weight_files(folder: str | Path) -> dict[str, Path]:
    """Hugging Face tensor name -> the safetensors file holding it (conf/hf_weights.py)."""
    return weight_map(folder)


def local_region(param: torch.Tensor) -> tuple[slice, ...]:
    """The part of the full tensor this rank holds: all of it, or a DTensor's local shard
    (FSDP and TP shards are each one contiguous block of the full tensor)."""
    if not isinstance(param, DTensor):
        return tuple(slice(0, size) for size in param.shape)
    shape, offset = compute_local_shape_and_global_offset(param.shape, param.device_mesh,
                                                          param.placements)
    return tuple(slice(start, start + size) for start, size in zip(offset, shape))


@dataclass(frozen=True, slots=True)
class TensorRead:
    """One slice read from a safetensors file."""

    file: str
    """The file's name in the folder."""
    tensor: str
    """The Hugging Face tensor name."""
    region: tuple[tuple[int, int], ...]
    """[start, stop) per tensor dim."""


@dataclass(frozen=True, slots=True)
class LoadRecord:
    """What one load_hf_weights call opened and read."""

    opened: tuple[str, ...]
    """The names of the files it opened, in order."""
    reads: tuple[TensorRead, ...]


@torch.no_grad()
def load_hf_weights(module: nn.Module, *, folder: str | Path) -> LoadRecord:
    """Fill every parameter of `module` (a model or a pipeline stage, materialised, maybe
    sharded) with its slice of `folder`'s weights, opening a file only when one of its
    tensors is needed; return what it opened and read. HfWeightsError (one line) when the
    folder fails the launcher's own check (conf/hf_weights.py) or a read fails."""
    try:
        count = check_weights(folder, module.spec)  # headers only: the launcher's own check
        files = weight_files(folder)
    except BadWeights as err:
        raise HfWeightsError(f"{folder}: {err}") from None
    family = family_of(module.spec)
    reads = []
    with ExitStack() as stack:
        opened: dict[Path, object] = {}
        for name, param in module.named_parameters():
            region = local_region(param)
            pieces, tensors = [], hf_tensors(name, tuple(param.shape), family)
            for source, expert in tensors:
                if expert is not None and not region[0].start <= expert < region[0].stop:
                    continue  # another rank's expert
                part = region if expert is None else region[1:]
                path = files[source]
                if path not in opened:
                    opened[path] = stack.enter_context(_open(path))
                pieces.append(_read(opened[path], source, part, path))
                reads.append(TensorRead(path.name, source, tuple((r.start, r.stop) for r in part)))
            value = pieces[0] if tensors[0][1] is None else torch.stack(pieces)
            local = param.to_local() if isinstance(param, DTensor) else param
            local.copy_(value.to(dtype=local.dtype, device=local.device))
    _log_once(folder, count=count, opened=len(opened))
    return LoadRecord(opened=tuple(p.name for p in opened), reads=tuple(reads))


def _open(path: Path):
    try:
        return safe_open(str(path), framework="pt")
    except Exception as err:  # noqa: BLE001 - safetensors' own errors have no common type
        raise HfWeightsError(f"{path}: cannot be opened ({err})") from None


def _read(handle, name: str, region: tuple[slice, ...], path: Path) -> torch.Tensor:
    try:
        return handle.get_slice(name)[region]
    except Exception as err:  # noqa: BLE001 - an I/O error, or a file changed under us
        raise HfWeightsError(f"{path}: reading {name} failed ({err})") from None


def _log_once(folder: str | Path, *, count: int, opened: int) -> None:
    """One line on global rank 0: where the weights came from and how many tensors."""
    import torch.distributed as dist

    if not dist.is_initialized() or dist.get_rank() == 0:
        log.info("loaded Hugging Face weights from %s: %d tensors (this rank read its part "
                 "from %d file(s))", folder, count, opened)


def load_hf_model(folder: str | Path, model: ModelSpec, *,
                  device: torch.device = torch.device("cpu")) -> nn.Module:
    """The whole model in one process, with `folder`'s weights (tools and tests)."""
    from training.init import materialize
    from training.model_builder import build_model_on_meta

    module = build_model_on_meta(model)
    materialize(module, model=model, device=device, seed=0, hf_dir=str(folder))
    return module
