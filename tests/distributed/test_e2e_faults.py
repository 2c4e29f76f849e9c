"""Nothing lost, nothing silently wrong, under real faults (2 gloo ranks through `meshrun`):
every process SIGKILLed in the middle of a checkpoint save, three times, and the resumes still
repeat an uninterrupted run's losses exactly; a full disk fails the run saying so, with no
partial checkpoint counted as complete."""
from __future__ import annotations

import json
import os
import signal
import subprocess
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from conf.run_dir.checkpoint_dirs import is_complete_checkpoint
from conf.run_dir.paths import RunDir
from tests.support.meshrun_cli import meshrun, start_meshrun
from tests.support.processes import descendants, pid_alive, survivors, wait_for
from tests.support.run_outputs import only_run_dir, train_losses, training_started

pytestmark = [pytest.mark.distributed, pytest.mark.e2e]
TINY = ["model=tiny", "training.seq_len=32", "training.micro_batch_size=4",
        "training.eval_every=0", "logging=disabled", "checkpoint.export_safetensors=false"]
STEPS = 12
SAVE_EVERY_STEP = [*TINY, f"training.steps={STEPS}", "checkpoint.every_steps=1",
                   "schedule.warmup_steps=2"]


def _pids(marker: str) -> list[int]:
    return [int(line.split(":", 1)[0]) for line in survivors(marker)]


def _kill_inside_a_save(proc: subprocess.Popen, runs: Path, *, from_step: int,
                        delay_s: float) -> None:
    """Wait for training, then for a `step_N.tmp` (N >= from_step) to appear, then SIGKILL the
    launcher, torchrun and both ranks at once (pids gathered beforehand: no scan in between;
    by run dir and as the launcher's descendants)."""
    run_dir = wait_for(lambda: training_started(runs), 180, "the first train step")
    ckpts = RunDir(run_dir).checkpoints_dir
    pids, scanned, deadline = [], 0.0, time.monotonic() + 180
    while time.monotonic() < deadline and proc.poll() is None:
        if time.monotonic() - scanned > 0.2:  # the ranks of this leg, refreshed while waiting
            # the warm torchrun agent's command line does not name the run dir: a descendant
            pids = _pids(str(run_dir)) + descendants(proc.pid)
            scanned = time.monotonic()
        try:
            names = os.listdir(ckpts)
        except FileNotFoundError:
            names = []
        if any(n.endswith(".tmp") and int(n[5:13]) >= from_step for n in names):
            break
        time.sleep(0.001)
    else:
        raise AssertionError(f"no save from step {from_step} seen; run ended: {proc.poll()}")
    pids = sorted(set(pids) | {proc.pid})
    time.sleep(delay_s)
    for pid in pids:
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    proc.wait()
    for pid in _pids(str(run_dir)):  # anything started after the pids were gathered
        os.kill(pid, signal.SIGKILL)
    wait_for(lambda: not survivors(str(run_dir)) and not any(pid_alive(p) for p in pids), 30,
             "every process of the run to be gone")


def test_sigkill_inside_checkpoint_saves_then_resume_matches_an_uninterrupted_run(tmp_path):
    pool = ThreadPoolExecutor(1)  # the uninterrupted run goes on beside the killed ones
    straight = pool.submit(meshrun, "run", *SAVE_EVERY_STEP, f"runs_dir={tmp_path / 'a'}")
    runs = tmp_path / "b"
    out = open(tmp_path / "out.txt", "w")
    args = ("run", *SAVE_EVERY_STEP, f"runs_dir={runs}")
    left_tmp = []
    for trial, (from_step, delay_s) in enumerate(((3, 0.0), (6, 0.01), (9, 0.03))):
        proc = start_meshrun(*args, stdout=out, stderr=subprocess.STDOUT)
        _kill_inside_a_save(proc, runs, from_step=from_step, delay_s=delay_s)
        run_dir = only_run_dir(runs)
        names = sorted(p.name for p in RunDir(run_dir).checkpoints_dir.iterdir())
        left_tmp += [n for n in names if n.endswith(".tmp")]
        assert not (run_dir / "summary.json").exists(), f"trial {trial} finished: {names}"
        assert all(is_complete_checkpoint(RunDir(run_dir).checkpoints_dir / n)
                   for n in names if not n.endswith((".tmp", ".old"))), names
        args = ("resume", str(run_dir))
    assert left_tmp, "no kill landed inside a save (no step_N.tmp was left)"

    resumed = meshrun("resume", str(run_dir))
    assert resumed.returncode == 0, resumed.stdout + resumed.stderr
    straight = straight.result()
    pool.shutdown()
    assert straight.returncode == 0, straight.stdout + straight.stderr
    expected, got = train_losses(only_run_dir(tmp_path / "a")), train_losses(run_dir)
    assert sorted(got) == list(range(1, STEPS + 1))
    assert got == expected


@pytest.fixture
def small_full_disk(tmp_path):
    """A 1 MiB tmpfs: the run dir and the first steps fit, a checkpoint (about 1.8 MB) does not."""
    if os.geteuid() != 0:
        pytest.skip("mounting a tmpfs needs root (CI runs as root, so it runs there)")
    mount = tmp_path / "small"
    mount.mkdir()
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=1024k", "tmpfs", str(mount)], check=True)
    try:
        yield mount
    finally:
        subprocess.run(["umount", "-l", str(mount)], check=False)


def test_a_full_disk_fails_the_run_saying_so_and_counts_no_partial_checkpoint(small_full_disk):
    result = meshrun("run", *TINY, "training.steps=4", "checkpoint.every_steps=2",
                     f"runs_dir={small_full_disk}")
    said = result.stdout + result.stderr
    assert result.returncode not in (0, 2), said
    assert "No space left on device" in result.stderr, said
    run_dir = RunDir(only_run_dir(small_full_disk))
    ckpts = run_dir.checkpoints_dir
    found = sorted(ckpts.iterdir()) if ckpts.exists() else []
    assert not any(is_complete_checkpoint(p) for p in found), found
    assert run_dir.latest_checkpoint() is None and not run_dir.summary_file.exists()
    status = meshrun("status", str(run_dir.path), "--json")
    shown = json.loads(status.stdout)
    assert shown["state"] == "failed", shown
    assert "No space left on device" in shown["log_tail"], shown["log_tail"]
