"""`meshrun sweep` without training: the 1,000-point dry run (fast, torch-free), a sweep with
invalid points refused whole before anything exists, the confirmation step, bad commands."""
from __future__ import annotations

import os
import subprocess
import sys
import time
from functools import partial

import pytest

from tests.support.meshrun_cli import REPO
from tests.support.meshrun_cli import meshrun as run_meshrun

pytestmark = pytest.mark.e2e
GRID_1000 = ["model=tiny", "optim.lr=range(1,11)", "schedule.warmup_steps=range(0,10)",
             "training.seed=range(0,10)"]


# every `meshrun` here but the one that answers: no stdin, 200 columns wide, up to 120 s
meshrun = partial(run_meshrun, timeout=120, stdin=subprocess.DEVNULL, columns=200)


def test_a_1000_point_dry_run_is_fast_and_never_imports_torch(tmp_path):
    code = ("import sys, time; from launcher.cli import main; t = time.perf_counter(); "
            f"rc = main(['sweep', '--dry-run', '--rows', '3', *{GRID_1000!r}, "
            f"'runs_dir={tmp_path}']); "
            "print('ELAPSED', time.perf_counter() - t, 'TORCH', 'torch' in sys.modules, 'RC', rc)")
    start = time.perf_counter()
    proc = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True,
                          text=True, timeout=300, env={**os.environ, "COLUMNS": "200"})
    wall = time.perf_counter() - start
    assert proc.returncode == 0, proc.stderr
    last = proc.stdout.strip().splitlines()[-1].split()
    assert last[2:] == ["TORCH", "False", "RC", "0"], proc.stdout[-2000:]
    assert "1000 pts" in proc.stdout and "997 more" in proc.stdout
    assert "dry run: nothing was written or submitted" in proc.stdout
    assert not any(tmp_path.iterdir())
    # ~1.5 s here (expand + validate + preview); an uncached Hydra compose per point took ~170 s.
    assert float(last[1]) < 30 and wall < 60, (last, wall)


def test_a_sweep_with_invalid_points_is_refused_whole(tmp_path):
    sweep_dir, runs = tmp_path / "sweep", tmp_path / "runs"
    proc = meshrun("sweep", "--yes", "--dir", str(sweep_dir), "model=tiny", "parallel=single",
                   "training.seq_len=32,4096", "optim.lr=1e-3,-1", f"runs_dir={runs}")
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert "Traceback" not in proc.stderr
    err = proc.stderr
    assert err.startswith("Invalid sweep: 3 of 4 points have problems:")
    single = meshrun("run", "--dry-run", "model=tiny", "parallel=single", "training.seq_len=4096",
                     "optim.lr=-1", f"runs_dir={runs}")
    assert single.returncode == 2
    for line in single.stderr.strip().splitlines()[1:]:  # the same message per problem
        assert line.strip() in err
    assert "nothing was submitted (--skip-invalid runs the valid points only)" in err
    assert not sweep_dir.exists() and not runs.exists()


def test_skip_invalid_drops_the_invalid_points(tmp_path):
    proc = meshrun("sweep", "--dry-run", "--skip-invalid", "model=tiny", "parallel=single",
                   "training.seq_len=32,4096", f"runs_dir={tmp_path}")
    assert proc.returncode == 0, proc.stderr
    assert "Invalid sweep: 1 of 2 points has problems" in proc.stdout
    assert "dropping them (--skip-invalid)" in proc.stdout and "1 pts" in proc.stdout


def test_without_an_answer_nothing_is_run(tmp_path):
    args = ["sweep", "--dir", str(tmp_path / "s"), "model=tiny", "optim.lr=1e-3,3e-3",
            f"runs_dir={tmp_path / 'runs'}"]
    proc = meshrun(*args)  # stdin is /dev/null: no answer counts as no
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert "Run 2 point(s) on this machine? [y/N]" in proc.stdout
    assert "nothing submitted (pass --yes" in proc.stdout
    no = run_meshrun(*args, input="n\n", timeout=120)
    assert no.returncode == 1 and "[y/N]" in no.stdout
    assert not (tmp_path / "s").exists() and not (tmp_path / "runs").exists()


def test_bad_sweep_commands_exit_2_with_one_message(tmp_path):
    cases = {
        ("sweep", "status", str(tmp_path)): "holds no points.json",
        ("sweep", "retry"): "takes exactly one sweep dir",
        ("sweep",): "nothing to sweep",
        ("sweep", "-f", "no_such_sweep"): "is neither a file nor a shipped sweep",
        ("sweep", "--dry-run", "optim.lr=1,2", "trainng.steps=3"): "did you mean training?",
    }
    for args, want in cases.items():
        proc = meshrun(*args)
        assert proc.returncode == 2, (args, proc.stdout, proc.stderr)
        assert want in proc.stderr and "Traceback" not in proc.stderr, (args, proc.stderr)
