"""`meshrun status` of a local run whose processes all died says failed (naming the launcher
that is gone), never "running": the owner is whoever holds the run dir's flock, taken here by
a real child process through acquire_run_lock and then SIGKILLed."""
from __future__ import annotations

import io
import json
import signal
import subprocess
import sys

from rich.console import Console

from conf.run_dir.paths import RunDir
from launcher.views.run_status import print_status, run_status
from tests.support.loop_runs import prepare_run_dir
from tests.support.specs import cpu_spec

HOLD_LOCK = ("import sys, time; from pathlib import Path; "
             "from launcher.backends.run_lock import acquire_run_lock; "
             "lock = acquire_run_lock(Path(sys.argv[1]), action='run'); "
             "print('held', flush=True); time.sleep(120)")


def _run_dir_that_says_running(tmp_path):
    run_dir = prepare_run_dir(cpu_spec("model=tiny", f"runs_dir={tmp_path}"))
    rd = RunDir(run_dir)
    row = {"kind": "train", "step": 3, "loss": 5.0, "tokens_per_s": 100.0}
    (run_dir / "metrics.jsonl").write_text(json.dumps(row) + "\n")
    rd.rank_log(0).parent.mkdir(exist_ok=True)
    rd.rank_log(0).write_text("rank 0 training\n")
    return run_dir


def test_a_run_whose_owner_was_killed_is_failed_not_running(tmp_path):
    run_dir = _run_dir_that_says_running(tmp_path)
    owner = subprocess.Popen([sys.executable, "-c", HOLD_LOCK, str(run_dir)],
                             stdout=subprocess.PIPE, text=True)
    try:
        assert owner.stdout.readline().strip() == "held"
        assert run_status(run_dir)["state"] == "running"
    finally:
        owner.send_signal(signal.SIGKILL)
        owner.wait(timeout=30)
    status = run_status(run_dir)
    assert status["state"] == "failed", status
    assert f"meshrun pid {owner.pid}" in status["owner_note"] and "has exited" in status["owner_note"]
    shown = io.StringIO()
    print_status(status, Console(file=shown, width=200))
    assert "no live process owns this run" in shown.getvalue()


def test_a_run_released_cleanly_but_never_ended_is_failed(tmp_path):
    run_dir = _run_dir_that_says_running(tmp_path)
    RunDir(run_dir).lock_file.write_text("")  # released (emptied) by a launcher
    status = run_status(run_dir)
    assert status["state"] == "failed" and "ended without saying how" in status["owner_note"]
