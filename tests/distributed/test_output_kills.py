"""A SIGKILL at every filesystem write of a checkpoint save (sync and async) and of an export
(first export and re-export) never leaves a complete-looking broken output: what looks
complete verifies (every file in the manifest, or weights + config that load), and the
previous complete output is still there until the new one replaces it.

Each case runs the real save/export in a forked child killed just before its n-th write
(tests/support/kill_at_write.py), for every n."""
from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from conf.run_dir.checkpoint_dirs import complete_checkpoints, stale_dirs
from conf.run_dir.checkpoint_verify import checkpoint_problems
from conf.run_dir.export_dirs import is_complete_export
from tests.support.kill_at_write import count_writes, kill_at_write
from tests.support.specs import tiny_model_spec
from training.checkpoint import load_checkpoint, save_checkpoint
from training.checkpoint_saver import CheckpointSaver
from training.export import export_hf, hf_state_dict
from training.model_builder import build_model

CPU = torch.device("cpu")


def _model_and_optimizer():
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.ReLU(), torch.nn.Linear(32, 4))
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2)
    model(torch.randn(8, 16)).sum().backward()
    optimizer.step()
    return model, optimizer


def _save_fn(root: Path, model, optimizer, *, async_save: bool):
    def save() -> None:
        saver = CheckpointSaver(async_save=async_save)
        saver.save(root, step=2, model=model, optimizer=optimizer, extra={"step": 2},
                   metadata={}, keep_last=1)
        saver.wait()
    return save


def _check_checkpoints(root: Path, model, optimizer) -> list[int]:
    complete = complete_checkpoints(root)
    assert complete, f"no complete checkpoint left: {sorted(p.name for p in root.iterdir())}"
    for path in complete:
        assert checkpoint_problems(path) == [], path
        load_checkpoint(path, model=model, optimizer=optimizer)  # loads, whole
    return [int(p.name.split("_")[1]) for p in complete]


@pytest.mark.parametrize("async_save", [False, True], ids=["sync", "async"])
def test_a_kill_at_every_checkpoint_write_leaves_only_verifiable_checkpoints(tmp_path,
                                                                              async_save):
    model, optimizer = _model_and_optimizer()
    pristine = tmp_path / "pristine"
    save_checkpoint(pristine, step=1, model=model, optimizer=optimizer, extra={"step": 1})
    root = tmp_path / "ck"
    save = _save_fn(root, model, optimizer, async_save=async_save)
    shutil.copytree(pristine, root)
    total = count_writes(save, root, scratch=tmp_path)
    assert [p.name for p in complete_checkpoints(root)] == ["step_00000002"]  # keep_last=1
    assert total >= 8, total
    newest_seen = set()
    for n in range(1, total + 1):
        shutil.rmtree(root)
        shutil.copytree(pristine, root)
        kill_at_write(save, root, n, scratch=tmp_path)
        steps = _check_checkpoints(root, model, optimizer)
        newest_seen.add(max(steps))
    assert newest_seen == {1, 2}, newest_seen  # kills landed before and after the publish
    # the next save after any kill cleans up what the killed one left
    save_checkpoint(root, step=3, model=model, optimizer=optimizer, keep_last=1)
    assert not stale_dirs(root) and _check_checkpoints(root, model, optimizer) == [3]


def _export_inputs(seed: int):
    spec = tiny_model_spec()
    return build_model(spec, device=CPU, seed=seed).state_dict(), spec


def _assert_export_is_one_of(export: Path, candidates: list[dict]) -> None:
    assert is_complete_export(export), sorted(p.name for p in export.iterdir())
    json.loads((export / "config.json").read_text())
    loaded = load_file(str(export / "model.safetensors"))
    assert any(loaded.keys() == c.keys() and all(torch.equal(loaded[k], c[k]) for k in c)
               for c in candidates), "the export's weights are neither the old nor the new ones"


@pytest.mark.parametrize("earlier_export", [False, True], ids=["export", "re-export"])
def test_a_kill_at_every_export_write_never_leaves_a_broken_export(tmp_path, earlier_export):
    new_state, spec = _export_inputs(seed=1)
    run, pristine = tmp_path / "run", tmp_path / "pristine"
    pristine.mkdir()
    candidates = [hf_state_dict(new_state, spec)]
    if earlier_export:
        old_state, _ = _export_inputs(seed=2)
        export_hf(old_state, spec, pristine / "export")
        candidates.append(hf_state_dict(old_state, spec))

    def export() -> None:
        export_hf(new_state, spec, run / "export")

    shutil.copytree(pristine, run)
    total = count_writes(export, run, scratch=tmp_path)
    _assert_export_is_one_of(run / "export", candidates[:1])
    outcomes = set()
    for n in range(1, total + 1):
        shutil.rmtree(run)
        shutil.copytree(pristine, run)
        kill_at_write(export, run, n, scratch=tmp_path)
        if (run / "export").exists():
            _assert_export_is_one_of(run / "export", candidates)
            outcomes.add("complete")
        else:
            outcomes.add("absent")
    assert outcomes == {"complete", "absent"}, outcomes
    export()  # an export after any kill publishes the new one and leaves nothing beside it
    _assert_export_is_one_of(run / "export", candidates[:1])
    assert sorted(p.name for p in run.iterdir()) == ["export"]
