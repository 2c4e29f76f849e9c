"""A `meshrun preflight` run dir reads as finished ("preflight passed"), not running forever:
from its files, after its local launcher's exit, and under Slurm's COMPLETED."""
from __future__ import annotations

import json

from conf.run_dir.metrics_rows import PREFLIGHT_EVENT
from conf.run_dir.run_states import (ACTIVE_STATES, RETRYABLE_STATES, RunState, state_after_exit,
                                     state_from_files)
from launcher.backends.slurm_state import state_from_scheduler


def preflight_dir(tmp_path, *, passed: bool):
    (tmp_path / "logs").mkdir()
    (tmp_path / "logs" / "rank0.log").write_text("rank 0/2 on cpu\npreflight passed: 2 ranks\n")
    (tmp_path / "preflight.json").write_text("{}")
    if passed:
        (tmp_path / "metrics.jsonl").write_text(
            json.dumps({"kind": "event", "event": PREFLIGHT_EVENT, "time": 1.0}) + "\n")
    return tmp_path


def test_a_passed_preflight_is_finished(tmp_path):
    run_dir = preflight_dir(tmp_path, passed=True)
    assert state_from_files(run_dir) == "preflight passed"
    assert state_after_exit(run_dir, exit_status=0, launcher_alive=False) == "preflight passed"
    assert state_from_scheduler("COMPLETED", run_dir) == "preflight passed"
    assert RunState.preflight_passed not in ACTIVE_STATES + RETRYABLE_STATES


def test_without_the_event_it_still_reads_as_running(tmp_path):
    """The control: the same run dir without the launcher's note is what issue 13 saw."""
    run_dir = preflight_dir(tmp_path, passed=False)
    assert state_from_files(run_dir) == "running"
    assert state_from_scheduler("COMPLETED", run_dir) == "stopped"
