"""checkpoint.load_from at something that is no checkpoint of this model is refused by resolve()
before launch, naming the path, the rule and the fix: a file, an empty folder, a folder whose
only checkpoint is unfinished, and a checkpoint of another model shape (its run's spec.json)."""
from __future__ import annotations

import json
import pickle

import pytest

from conf.compose import compose_config
from conf.errors import ConfigError
from conf.resolve import resolve
from conf.run_dir.checkpoint_dirs import DCP_METADATA_FILENAME, META_FILENAME
from conf.run_dir.paths import RunDir
from tests.support.specs import CPU_HOST, cpu_spec


def _spec(load_from, model: str = "tiny"):
    cfg = compose_config(["logging=disabled", f"model={model}", "data=synthetic",
                          f"checkpoint.load_from={load_from}"])
    return resolve(cfg, host=CPU_HOST, check_paths=True)


def _run_dir_with_checkpoint(folder, model: str):
    """A run dir of `model` holding one complete (format 1, unverified) checkpoint."""
    RunDir(folder).path.mkdir(parents=True)
    RunDir(folder).write_spec(cpu_spec(f"model={model}", "data=synthetic"))
    step = folder / "checkpoints" / "step_00000002"
    step.mkdir(parents=True)
    (step / META_FILENAME).write_text(json.dumps({"format_version": 1, "step": 2,
                                                  "world_size": 1, "metadata": {}}))
    (step / DCP_METADATA_FILENAME).write_bytes(pickle.dumps({}))
    return step


def _refusal(load_from, model: str = "tiny") -> str:
    with pytest.raises(ConfigError) as err:
        _spec(load_from, model)
    text = str(err.value)
    assert f"checkpoint.load_from={load_from}" in text and "fix:" in text
    return text


def test_a_file_an_empty_folder_and_an_unfinished_checkpoint_are_refused(tmp_path):
    (tmp_path / "weights.pt").write_bytes(b"\x00" * 64)
    assert "is a file, not a folder" in _refusal(tmp_path / "weights.pt")
    (tmp_path / "empty").mkdir()
    assert "is neither a step_N folder nor a run dir" in _refusal(tmp_path / "empty")
    unfinished = tmp_path / "run" / "checkpoints" / "step_00000001.tmp"
    unfinished.mkdir(parents=True)
    assert "holds no complete checkpoint" in _refusal(tmp_path / "run")
    assert "does not exist" in _refusal(tmp_path / "nowhere")


def test_a_checkpoint_of_another_shape_is_refused(tmp_path):
    step = _run_dir_with_checkpoint(tmp_path / "run", "debug")
    for source in (tmp_path / "run", step):  # the run dir, or its step folder
        text = _refusal(source, "tiny")
        assert "holds another model" in text and "spec.json" in text
        assert "n_layers=" in text and "(the run has model.n_layers=" in text
    assert _spec(step, "debug").checkpoint.load_from == str(step)  # the same shape: fine


def test_a_bare_step_folder_of_another_shape_is_refused_by_its_tensors(tmp_path):
    """No run dir above it: DCP's own .metadata (read torch-free, allow-listed) says the shapes."""
    import warnings

    import torch
    import torch.distributed.checkpoint as dcp

    from parallel.cost.params import parameter_shapes

    debug = cpu_spec("model=debug", "data=synthetic").model
    step = tmp_path / "step_00000003"
    state = {"model": {name: torch.zeros(shape) for name, shape in parameter_shapes(debug)}}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # "assuming the intent is to save in a single process"
        dcp.save(state, checkpoint_id=step, no_dist=True)
    (step / META_FILENAME).write_text(json.dumps({"format_version": 1, "step": 3,
                                                  "world_size": 1, "metadata": {}}))
    text = _refusal(step, "tiny")
    assert "holds another model (its .metadata): tok_embeddings.weight is [" in text
    assert _spec(step, "debug").checkpoint.load_from == str(step)
