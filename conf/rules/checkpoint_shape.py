"""checkpoint.load_from at a meshrun checkpoint: the model it holds must have the run's shape.

A checkpoint lives in a run dir (`<run>/checkpoints/step_N`), whose spec.json says the model
that wrote it; every knob the weights' shapes depend on (conf.hf_model_config.SHAPE_KNOBS) must
equal the run's (read as plain JSON: an older spec.json still answers). A bare step folder with
no run dir above it is compared by its tensors: DCP's .metadata, read torch-free through the
same allow-list unpickler that guards it (nothing it names is built), must hold every
parameter of the model's table (training/models/<family>/shapes.py) with the same shape.
"""
from __future__ import annotations

import json
from pathlib import Path

from conf.errors import ProblemList
from conf.hf_model_config import SHAPE_KNOBS
from conf.run_dir.checkpoint_dirs import DCP_METADATA_FILENAME
from conf.run_dir.checkpoint_verify import AllowListUnpickler
from conf.run_dir.paths import RunDir, find_checkpoint
from training.models import family_of

MODEL_PREFIX = "model."
"""DCP keys of the model's parameters (training/checkpoint.py saves {"model", "optimizer"})."""
MAX_LISTED = 4


def saved_model(load_from: str) -> tuple[dict, Path] | None:
    """The `model` section of the spec.json of the run that wrote load_from's checkpoint."""
    found = find_checkpoint(Path(load_from).expanduser())
    if found is None:
        return None
    run = RunDir(found.parent.parent)
    if not run.is_run_dir:
        return None
    try:
        model = json.loads(run.spec_file.read_text()).get("model")
    except (OSError, ValueError, AttributeError):
        return None
    return (model, run.spec_file) if isinstance(model, dict) else None


def _plain(value: object) -> object:
    return getattr(value, "value", value)


def check_checkpoint_shape(load_from: str, model: object, problems: ProblemList) -> None:
    """A problem naming every shape knob where load_from's checkpoint differs from `model`."""
    if any(p.key == "checkpoint.load_from" for p in problems.items):
        return  # not a loadable checkpoint: already said
    saved = saved_model(load_from)
    if saved is None:
        _check_tensors(load_from, model, problems)
        return
    knobs, spec_file = saved
    differ = [f"{name}={knobs[name]} (the run has model.{name}={_plain(getattr(model, name))})"
              for name in SHAPE_KNOBS
              if name in knobs and knobs[name] != _plain(getattr(model, name))]
    if differ:
        problems.add("checkpoint.load_from", load_from,
                     f"holds another model ({spec_file}): {'; '.join(differ)}", _FIX)


_FIX = "load a checkpoint of this model's shape, or set the model.* knobs to the checkpoint's"


def _check_tensors(load_from: str, model: object, problems: ProblemList) -> None:
    step = find_checkpoint(Path(load_from).expanduser())
    differ = tensor_differences(step, model) if step is not None else []
    if differ:
        more = f"; ... and {len(differ) - MAX_LISTED} more" if len(differ) > MAX_LISTED else ""
        problems.add("checkpoint.load_from", load_from,
                     f"holds another model (its {DCP_METADATA_FILENAME}): "
                     f"{'; '.join(differ[:MAX_LISTED])}{more}", _FIX)


class _Recorded:
    """An allowed DCP metadata class while reading shapes: keeps its arguments and state,
    builds nothing (the allow-list still refuses every other name)."""

    def __new__(cls, *args, **kwargs):
        obj = object.__new__(cls)
        obj.args = args
        obj.state = None
        return obj

    def __init__(self, *args, **kwargs) -> None:
        pass

    def __setstate__(self, state) -> None:
        self.state = state


class _ShapeReader(AllowListUnpickler):
    def resolve(self, module: str, name: str):
        return type(name, (_Recorded,), {})


def saved_tensor_shapes(step: Path) -> dict[str, tuple[int, ...]] | None:
    """Our parameter name -> global shape, from a checkpoint's DCP .metadata (torch-free, the
    allow-list enforced); None when it cannot be read that way."""
    try:
        with open(step / DCP_METADATA_FILENAME, "rb") as handle:
            metadata = _ShapeReader(handle, path=step / DCP_METADATA_FILENAME).load()
        entries = metadata.state["state_dict_metadata"]
        return {fqn.removeprefix(MODEL_PREFIX): tuple(entry.state["size"].args[0])
                for fqn, entry in entries.items()
                if fqn.startswith(MODEL_PREFIX) and isinstance(entry.state, dict)}
    except Exception:  # noqa: BLE001 - any other layout: the ranks' own load decides
        return None


def tensor_differences(step: Path, model: object) -> list[str]:
    """Each parameter of `model` the checkpoint lacks or holds with another shape."""
    saved = saved_tensor_shapes(step)
    if saved is None:
        return []
    wanted = family_of(model).parameter_shapes(model)
    return [f"{name} is {list(saved[name])} there, {list(shape)} here" if name in saved
            else f"{name} is not in it" for name, shape in wanted
            if saved.get(name) != tuple(shape)]
