"""Damaged checkpoints end to end (2 gloo ranks through `meshrun`): a resume skips a truncated
and a bit-flipped newest checkpoint with a notice and continues exactly as an uninterrupted run
would; with none intact it fails with one clear line; what the launcher can see (a truncated
file, a planted pickle) is refused before launch with exit 2 and nothing runs."""
from __future__ import annotations

import os
import pickle
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from conf.run_dir.paths import RunDir
from tests.support.meshrun_cli import meshrun
from tests.support.run_outputs import only_run_dir, train_losses

pytestmark = [pytest.mark.distributed, pytest.mark.e2e]
TINY = ["model=tiny", "training.seq_len=64", "training.micro_batch_size=8",
        "training.eval_every=0", "logging=offline", "checkpoint.export_safetensors=false",
        "checkpoint.every_steps=2", "training.steps=8"]


def _flip_byte(path: Path) -> None:
    data = bytearray(path.read_bytes())
    data[len(data) // 2] ^= 0x01
    path.write_bytes(bytes(data))


def _truncate(path: Path) -> None:
    os.truncate(path, path.stat().st_size // 2)


class _Plant:
    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self):
        return (os.system, (f"touch {self.marker}",))


def test_resume_skips_damaged_checkpoints_and_matches_an_uninterrupted_run(tmp_path):
    with ThreadPoolExecutor(2) as pool:  # the uninterrupted run and the first leg together
        straight = pool.submit(meshrun, "run", *TINY, f"runs_dir={tmp_path / 'a'}")
        first = pool.submit(meshrun, "run", *TINY, "training.stop_at_step=6",
                            "checkpoint.keep_last=3", f"runs_dir={tmp_path / 'b'}")
        straight, first = straight.result(), first.result()
    assert straight.returncode == 0, straight.stdout + straight.stderr
    assert first.returncode == 0, first.stdout + first.stderr
    run_dir = only_run_dir(tmp_path / "b")
    ck = RunDir(run_dir).checkpoints_dir
    assert sorted(p.name for p in ck.iterdir()) == [f"step_0000000{s}" for s in (2, 4, 6)]
    _truncate(ck / "step_00000006" / "__1_0.distcp")
    _flip_byte(ck / "step_00000004" / "__0_0.distcp")

    resumed = meshrun("resume", str(run_dir))
    assert resumed.returncode == 0, resumed.stdout + resumed.stderr
    log = RunDir(run_dir).rank_log(0).read_text()
    assert "damaged checkpoint step_00000006: __1_0.distcp has" in log and "truncated" in log
    assert "damaged checkpoint step_00000004: __0_0.distcp does not match its sha256" in log
    expected = train_losses(only_run_dir(tmp_path / "a"))
    got = train_losses(run_dir)
    assert sorted(got) == list(range(1, 9))
    assert {s: got[s] for s in range(3, 9)} == {s: expected[s] for s in range(3, 9)}


def test_no_intact_checkpoint_left_fails_clearly(tmp_path):
    first = meshrun("run", *TINY, "training.stop_at_step=4", f"runs_dir={tmp_path}")
    assert first.returncode == 0, first.stdout + first.stderr
    run_dir = only_run_dir(tmp_path)
    ck = RunDir(run_dir).checkpoints_dir
    for step in (2, 4):  # bit flips: only the ranks' checksums can tell
        _flip_byte(ck / f"step_0000000{step}" / "rank_1.pt")
    failed = meshrun("resume", str(run_dir))
    assert failed.returncode != 0
    said = failed.stdout + failed.stderr
    assert "no intact checkpoint left to load" in said, said
    assert "weights_only" not in said
    last = RunDir(run_dir).rank_log(0).read_text().strip().splitlines()[-1]
    assert "no intact checkpoint left to load" in last and "step_00000002" in last, last

    _truncate(ck / "step_00000002" / "__0_0.distcp")  # sizes: the launcher sees it
    _truncate(ck / "step_00000004" / "__0_0.distcp")
    refused = meshrun("resume", str(run_dir))
    assert refused.returncode == 2 and "Traceback" not in refused.stderr, refused.stderr
    assert "no intact checkpoint left" in refused.stderr and "truncated" in refused.stderr


def test_load_from_a_planted_pickle_is_refused_before_launch(tmp_path):
    first = meshrun("run", *TINY, "training.steps=2", f"runs_dir={tmp_path / 'theirs'}")
    assert first.returncode == 0, first.stdout + first.stderr
    step = RunDir(only_run_dir(tmp_path / "theirs")).checkpoints_dir / "step_00000002"
    marker = tmp_path / "pwned"
    size = (step / ".metadata").stat().st_size
    (step / ".metadata").write_bytes(pickle.dumps(_Plant(marker)).ljust(size, b"."))
    refused = meshrun("run", *TINY, f"checkpoint.load_from={step}", f"runs_dir={tmp_path / 'mine'}")
    assert refused.returncode == 2 and "Traceback" not in refused.stderr, refused.stderr
    assert "checkpoint.load_from" in refused.stderr and "posix.system" in refused.stderr
    assert "refusing to unpickle" in refused.stderr
    assert not marker.exists() and not (tmp_path / "mine").exists()
