"""checkpoint.load_from at a meshrun checkpoint: the model it holds must have the run's shape.

A checkpoint lives in a run dir (`<run>/checkpoints/step_N`), whose spec.json says the model
that wrote it; every knob the weights' shapes depend on (conf.hf_model_config.SHAPE_KNOBS) must
equal the run's. Read as plain JSON (an older spec.json still answers), torch-free, before
launch; a bare step folder with no run dir above it is left to the ranks.
"""
from __future__ import annotations

import json
from pathlib import Path

from conf.errors import ProblemList
from conf.hf_model_config import SHAPE_KNOBS
from conf.run_dir.paths import RunDir, find_checkpoint


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
        return
    knobs, spec_file = saved
    differ = [f"{name}={knobs[name]} (the run has model.{name}={_plain(getattr(model, name))})"
              for name in SHAPE_KNOBS
              if name in knobs and knobs[name] != _plain(getattr(model, name))]
    if differ:
        problems.add("checkpoint.load_from", load_from,
                     f"holds another model ({spec_file}): {'; '.join(differ)}",
                     "load a checkpoint of this model's shape, or set the model.* knobs "
                     "to the checkpoint's")
