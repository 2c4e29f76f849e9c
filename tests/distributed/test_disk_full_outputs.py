"""A full disk under an export or a background checkpoint save: one line naming the path and
the free space, and nothing left that looks complete (a real 1 MiB tmpfs, mounted as root)."""
from __future__ import annotations

import os
import subprocess

import pytest
import torch

from conf.run_dir.checkpoint_dirs import complete_checkpoints
from tests.support.specs import tiny_model_spec
from training.checkpoint import CheckpointError
from training.checkpoint_saver import CheckpointSaver
from training.export import export_hf
from training.model_builder import build_model


@pytest.fixture
def full_disk(tmp_path):
    """A 1 MiB tmpfs: smaller than any output written into it here."""
    if os.geteuid() != 0:
        pytest.skip("mounting a tmpfs needs root (CI runs as root, so it runs there)")
    mount = tmp_path / "small"
    mount.mkdir()
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=1024k", "tmpfs", str(mount)], check=True)
    try:
        yield mount
    finally:
        subprocess.run(["umount", "-l", str(mount)], check=False)


def test_an_export_onto_a_full_disk_says_where_and_leaves_no_folder(full_disk):
    spec = tiny_model_spec(vocab_size=8192)  # embedding + head: 4 MiB of fp32
    state = build_model(spec, device=torch.device("cpu"), seed=0).state_dict()
    run = full_disk / "run"
    run.mkdir()
    with pytest.raises(OSError) as caught:
        export_hf(state, spec, run / "export")
    message = str(caught.value)
    assert "No space left on device writing" in message and str(run) in message, message
    assert " free on its filesystem" in message and "\n" not in message, message
    assert list(run.iterdir()) == []  # neither export/ nor export.tmp/


def test_a_background_save_onto_a_full_disk_fails_at_the_wait_saying_where(full_disk):
    model = torch.nn.Sequential(torch.nn.Linear(512, 512), torch.nn.Linear(512, 512))
    optimizer = torch.optim.AdamW(model.parameters())
    model(torch.randn(2, 512)).sum().backward()
    optimizer.step()
    saver = CheckpointSaver(async_save=True)
    root = full_disk / "checkpoints"
    saver.save(root, step=1, model=model, optimizer=optimizer, extra={}, metadata={},
               keep_last=2)  # returns once staged: the write fails in the background
    with pytest.raises(CheckpointError) as caught:
        saver.wait()
    message = str(caught.value)
    assert "No space left on device writing" in message and "step_00000001.tmp" in message
    assert " free on its filesystem" in message and "\n" not in message, message
    assert complete_checkpoints(root) == [] and list(root.iterdir()) == []
    saver.wait()  # the error is raised once; nothing is in flight any more


def test_a_run_dir_on_a_full_disk_is_refused_in_one_message_leaving_nothing(full_disk):
    from conf.errors import ConfigError
    from launcher.run_dir_writer import create_run_dir
    from tests.support.specs import cpu_spec

    runs = full_disk / "runs"
    runs.mkdir()
    try:  # fill the disk
        with open(full_disk / "filler", "wb") as handle:
            while True:
                handle.write(b"\0" * 65536)
                handle.flush()
    except OSError:
        pass
    spec = cpu_spec("model=tiny", f"runs_dir={runs}")
    with pytest.raises(ConfigError) as caught:
        create_run_dir(spec, overrides=[], config_yaml="x: 1\n", command=["meshrun", "run"])
    message = str(caught.value)
    assert "No space left on device writing" in message and "runs_dir" in message, message
    assert list(runs.iterdir()) == []
