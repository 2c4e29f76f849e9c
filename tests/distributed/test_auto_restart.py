"""training.max_restarts on 2 local gloo ranks through `meshrun run`: rank 1 SIGKILLs itself
before step 5 (training/fault_injection.py, test-only), after the checkpoint of step 4.

- killed once, max_restarts=1: the run restarts by itself from step 4, finishes, records the
  restart leg in resumes.jsonl, and its losses equal an uninterrupted run's, bit for bit;
- killed at step 5 every leg, max_restarts=3: one restart, then "a bug, not a fault" in one
  line, in `meshrun status`, and no second restart;
- max_restarts=0: today's behaviour, the run fails and nothing restarts it.
"""
from __future__ import annotations

import json
import os

import pytest

from conf.run_dir.paths import RunDir
from conf.run_dir.restart_legs import RESTART_KEY
from tests.support.meshrun_cli import meshrun
from tests.support.run_outputs import only_run_dir

pytestmark = [pytest.mark.distributed, pytest.mark.e2e]
RUN = ["model=tiny", "training.seq_len=32", "training.micro_batch_size=4",
       "training.eval_every=0", "logging=disabled", "checkpoint.export_safetensors=false",
       "training.steps=8", "checkpoint.every_steps=2", "schedule.warmup_steps=2"]
LOCAL = ["cluster.procs_per_node=2"]
KILL = {"MESHRUN_TEST_KILL_AT": "1:5"}
KILLED = {"step": 4, "cause": "rank 1 killed by SIGKILL"}


def _run(runs, *overrides, env=None):
    result = meshrun("run", *RUN, *LOCAL, *overrides, f"runs_dir={runs}",
                     env={**os.environ, **(env or {})}, timeout=240)
    return result, only_run_dir(runs)


def _losses(run_dir) -> dict[int, float]:
    """{step: loss} of the run's current history (rows a restart superseded are dropped)."""
    return {r["step"]: r["loss"] for r in RunDir(run_dir).read_rows() if r["kind"] == "train"}


@pytest.fixture(scope="module")
def straight(tmp_path_factory):
    result, run_dir = _run(tmp_path_factory.mktemp("straight"))
    assert result.returncode == 0, result.stderr
    return _losses(run_dir)


def test_killed_rank_restarts_from_its_checkpoint_to_the_same_losses(tmp_path, straight):
    env = {**KILL, "MESHRUN_TEST_KILL_ONCE": str(tmp_path / "killed-once")}
    result, run_dir = _run(tmp_path / "runs", "training.max_restarts=1", env=env)
    assert result.returncode == 0, result.stderr
    assert (tmp_path / "killed-once").exists()  # the fault did fire
    assert "restart 1/1" in result.stderr and "from checkpoint step_" in result.stderr
    (leg,) = RunDir(run_dir).read_resumes()
    assert leg[RESTART_KEY] == 1 and leg["after"] == KILLED and leg["overrides"] == []
    assert RunDir(run_dir).summary_file.exists()
    assert sorted(straight) == list(range(1, 9))
    assert _losses(run_dir) == straight  # exact float equality, every step


def test_same_failure_twice_stops_restarting(tmp_path):
    result, run_dir = _run(tmp_path, "training.max_restarts=3", env=KILL)
    assert result.returncode != 0
    lines = [line for line in result.stderr.splitlines() if "not restart" in line]
    assert len(lines) == 1 and "a bug, not a fault" in lines[0], result.stderr
    assert "(rank 1 killed by SIGKILL) at the same step (4)" in lines[0]
    legs = RunDir(run_dir).read_resumes()
    assert [leg[RESTART_KEY] for leg in legs] == [1]
    status = meshrun("status", str(run_dir), "--json", timeout=60)
    shown = json.loads(status.stdout)
    assert shown["state"] == "failed", shown
    assert "a bug, not a fault" in json.dumps(shown)


def test_without_max_restarts_a_killed_rank_fails_the_run(tmp_path):
    result, run_dir = _run(tmp_path, env=KILL)
    assert result.returncode != 0
    assert "restart 1/" not in result.stderr and "not restart" not in result.stderr
    assert not RunDir(run_dir).resumes_file.exists()
    assert not RunDir(run_dir).summary_file.exists()

