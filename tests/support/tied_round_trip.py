"""Rank-side code of the tied-embedding round trip (tests/distributed/test_tied_layouts.py):
a run starts from a Hugging Face Llama with tied embeddings under a tp or pp layout, every copy
of the tied weight is checked to be the folder's embed_tokens tensor, one AdamW step is taken,
then the run saves a checkpoint and exports the weights as the training loop does. Last, the
tensor-parallel run's checkpoint is loaded under the pipeline layout, whose two stages must
both take the one saved weight."""
from __future__ import annotations

from pathlib import Path

import torch

from conf.run_dir.spec_io import spec_from_dict
from conf.spec import RunSpec
from tests.support.layout_parity import CPU, full, named_params

NO_AUTOCAST = torch.autocast("cpu", enabled=False)


def _step(spec: RunSpec, rank: int):
    """This rank's layout and optimizers after one step of the run's first batch."""
    from training.data.build import build_train_batches
    from training.optim import build_optimizers
    from training.parallel_model import build_parallel_model
    from training.step import clip_and_step, forward_backward

    layout = build_parallel_model(spec, rank=rank, device=CPU)
    _check_start(spec, layout)
    optimizers = build_optimizers(layout, optim=spec.optim,
                                  state_dtype=spec.precision.optimizer_state_dtype)
    batches = build_train_batches(spec.data, spec.training, dp_rank=layout.dims.dp_rank(rank),
                                  dp_size=layout.dims.dp).next_step()
    forward_backward(layout, batches, device=CPU, autocast=NO_AUTOCAST)
    clip_and_step(layout, optimizers, grad_clip=spec.optim.grad_clip)
    return layout, optimizers


def _check_start(spec: RunSpec, layout) -> None:
    """Every parameter this rank holds, the tied weight's copies included, is the Hugging
    Face tensor of its name."""
    from safetensors.torch import load_file

    from training.export import hf_name
    from training.models import family_of

    weights = load_file(Path(spec.model.path) / "model.safetensors")
    for name, param in named_params(layout).items():
        assert torch.equal(full(param), weights[hf_name(name, family_of(spec.model))]), name


def tied_round_trip_rank(*, rank: int, world_size: int, spec_dicts: dict[str, dict],
                         root: str) -> dict[str, dict]:
    """Per layout (by name): the step, its checkpoint (step 1 under `root/<name>`) and its export
    `root/<name>/export`; what this rank holds after the step. Then the first layout's
    checkpoint loaded under the last one: the loaded weights by name."""
    from training.checkpoint import load_checkpoint, save_checkpoint
    from training.export import export_hf, gather_full_state
    from training.train_state import checkpoint_degrees

    reports = {}
    for name, spec_dict in spec_dicts.items():
        spec = spec_from_dict(RunSpec, spec_dict)
        layout, optimizers = _step(spec, rank)
        path = save_checkpoint(Path(root) / name, step=1, model=layout.parts,
                               optimizer=optimizers, metadata={"layout": checkpoint_degrees(spec)})
        state = gather_full_state(layout)  # collective; whole on rank 0
        if state is not None:
            export_hf(state, spec.model, Path(root) / name / "export")
        reports[name] = {"coords": layout.coords, "checkpoint": path,
                         "params": {n: full(p) for n, p in named_params(layout).items()}}
    first, last = list(spec_dicts)[0], list(spec_dicts)[-1]
    spec = spec_from_dict(RunSpec, spec_dicts[last])
    layout, optimizers = _step(spec, rank)  # a state to overwrite
    load_checkpoint(reports[first]["checkpoint"], model=layout.parts, optimizer=optimizers,
                    degrees=checkpoint_degrees(spec), allow_reshard=True)
    reports["loaded"] = {n: full(p) for n, p in named_params(layout).items()}
    return reports
