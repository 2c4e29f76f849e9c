"""No silent hang (2 gloo ranks through `meshrun`): a rank SIGSTOPped before its first
collective, then (resumed) mid-training, is named by the launcher's watchdog within
training.hang_timeout_s + launcher.watchdog.DETECTION_BOUND_S; the other rank's stack is
dumped, every process is stopped, the run's state is `hung`, and a resume loads the newest
checkpoint and trains on. One run dir, three launches, shared by the checks: the mid-training
hang first (it leaves the checkpoint), then a resume stopped before its first collective."""
from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import time

import pytest

from conf.run_dir.checkpoint_dirs import is_complete_checkpoint
from conf.run_dir.heartbeats import HANG_REPORT_FILE, heartbeat_file, read_heartbeats
from conf.run_dir.paths import RunDir
from conf.run_dir.run_states import RunState, state_from_files
from conf.run_dir.hang_watch import DETECTION_BOUND_S
from launcher.watchdog import HUNG_EXIT
from tests.support.meshrun_cli import meshrun, start_meshrun
from tests.support.processes import pid_alive, survivors, wait_for
from tests.support.run_outputs import only_run_dir

pytestmark = [pytest.mark.distributed, pytest.mark.e2e]
HANG_S = 6
TINY = ["model=tiny", "training.seq_len=32", "training.micro_batch_size=4",
        "training.eval_every=0", "logging=disabled", "checkpoint.export_safetensors=false",
        "cluster.procs_per_node=2", f"training.hang_timeout_s={HANG_S}",
        "training.steps=400", "checkpoint.every_steps=2", "checkpoint.keep_last=1"]
STRAGGLE_STEPS = 30
SLACK_S = 4.0
"""Beyond the stated bound: the last heartbeat may be up to one (slow, shared-core) step old."""


def _stop_rank_when(run_dir_of, proc, ready) -> tuple[int, float, str]:
    """SIGSTOP rank 1 as soon as `ready(its heartbeat)`; (its pid, when, the phase its
    heartbeat file shows once stopped: the phase may change between the read and the signal,
    and that file is what the watchdog reads)."""
    def beat():
        run_dir = run_dir_of()
        if run_dir is None or not heartbeat_file(run_dir, 1).exists():
            return None
        b = read_heartbeats(run_dir).get(1)
        return b if b and ready(b, run_dir) else None
    deadline = time.monotonic() + 120
    while (b := beat()) is None:
        assert proc.poll() is None and time.monotonic() < deadline, "rank 1 never got there"
        time.sleep(0.01)
    os.kill(b["pid"], signal.SIGSTOP)
    stopped_at = time.monotonic()
    return b["pid"], stopped_at, read_heartbeats(run_dir_of())[1]["phase"]


def _hung_launch(args, run_dir_of, ready, tmp_path, name):
    out = open(tmp_path / f"{name}.txt", "w")
    proc = start_meshrun(*args, stdout=out, stderr=subprocess.STDOUT)
    pid, stopped_at, phase = _stop_rank_when(run_dir_of, proc, ready)
    try:
        status = proc.wait(timeout=HANG_S + DETECTION_BOUND_S + 60)
    finally:
        os.kill(pid, signal.SIGCONT) if pid_alive(pid) else None
    named_after = time.monotonic() - stopped_at
    return status, named_after, (tmp_path / f"{name}.txt").read_text(), pid, phase


@pytest.fixture(scope="module")
def hung_twice(tmp_path_factory):
    """Launch 1: rank 1 stopped once a checkpoint exists (step >= 5). Launch 2 (resume): rank 1
    stopped before its first collective. Launch 3: resumed to a pause at the next step."""
    tmp = tmp_path_factory.mktemp("hang")
    runs = tmp / "runs"
    found = lambda: next((p.parent for p in runs.glob("*/spec.json")), None)
    late = _hung_launch(("run", *TINY, f"runs_dir={runs}"), found,
                        lambda b, rd: (b["step"] >= 5 and b["phase"] == "step"
                                       and RunDir(rd).latest_checkpoint()), tmp,
                        "late")
    run_dir = only_run_dir(runs)
    late_report = (RunDir(run_dir).logs_dir / HANG_REPORT_FILE).read_text()
    status = meshrun("status", str(run_dir), "--json", timeout=60)
    early = _hung_launch(("resume", str(run_dir)), lambda: run_dir,
                         lambda b, _: b["pid"] != late[3], tmp, "early")  # this leg's rank 1
    early_report = (RunDir(run_dir).logs_dir / HANG_REPORT_FILE).read_text()
    early_state = state_from_files(run_dir)
    checkpoint = RunDir(run_dir).latest_checkpoint()
    complete = is_complete_checkpoint(checkpoint)  # before the resume's keep_last prunes it
    rows = RunDir(run_dir).read_rows()
    resumed = _straggling_resume(run_dir, stop_at=_step(checkpoint) + STRAGGLE_STEPS,
                                 not_pid=early[3], out=tmp / "straggle.txt")
    straggle_status = meshrun("status", str(run_dir), "--json", timeout=60)
    return dict(run_dir=run_dir, early=early, early_report=early_report,
                early_state=early_state, late=late, late_report=late_report,
                checkpoint=checkpoint, complete=complete, rows=rows,
                status=status, resumed=resumed, straggle_status=straggle_status)


def _straggling_resume(run_dir, *, stop_at: int, not_pid: int, out) -> int:
    """Resume to a pause at `stop_at`, slowing rank 1 (SIGSTOP 50 ms / SIGCONT 10 ms cycles,
    from its first heartbeat on) so that it is the straggler; the launcher's exit status.
    (20 ms / 10 ms failed in CI beside a second pytest worker: tiny steps of ~10 ms compute
    let rank 1 do most of its compute between stops, slow on 10 of 30 steps.)"""
    proc = start_meshrun("resume", str(run_dir), f"training.stop_at_step={stop_at}",
                         stdout=open(out, "w"), stderr=subprocess.STDOUT)
    beat = None
    while proc.poll() is None and beat is None:  # this leg's rank 1, from its first heartbeat
        found = read_heartbeats(run_dir).get(1)
        beat = found if found and found["pid"] != not_pid else None
        time.sleep(0.005)
    while proc.poll() is None:
        with contextlib.suppress(ProcessLookupError):
            os.kill(beat["pid"], signal.SIGSTOP)
            time.sleep(0.05)
            os.kill(beat["pid"], signal.SIGCONT)
        time.sleep(0.01)
    return proc.wait(timeout=120)


def _step(checkpoint) -> int:
    return int(checkpoint.name.split("_")[1])


def test_rank_stopped_before_its_first_collective_is_named(hung_twice):
    status, named_after, out, pid, _ = hung_twice["early"]
    assert status == HUNG_EXIT, out
    assert named_after < HANG_S + DETECTION_BOUND_S + SLACK_S, named_after
    assert "no progress from rank(s) 1 " in out, out
    report = hung_twice["early_report"]
    line1 = next(l for l in report.splitlines() if l.strip().startswith("rank 1"))
    assert "STALLED" in line1 and "cannot dump its stack" in line1, report
    # preflight too: with the CPU peak stored per host (no measurement at start) a rank can
    # reach preflight before it is stopped; its last collective is still init's
    assert any(p in line1 for p in ("phase init", "phase first_collective",
                                    "phase preflight")), line1
    assert any(f"collectives entered: {c};" in line1
               for c in ("none", "init_process_group@0")), line1
    assert hung_twice["early_state"] is RunState.hung


def test_rank_stopped_mid_training_is_named_others_stopped_and_stacks_dumped(hung_twice):
    status, named_after, out, pid, phase = hung_twice["late"]
    run_dir = hung_twice["run_dir"]
    assert status == HUNG_EXIT, out
    assert named_after < HANG_S + DETECTION_BOUND_S + SLACK_S, named_after
    assert phase in ("step", "checkpoint_save"), phase  # stopped in a step (rarely: just after)
    assert "no progress from rank(s) 1 " in out and f"phase {phase}" in out, out
    report = hung_twice["late_report"]
    assert "loss all_reduce@" in report or "grad sync@" in report, report
    assert "flight records" in report and "1 of 2 ranks answered" in report, report  # rank 0
    rank0_stack = report.split("--- rank 0 Python stacks")[1].split("--- rank 1")[0]
    assert "File " in rank0_stack and "training/loop.py" in rank0_stack, report
    assert not pid_alive(pid) and not survivors(str(run_dir)), survivors(str(run_dir))
    hung = [r for r in hung_twice["rows"] if r.get("event") == "hung"]
    assert hung[0]["ranks"] == [1] and hung[0]["phases"] == {"1": phase}, hung
    shown = json.loads(hung_twice["status"].stdout)
    assert shown["state"] == "hung" and "rank(s) 1" in shown["hang"], shown


def test_after_a_hang_the_newest_checkpoint_loads_and_training_goes_on(hung_twice):
    checkpoint, resumed = hung_twice["checkpoint"], hung_twice["resumed"]
    assert hung_twice["complete"]
    assert resumed == 0
    rows = RunDir(hung_twice["run_dir"]).read_rows()
    assert [r["step"] for r in rows if r.get("kind") == "resume"][-1] == _step(checkpoint)
    assert state_from_files(hung_twice["run_dir"]) is RunState.paused
    assert rows[-1]["event"] == "paused"


def test_a_rank_slowed_by_stop_cont_cycles_is_named_as_the_straggler(hung_twice):
    shown = json.loads(hung_twice["straggle_status"].stdout)
    assert len(shown["stragglers"]) == 1 and shown["stragglers"][0].startswith("rank 1 "), shown
    rows = RunDir(hung_twice["run_dir"]).read_rows()
    leg = rows[max(i for i, r in enumerate(rows) if r.get("kind") == "resume") + 1:]
    waits = [r["time_by_rank"]["wait_s"] for r in leg if r.get("kind") == "train"]
    assert len(waits) == STRAGGLE_STEPS
    assert sum(w[0] for w in waits) > sum(w[1] for w in waits), waits  # rank 0 waits for 1
