"""The rules of automatic restarts (conf/run_dir/restart_legs.py) on run dirs written here:
when a run may restart, the leg each restart records, and the one line when it may not."""
from __future__ import annotations

import json
from pathlib import Path

from conf.run_dir.checkpoint_dirs import DCP_METADATA_FILENAME, META_FILENAME, step_dir
from conf.run_dir.paths import RunDir
from conf.run_dir.restart_legs import (RESTART_KEY, Failure, current_restarts, failure_of,
                                       record_refusal, record_restart, restart_refusal)
from conf.run_dir.run_states import RunState, state_from_files

KILLED = Failure(step=5, cause="rank 1 killed by SIGKILL")


def _run_dir(tmp_path: Path, *, checkpoint_step: int | None = 4, last_step: int = 5) -> Path:
    tmp_path.mkdir(parents=True, exist_ok=True)
    rd = RunDir(tmp_path)
    rd.overrides_file.write_text(json.dumps(["model=tiny"]))
    rows = [{"kind": "train", "step": s, "loss": 1.0} for s in range(1, last_step + 1)]
    rd.metrics_file.write_text("".join(json.dumps(r) + "\n" for r in rows))
    if checkpoint_step is not None:
        ckpt = step_dir(rd.checkpoints_dir, step=checkpoint_step)
        ckpt.mkdir(parents=True)
        (ckpt / META_FILENAME).write_text("{}")
        (ckpt / DCP_METADATA_FILENAME).write_text("")
    return tmp_path


def test_a_failure_is_the_step_reached_and_what_torchrun_says_failed(tmp_path):
    run_dir = _run_dir(tmp_path)
    assert failure_of(run_dir, 1) == Failure(step=5, cause="exit status 1")
    assert failure_of(run_dir, None).cause == "a rank failed"
    RunDir(run_dir).logs_dir.mkdir()
    RunDir(run_dir).torchrun_log.write_text(
        "Failures:\n  <NO_OTHER_FAILURES>\nRoot Cause (first observed failure):\n[0]:\n"
        "  time      : x\n  host      : h\n  rank      : 1 (local_rank: 1)\n"
        "  exitcode  : -9 (pid: 12)  (SIGKILL)\n  error_file: <N/A>\n"
        "  traceback : Signal 9 (SIGKILL)\n")
    assert failure_of(run_dir, 1) == KILLED
    older = RunDir(run_dir).torchrun_log.stat().st_size  # the next leg wrote no summary
    assert failure_of(run_dir, 1, torchrun_log_from=older).cause == "exit status 1"


def test_restarts_until_max_then_says_out_of_restarts(tmp_path):
    run_dir = _run_dir(tmp_path)
    assert restart_refusal(run_dir, KILLED, max_restarts=0) == "training.max_restarts=0"
    assert restart_refusal(run_dir, KILLED, max_restarts=2) is None
    assert record_restart(run_dir, KILLED) == 1
    (leg,) = RunDir(run_dir).read_resumes()
    assert leg[RESTART_KEY] == 1 and leg["after"] == {"step": 5, "cause": KILLED.cause}
    assert leg["effective"] == ["model=tiny"] and leg["overrides"] == []
    other = Failure(step=9, cause=KILLED.cause)
    assert restart_refusal(run_dir, other, max_restarts=2) is None
    assert record_restart(run_dir, other) == 2
    assert "out of restarts" in restart_refusal(run_dir, Failure(step=12, cause="x"),
                                                max_restarts=2)


def test_the_same_failure_at_the_same_step_twice_is_a_bug_and_status_says_so(tmp_path):
    run_dir = _run_dir(tmp_path)
    record_restart(run_dir, KILLED)
    reason = restart_refusal(run_dir, KILLED, max_restarts=5)
    assert "a bug, not a fault" in reason and "at the same step (5)" in reason
    record_refusal(run_dir, KILLED, reason)
    record_refusal(run_dir, KILLED, reason)  # a second rank saying it adds nothing
    failed = [r for r in RunDir(run_dir).read_rows() if r.get("event") == "failed"]
    assert len(failed) == 1 and "a bug, not a fault" in failed[0]["message"]
    assert state_from_files(run_dir) is RunState.failed


def test_a_resume_by_hand_starts_a_new_count_and_no_checkpoint_means_no_restart(tmp_path):
    run_dir = _run_dir(tmp_path)
    record_restart(run_dir, KILLED)
    RunDir(run_dir).append_resume(time="t", overrides=[], effective=["model=tiny"])
    assert current_restarts(run_dir) == []
    assert restart_refusal(run_dir, KILLED, max_restarts=1) is None  # a new streak
    bare = _run_dir(tmp_path / "bare", checkpoint_step=None)
    assert restart_refusal(bare, KILLED, max_restarts=1) == (
        "no complete checkpoint to restart from")


def test_a_run_the_loop_stopped_itself_is_not_restarted(tmp_path):
    run_dir = _run_dir(tmp_path)
    with RunDir(run_dir).metrics_file.open("a") as out:
        out.write(json.dumps({"kind": "event", "event": "failed", "step": 5,
                              "reason": "non-finite loss"}) + "\n")
    assert "stopped itself (non-finite loss)" in restart_refusal(run_dir, KILLED,
                                                                  max_restarts=3)
