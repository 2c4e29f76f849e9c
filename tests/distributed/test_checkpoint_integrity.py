"""Checkpoint integrity on real files, in one process: checksums catch any damage before a
single tensor is loaded, and nothing in a checkpoint folder is unpickled beyond DCP's
allow-list (a planted pickle never runs)."""
from __future__ import annotations

import io
import json
import os
import pickle
from pathlib import Path

import pytest
import torch
from torch import nn

from conf.run_dir.checkpoint_verify import checkpoint_problems, file_digest, prelaunch_problem
from training.checkpoint import CheckpointCorrupt, load_checkpoint, save_checkpoint
from training.safe_dcp import SafeLoadPlanner


def _model_and_optimizer(seed: int):
    torch.manual_seed(seed)
    model = nn.Sequential(nn.Linear(32, 64), nn.Tanh(), nn.Linear(64, 4))
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2)
    model(torch.randn(3, 32)).sum().backward()
    optimizer.step()
    return model, optimizer


@pytest.fixture()
def saved(tmp_path) -> Path:
    model, optimizer = _model_and_optimizer(0)
    return save_checkpoint(tmp_path / "ck", step=3, model=model, optimizer=optimizer,
                           extra={"step": 3})


def _load(path: Path):
    model, optimizer = _model_and_optimizer(1)
    before = {k: v.clone() for k, v in model.state_dict().items()}
    try:
        load_checkpoint(path, model=model, optimizer=optimizer)
    finally:
        _load.untouched = all(torch.equal(before[k], v) for k, v in model.state_dict().items())


def _flip_byte(path: Path, offset: int) -> None:
    data = bytearray(path.read_bytes())
    data[offset] ^= 0x01
    path.write_bytes(bytes(data))


def test_an_intact_checkpoint_lists_every_file_and_loads(saved):
    files = json.loads((saved / "meta.json").read_text())["files"]
    assert set(files) == {p.name for p in saved.iterdir()} - {"meta.json"}
    assert all(files[n] == file_digest(saved / n) for n in files)
    _load(saved)
    assert checkpoint_problems(saved) == [] and prelaunch_problem(saved) is None


@pytest.mark.parametrize("damage, says", [
    ("flip", "does not match its sha256"), ("truncate", "truncated"),
    ("garbage_rank", "does not match its sha256"), ("missing", "rank_0.pt is missing")])
def test_any_damage_is_caught_before_anything_is_loaded(saved, damage, says):
    data_file = next(saved.glob("__0_*.distcp"))
    if damage == "flip":  # one bit in the middle of the tensor data: loaded silently before
        _flip_byte(data_file, data_file.stat().st_size // 2)
    elif damage == "truncate":
        os.truncate(data_file, data_file.stat().st_size - 100)
    elif damage == "garbage_rank":
        size = (saved / "rank_0.pt").stat().st_size
        (saved / "rank_0.pt").write_bytes(b"\x80garbage".ljust(size, b"x"))
    else:
        (saved / "rank_0.pt").unlink()
    with pytest.raises(CheckpointCorrupt, match=says):
        _load(saved)
    assert _load.untouched  # the caller can fall back to an older checkpoint cleanly


class _Plant:
    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self):
        return (os.system, (f"touch {self.marker}",))


def _plant_metadata(folder: Path, marker: Path, *, fix_manifest: bool) -> None:
    """Someone else's checkpoint whose .metadata runs a command when unpickled; with
    `fix_manifest` its checksum is recorded too, so only the allow-list stands in the way."""
    (folder / ".metadata").write_bytes(pickle.dumps(_Plant(marker)))
    if fix_manifest:
        meta = json.loads((folder / "meta.json").read_text())
        meta["files"][".metadata"] = file_digest(folder / ".metadata")
        (folder / "meta.json").write_text(json.dumps(meta))


@pytest.mark.parametrize("fix_manifest", [True, False])
def test_a_planted_metadata_pickle_never_runs(saved, tmp_path, fix_manifest):
    marker = tmp_path / "pwned"
    _plant_metadata(saved, marker, fix_manifest=fix_manifest)
    assert "posix.system" in prelaunch_problem(saved) or not fix_manifest
    with pytest.raises(CheckpointCorrupt):
        _load(saved)
    if fix_manifest:  # past the checksum: the allow-list itself refuses, in the ranks too
        from training.safe_dcp import load_dcp_metadata
        with pytest.raises(ValueError, match="posix.system.*refusing to unpickle"):
            load_dcp_metadata(saved / ".metadata")
    assert not marker.exists()


def test_byte_entries_load_without_arbitrary_unpickling(tmp_path):
    marker = tmp_path / "pwned"
    buffer = io.BytesIO()
    torch.save(_Plant(marker), buffer)
    buffer.seek(0)
    with pytest.raises(pickle.UnpicklingError):
        SafeLoadPlanner().load_bytes(None, buffer)
    assert not marker.exists()


def test_a_full_disk_says_so_plainly_and_leaves_nothing_complete(tmp_path, monkeypatch):
    import training.checkpoint as checkpoint
    from conf.run_dir.checkpoint_dirs import latest_checkpoint

    def no_space(*args, **kwargs):
        raise OSError(28, os.strerror(28))

    monkeypatch.setattr(checkpoint.dcp, "save", no_space)
    model, optimizer = _model_and_optimizer(0)
    with pytest.raises(checkpoint.CheckpointError, match="No space left on device") as caught:
        save_checkpoint(tmp_path / "ck", step=1, model=model, optimizer=optimizer)
    assert "\n" not in str(caught.value)
    assert latest_checkpoint(tmp_path / "ck") is None
