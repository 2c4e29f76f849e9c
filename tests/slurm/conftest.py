"""Fixtures for tests against a real Slurm cluster started on this machine (tests/slurm/cluster.py)."""

from __future__ import annotations

import os
import shutil
import tempfile
from pathlib import Path

import pytest

from launcher.backends.slurm_state import POLL_MOST_ENV
from tests.slurm.cluster import INSTALL_HINT, SlurmCluster, missing_binaries

SACCT_POLL_MOST_S = 1  # sacct on the test cluster answers in milliseconds
_MAX_SOCKET_PATH = 100  # AF_UNIX paths are limited to 108 bytes; the munge socket lives under the dir


def _unavailable_reason() -> str | None:
    missing = missing_binaries()
    if missing:
        return (f"Slurm test cluster unavailable: missing {', '.join(missing)}. "
                f"Install (as root, Debian/Ubuntu) with:\n  {INSTALL_HINT}")
    if os.geteuid() != 0:
        return "Slurm test cluster unavailable: its daemons (SlurmUser=root) must be started as root."
    return None


def _cluster_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("slurm")
    if len(str(root / "munge" / "munge.socket")) > _MAX_SOCKET_PATH:
        root = Path(tempfile.mkdtemp(prefix="slurm-", dir="/tmp"))
    return root


@pytest.fixture(scope="session")
def slurm_cluster(tmp_path_factory: pytest.TempPathFactory):
    """A running two-node cluster (n1, n2, 2 CPUs each) with accounting.

    Sets SLURM_CONF in os.environ for the session (so sbatch, sacct and submitit find it), and
    MESHRUN_SLURM_POLL_MOST_S so `--wait` asks sacct at least every second (a job's end is seen
    within a second, not up to 30 s later); restores both afterwards. Skips when the Slurm packages are missing; fails instead under CI.
    """
    reason = _unavailable_reason()
    if reason:
        if os.environ.get("CI"):
            pytest.fail(reason, pytrace=False)
        pytest.skip(reason)
    cluster = SlurmCluster.up(_cluster_dir(tmp_path_factory))
    env = {**cluster.env, POLL_MOST_ENV: str(SACCT_POLL_MOST_S)}
    saved = {key: os.environ.get(key) for key in env}
    os.environ.update(env)
    try:
        yield cluster
    finally:
        for key, value in saved.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value
        cluster.down()
        shutil.rmtree(cluster.root / "mysql", ignore_errors=True)  # ~100 MB; logs stay for debugging
