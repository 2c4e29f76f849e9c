"""cluster=nodes on this one machine: two "nodes" (cluster.nodes=2, procs_per_node=1, the
rendezvous on 127.0.0.1) started from the commands `meshrun run` prints, each a node agent
(launcher/node_agent.py) running its node's torchrun.

- the printed commands form one world and finish (the uninterrupted run the restart compares to);
- a rank SIGSTOPped mid-training is named within training.hang_timeout_s + the stated bound,
  both agents stop their node and exit HUNG_EXIT, the hung event is written once, state hung;
- training.max_restarts=1 with rank 1 SIGKILLing itself once before step 5 (after the step-4
  checkpoint, training/fault_injection.py): every agent starts leg 1 (a fresh rendezvous), the
  run finishes with one restart leg, and its losses equal the uninterrupted run's, bit for bit;
- `meshrun stop` mid-training: both agents SIGTERM their torchrun, the ranks checkpoint, no
  restart leg (training.max_restarts=1), both exit 130, state stopped; a second stop is refused
  (exit 2, no agent alive); `meshrun resume` prints the commands of a leg that trains on to its
  end (the stale stop request does not stop it).
"""
from __future__ import annotations

import json
import os
import shlex
import signal
import subprocess
import time

import pytest

from conf.run_dir.hang_watch import DETECTION_BOUND_S
from conf.run_dir.heartbeats import HANG_REPORT_FILE, HUNG_EVENT, read_heartbeats
from conf.run_dir.checkpoint_dirs import checkpoint_step, is_complete_checkpoint
from conf.run_dir.paths import RunDir
from conf.run_dir.restart_legs import RESTART_KEY
from conf.run_dir.run_states import RunState, state_from_files
from conf.run_dir.stop_request import stop_request_file
from launcher.views.run_status import run_status
from launcher.watchdog import HUNG_EXIT
from tests.support.meshrun_cli import REPO, meshrun
from tests.support.processes import pid_alive, wait_for
from tests.support.run_outputs import only_run_dir

pytestmark = [pytest.mark.distributed, pytest.mark.e2e]
HANG_S = 6
SLACK_S = 4.0
"""Beyond the stated bound: the last heartbeat may be up to one (slow, shared-core) step old."""
RUN = ["model=tiny", "training.seq_len=32", "training.micro_batch_size=4",
       "training.eval_every=0", "logging=disabled", "checkpoint.export_safetensors=false",
       "checkpoint.every_steps=2", "schedule.warmup_steps=2", "cluster=nodes", "cluster.nodes=2",
       "cluster.procs_per_node=1", "cluster.gpus_per_node=0", "cluster.rdzv_host=127.0.0.1"]


def free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _printed_nodes(runs, *overrides) -> tuple:
    """`meshrun run` on cluster=nodes: the run dir and the node commands it printed."""
    result = meshrun("run", *RUN, *overrides, f"cluster.rdzv_port={free_port()}",
                     f"runs_dir={runs}")
    assert result.returncode == 0, result.stderr
    return only_run_dir(runs), _node_commands(result.stdout)


def _node_commands(stdout: str) -> list[list[str]]:
    lines = stdout.splitlines()
    start = lines.index("launch command per node:") + 1
    return [shlex.split(line) for line in lines[start:start + 2]]


def _start(commands, out_dir, env=None) -> list[subprocess.Popen]:
    return [subprocess.Popen(cmd, cwd=REPO, env={**os.environ, **(env or {})},
                             stdout=open(out_dir / f"node{k}.txt", "w"), stderr=subprocess.STDOUT)
            for k, cmd in enumerate(commands)]


def _losses(run_dir) -> dict[int, float]:
    return {r["step"]: r["loss"] for r in RunDir(run_dir).read_rows() if r["kind"] == "train"}


@pytest.fixture(scope="module")
def straight(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("straight")
    run_dir, commands = _printed_nodes(tmp / "runs", "training.steps=8")
    assert [c[1:3] for c in commands] == [["-m", "launcher.node_agent"]] * 2
    assert [c[-1] for c in commands] == ["--node-rank=0", "--node-rank=1"]
    nodes = _start(commands, tmp)
    assert [n.wait(timeout=300) for n in nodes] == [0, 0], (tmp / "node0.txt").read_text()
    return run_dir


def test_printed_node_commands_form_one_world(straight):
    assert sorted(_losses(straight)) == list(range(1, 9))
    assert "rank 1/2" in (straight / "logs" / "rank1.log").read_text()
    assert json.loads((straight / "preflight.json").read_text())["world_size"] == 2
    assert (straight / "logs" / "torchrun.node1.log").exists()
    assert not RunDir(straight).resumes_file.exists()  # no restart leg


def test_killed_rank_restarts_every_node_to_the_same_losses(tmp_path, straight):
    once = tmp_path / "killed-once"
    run_dir, commands = _printed_nodes(tmp_path / "runs", "training.steps=8",
                                       "training.max_restarts=1")
    nodes = _start(commands, tmp_path, env={"MESHRUN_TEST_KILL_AT": "1:5",
                                            "MESHRUN_TEST_KILL_ONCE": str(once)})
    statuses = [n.wait(timeout=300) for n in nodes]
    out = (tmp_path / "node0.txt").read_text()
    assert statuses == [0, 0], out + (tmp_path / "node1.txt").read_text()
    assert once.exists()  # the fault did fire
    assert "restart 1/1" in out and "from checkpoint step_" in out, out
    (leg,) = RunDir(run_dir).read_resumes()
    assert leg[RESTART_KEY] == 1 and leg["after"]["step"] == 4, leg
    assert "rank 1" in leg["after"]["cause"], leg
    assert RunDir(run_dir).summary_file.exists()
    assert _losses(run_dir) == _losses(straight)  # exact float equality, every step


def test_rank_stopped_mid_training_stops_every_node_and_is_named(tmp_path):
    run_dir, commands = _printed_nodes(tmp_path / "runs", "training.steps=400",
                                       f"training.hang_timeout_s={HANG_S}",
                                       "checkpoint.keep_last=1")
    nodes = _start(commands, tmp_path)
    beat = wait_for(lambda: _ready(run_dir), 180, "rank 1 past a checkpoint")
    os.kill(beat["pid"], signal.SIGSTOP)
    stopped_at = time.monotonic()
    try:
        statuses = [n.wait(timeout=HANG_S + DETECTION_BOUND_S + 60) for n in nodes]
    finally:
        if pid_alive(beat["pid"]):
            os.kill(beat["pid"], signal.SIGCONT)
    named_after = time.monotonic() - stopped_at
    outs = [(tmp_path / f"node{k}.txt").read_text() for k in (0, 1)]
    print(f"named and both nodes stopped {named_after:.1f} s after SIGSTOP")
    assert statuses == [HUNG_EXIT, HUNG_EXIT], outs
    assert named_after < HANG_S + DETECTION_BOUND_S + SLACK_S, named_after
    assert not pid_alive(beat["pid"])
    assert sum("no progress from rank(s) 1 " in out for out in outs) == 1, outs
    report = (RunDir(run_dir).logs_dir / HANG_REPORT_FILE).read_text()
    assert "STALLED" in next(l for l in report.splitlines() if l.strip().startswith("rank 1"))
    hung = [r for r in RunDir(run_dir).read_rows() if r.get("event") == HUNG_EVENT]
    assert len(hung) == 1 and hung[0]["ranks"] == [1], hung
    assert state_from_files(run_dir) is RunState.hung
    assert RunDir(run_dir).latest_checkpoint() is not None


def _ready(run_dir):
    b = read_heartbeats(run_dir).get(1)
    return b if b and b.get("step", 0) >= 3 and RunDir(run_dir).latest_checkpoint() else None


def test_meshrun_stop_stops_every_node_with_a_checkpoint_and_resume_trains_on(tmp_path):
    run_dir, commands = _printed_nodes(tmp_path / "runs", "training.steps=400",
                                       "training.max_restarts=1", "checkpoint.keep_last=1")
    nodes = _start(commands, tmp_path)
    wait_for(lambda: _ready(run_dir), 180, "rank 1 past a checkpoint")
    assert run_status(run_dir)["state"] is RunState.running  # its live agents own it
    asked = meshrun("stop", str(run_dir), timeout=60)
    asked_at = time.monotonic()
    assert asked.returncode == 0, asked.stderr
    assert "node 0 (pid" in asked.stdout and "node 1 (pid" in asked.stdout, asked.stdout
    statuses = [n.wait(timeout=120) for n in nodes]
    print(f"both agents exited {time.monotonic() - asked_at:.1f} s after `meshrun stop`")
    outs = [(tmp_path / f"node{k}.txt").read_text() for k in (0, 1)]
    assert statuses == [130, 130], outs
    assert not any("restart" in out for out in outs), outs
    assert not RunDir(run_dir).resumes_file.exists()  # no restart leg
    assert run_status(run_dir)["state"] is RunState.stopped
    (stopped,) = [r for r in RunDir(run_dir).read_rows() if r.get("event") == "stopped"]
    latest = RunDir(run_dir).latest_checkpoint()
    assert is_complete_checkpoint(latest) and checkpoint_step(latest) == stopped["step"]
    again = meshrun("stop", str(run_dir), timeout=60)
    assert again.returncode == 2 and "has no live node agent" in again.stderr, again
    assert str(run_dir) in again.stderr and "Traceback" not in again.stderr
    end = stopped["step"] + 2
    resumed = meshrun("resume", str(run_dir), f"training.steps={end}")
    assert resumed.returncode == 0, resumed.stderr
    assert not stop_request_file(run_dir).exists()
    nodes = _start(_node_commands(resumed.stdout), tmp_path)
    assert [n.wait(timeout=300) for n in nodes] == [0, 0], (tmp_path / "node0.txt").read_text()
    assert state_from_files(run_dir) is RunState.completed
    assert max(_losses(run_dir)) == end
