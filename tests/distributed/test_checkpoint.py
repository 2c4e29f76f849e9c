"""Distributed checkpoints on real gloo ranks: exact resume, atomicity, keep_last, layouts.

Two spawns of 2 ranks run once per module (fixture `runs`): the first trains a small DDP model
with AdamW, saving at step 0 and 3, then checks keep_last and a crash injected before the
publishing rename; the second starts fresh processes, resumes from step 0 and from the latest
checkpoint, and saves again. The tests then compare the runs exactly.
"""
from __future__ import annotations

import json
import random
import subprocess
import sys
from pathlib import Path
from unittest import mock

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from torch import nn
from torch.nn.parallel import DistributedDataParallel

from tests.support.spawn import run_on_ranks
from training.checkpoint import (
    CheckpointError,
    CheckpointMismatch,
    load_checkpoint,
    save_checkpoint,
)
from conf.run_dir.checkpoint_dirs import (latest_checkpoint, read_checkpoint_meta, step_dir,
                                          tmp_step_dir)

REPO_ROOT = Path(__file__).resolve().parents[2]
LAYOUT = {"parallel": {"dp_replicate": 2, "tp": 1, "pp": 1}}


# --- what each rank runs (module level: pickled by name into spawned processes) ------------------

def _build(*, model_seed: int, ddp: bool = True):
    torch.manual_seed(model_seed)
    model = nn.Sequential(nn.Linear(8, 16), nn.Tanh(), nn.Dropout(0.1), nn.Linear(16, 1))
    wrapped = DistributedDataParallel(model) if ddp else model
    optimizer = torch.optim.AdamW(wrapped.parameters(), lr=1e-2, weight_decay=0.1)
    scheduler = torch.optim.lr_scheduler.StepLR(optimizer, step_size=2, gamma=0.5)
    return wrapped, optimizer, scheduler


def _seed_all(seed: int) -> None:
    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)


def _train(model, optimizer, scheduler, *, steps: int) -> list[float]:
    """Data and dropout draw from torch, python and numpy RNGs, so all three must resume."""
    losses = []
    for _ in range(steps):
        x = torch.randn(4, 8)
        y = x.sum(dim=1, keepdim=True) * random.uniform(0.5, 1.5) + float(np.random.normal())
        loss = F.mse_loss(model(x), y)
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()
        scheduler.step()
        losses.append(loss.item())
    return losses


def _params(model) -> dict[str, torch.Tensor]:
    inner = model.module if isinstance(model, DistributedDataParallel) else model
    return {name: value.detach().clone() for name, value in inner.state_dict().items()}


def _save(root, *, step, model, optimizer, scheduler, keep_last=None) -> Path:
    extra = {"step": step, "scheduler": scheduler.state_dict(), "data": {"position": 4 * step}}
    return save_checkpoint(root, step=step, model=model, optimizer=optimizer, extra=extra,
                           metadata=LAYOUT, keep_last=keep_last)


def _train_never_saving(*, rank: int) -> list[float]:
    """Reference: the same 6 steps without saving (a save must not perturb training)."""
    model, optimizer, scheduler = _build(model_seed=0)
    _seed_all(100 + rank)
    return _train(model, optimizer, scheduler, steps=6)


def _train_and_save(*, rank: int, world_size: int, root: Path, keep_root: Path) -> dict:
    model, optimizer, scheduler = _build(model_seed=0)
    _seed_all(100 + rank)
    _save(root, step=0, model=model, optimizer=optimizer, scheduler=scheduler)
    first = _train(model, optimizer, scheduler, steps=3)
    params_at_3 = _params(model)
    _save(root, step=3, model=model, optimizer=optimizer, scheduler=scheduler)
    second = _train(model, optimizer, scheduler, steps=3)
    result = {"first": first, "second": second, "params_at_3": params_at_3,
              "params_at_6": _params(model), "never_saved": _train_never_saving(rank=rank)}

    for step in (1, 2, 3):
        _save(keep_root, step=step, model=model, optimizer=optimizer, scheduler=scheduler,
              keep_last=2)
    bad_extra = {"position": np.int64(3)} if rank == 1 else {"position": 3}
    try:  # only rank 1 is wrong: every rank must raise instead of waiting for it
        save_checkpoint(root, step=7, model=model, optimizer=optimizer, extra=bad_extra)
    except ValueError as exc:
        result["bad_extra_error"] = str(exc)
    with mock.patch("training.checkpoint._rename_into_place",
                    side_effect=OSError("simulated crash before rename")):
        try:
            _save(root, step=6, model=model, optimizer=optimizer, scheduler=scheduler)
        except CheckpointError as exc:
            result["crash_error"] = str(exc)
    return result


def _resume_and_train(*, rank: int, world_size: int, root: Path) -> dict:
    model, optimizer, scheduler = _build(model_seed=123)
    _seed_all(999)  # garbage RNG state: load_checkpoint must restore the saved one
    extra = load_checkpoint(step_dir(root, step=0), model=model, optimizer=optimizer)
    scheduler.load_state_dict(extra["scheduler"])
    from_step_0 = _train(model, optimizer, scheduler, steps=3)

    latest = latest_checkpoint(root)
    model, optimizer, scheduler = _build(model_seed=456)
    _seed_all(777)
    extra = load_checkpoint(latest, model=model, optimizer=optimizer)
    scheduler.load_state_dict(extra["scheduler"])
    resumed = _train(model, optimizer, scheduler, steps=3)
    _save(root, step=6, model=model, optimizer=optimizer, scheduler=scheduler)
    return {"from_step_0": from_step_0, "latest": latest.name, "extra": extra,
            "resumed": resumed, "params_at_6": _params(model)}


# --- the two spawns, run once for the module -----------------------------------------------------

def _folder_names(root: Path) -> list[str]:
    return sorted(p.name for p in root.iterdir() if p.is_dir())


@pytest.fixture(scope="module")
def runs(tmp_path_factory) -> dict:
    workdir = tmp_path_factory.mktemp("checkpoint")
    root, keep_root = workdir / "ckpt", workdir / "ckpt_keep"
    first = run_on_ranks(_train_and_save, world_size=2, workdir=workdir,
                         kwargs={"root": root, "keep_root": keep_root})
    after_crash = {"names": _folder_names(root), "latest": latest_checkpoint(root)}
    second = run_on_ranks(_resume_and_train, world_size=2, workdir=workdir,
                          kwargs={"root": root})
    return {"root": root, "keep_root": keep_root, "first": first, "second": second,
            "after_crash": after_crash}


@pytest.mark.distributed
def test_resume_reproduces_losses_and_params_exactly(runs):
    for rank in range(2):
        first, second = runs["first"][rank], runs["second"][rank]
        assert second["latest"] == "step_00000003"
        assert second["resumed"] == first["second"]  # exact float equality
        for name, value in first["params_at_6"].items():
            assert torch.equal(second["params_at_6"][name], value), name
    assert runs["first"][0]["second"] != runs["first"][1]["second"], "ranks saw the same data"


@pytest.mark.distributed
def test_saving_does_not_perturb_training(runs):
    """get_state_dict runs a zero-lr AdamW step on an empty optimizer; save must undo it."""
    for rank in range(2):
        first = runs["first"][rank]
        assert first["first"] + first["second"] == first["never_saved"]


@pytest.mark.distributed
def test_resume_before_first_optimizer_step_is_exact(runs):
    for rank in range(2):
        assert runs["second"][rank]["from_step_0"] == runs["first"][rank]["first"]


@pytest.mark.distributed
def test_rank_extra_round_trips(runs):
    for rank in range(2):
        extra = runs["second"][rank]["extra"]
        assert extra["step"] == 3 and extra["data"] == {"position": 12}
        assert extra["scheduler"]["last_epoch"] == 3


@pytest.mark.distributed
def test_crash_before_rename_is_never_resumed_and_is_cleaned_up(runs):
    for rank in range(2):
        message = runs["first"][rank]["crash_error"]
        assert "rank 0" in message and "simulated crash before rename" in message
    names, root = runs["after_crash"]["names"], runs["root"]
    assert names == ["step_00000000", "step_00000003", "step_00000006.tmp"]
    assert runs["after_crash"]["latest"] == step_dir(root, step=3)
    # the next successful save (in the resumed run) removed the stale folder
    assert _folder_names(root) == ["step_00000000", "step_00000003", "step_00000006"]
    assert not tmp_step_dir(root, step=6).exists()


@pytest.mark.distributed
def test_bad_extra_on_one_rank_raises_on_every_rank(runs):
    for rank in range(2):
        message = runs["first"][rank]["bad_extra_error"]
        assert "rank 1: TypeError: extra['position'] is a numpy.int64" in message
        assert "rank 0" not in message


@pytest.mark.distributed
def test_keep_last_deletes_older_checkpoints(runs):
    assert _folder_names(runs["keep_root"]) == ["step_00000002", "step_00000003"]


@pytest.mark.distributed
def test_folder_holds_dcp_rank_files_and_meta(runs):
    path = step_dir(runs["root"], step=3)
    assert {"rank_0.pt", "rank_1.pt", "meta.json", ".metadata"} <= {p.name for p in path.iterdir()}
    meta = read_checkpoint_meta(path)
    assert (meta["step"], meta["world_size"], meta["metadata"]) == (3, 2, LAYOUT)
    keys = torch.distributed.checkpoint.FileSystemReader(path).read_metadata().state_dict_metadata
    assert "model.0.weight" in keys and not [k for k in keys if "module." in k]


@pytest.mark.distributed
def test_world_size_mismatch_raises_clear_error(runs):
    model, optimizer, _ = _build(model_seed=5, ddp=False)  # this process: no group, world 1
    with pytest.raises(CheckpointMismatch) as caught:
        load_checkpoint(step_dir(runs["root"], step=3), model=model, optimizer=optimizer)
    message = str(caught.value)
    assert "world_size: saved 2, now 1" in message
    assert "checkpoint.load_from=" in message


@pytest.mark.distributed
def test_allow_reshard_loads_ddp_checkpoint_into_plain_module(runs):
    model, optimizer, _ = _build(model_seed=5, ddp=False)
    extra = load_checkpoint(step_dir(runs["root"], step=3), model=model, optimizer=optimizer,
                            allow_reshard=True)
    assert extra["step"] == 3
    for name, value in runs["first"][0]["params_at_3"].items():
        assert torch.equal(model.state_dict()[name], value), name


# --- single-process checks (no spawn) ------------------------------------------------------------

def _touch(folder: Path, *names: str) -> None:
    folder.mkdir(parents=True)
    for name in names:
        (folder / name).write_text("{}")


def test_latest_checkpoint_ignores_partial_folders(tmp_path):
    assert latest_checkpoint(tmp_path / "missing") is None
    _touch(tmp_path / "step_00000001", "meta.json", ".metadata")
    _touch(tmp_path / "step_00000002", ".metadata")  # no meta.json
    _touch(tmp_path / "step_00000003", "meta.json")  # no DCP metadata
    _touch(tmp_path / "step_00000004.tmp", "meta.json", ".metadata")  # never renamed
    _touch(tmp_path / "step_00000005.old", "meta.json", ".metadata")  # being replaced
    _touch(tmp_path / "notes", "meta.json", ".metadata")
    assert latest_checkpoint(tmp_path) == tmp_path / "step_00000001"


def test_partial_checkpoint_is_refused_by_load(tmp_path):
    _touch(tmp_path / "step_00000002.tmp", "meta.json", ".metadata")
    model, optimizer, _ = _build(model_seed=5, ddp=False)
    with pytest.raises(CheckpointError, match="not a complete checkpoint"):
        load_checkpoint(tmp_path / "step_00000002.tmp", model=model, optimizer=optimizer)


def test_unloadable_extra_is_refused_at_save_time(tmp_path):
    model, optimizer, _ = _build(model_seed=5, ddp=False)
    with pytest.raises(ValueError, match=r"extra\['data'\]\['position'\] is a numpy.int64"):
        save_checkpoint(tmp_path, step=1, model=model, optimizer=optimizer,
                        extra={"data": {"position": np.int64(3)}}, metadata={}, keep_last=None)
    assert latest_checkpoint(tmp_path) is None


def test_checkpoint_folder_rules_do_not_import_torch():
    code = ("import sys, json, conf.run_dir.run_states, conf.run_dir.outcomes, "
            "conf.run_dir.checkpoint_verify; "
            "print(json.dumps('torch' in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], cwd=REPO_ROOT, check=True,
                         capture_output=True, text=True).stdout
    assert json.loads(out) is False


def test_resaving_a_step_replaces_it_without_a_process_group(tmp_path):
    model, optimizer, scheduler = _build(model_seed=5, ddp=False)
    _train(model, optimizer, scheduler, steps=1)
    for position in (1, 2):
        save_checkpoint(tmp_path, step=1, model=model, optimizer=optimizer,
                        extra={"position": position}, metadata={}, keep_last=1)
    assert _folder_names(tmp_path) == ["step_00000001"]
    assert read_checkpoint_meta(tmp_path / "step_00000001")["world_size"] == 1
    extra = load_checkpoint(tmp_path / "step_00000001", model=model, optimizer=optimizer)
    assert extra == {"position": 2}
