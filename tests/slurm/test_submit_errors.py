"""sbatch refusing a job on the real test cluster: one message, exit 2, no run dir left."""
from __future__ import annotations

import pytest

from tests.support.meshrun_cli import meshrun
from tests.support.slurm_overrides import SLURM, TINY

pytestmark = pytest.mark.slurm


def test_unknown_partition_is_one_message_exit_2_and_no_run_dir(slurm_cluster, tmp_path):
    runs = tmp_path / "runs"
    result = meshrun("run", *TINY, *SLURM, "data=synthetic", "training.steps=2",
                     "cluster.partition=no-such-partition", f"runs_dir={runs}", timeout=120)
    assert result.returncode == 2, result.stdout + result.stderr
    assert "Traceback" not in result.stdout + result.stderr
    assert "Slurm submission failed" in result.stderr
    assert "partition no-such-partition" in result.stderr
    assert "sbatch: error:" in result.stderr  # sbatch's own words, not ours alone
    assert not runs.exists() or not any(runs.iterdir()), list(runs.iterdir())
