"""cluster=nodes: which node agents are alive (launcher/backends/node_presence.py, real flocks
held by real processes), `meshrun stop`'s request naming them (conf/run_dir/stop_request.py),
and `meshrun status` never saying "running" once every agent is gone. The agents themselves
stopping their torchrun: tests/distributed/test_node_agents.py."""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from conf.errors import ConfigError
from conf.run_dir.paths import RunDir
from conf.run_dir.run_states import RunState
from conf.run_dir.stop_request import read_stop_request, stop_asked_of
from launcher.backends.node_presence import (AGENT_STALE_S, agent_lock_file, agent_presence,
                                             agents_seen)
from launcher.backends.nodes_torchrun import NodesBackend
from tests.support.specs import cpu_spec

REPO = Path(__file__).resolve().parents[2]
AGENT = """
import sys, time
from pathlib import Path
from launcher.backends.node_presence import agent_presence
with agent_presence(Path(sys.argv[1]), int(sys.argv[2])) as me:
    print("present", flush=True)
    time.sleep(120)
"""


@pytest.fixture
def run_dir(tmp_path) -> Path:
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    RunDir(run_dir).write_spec(cpu_spec("model=tiny", "data=synthetic", "cluster=nodes",
                                        "cluster.nodes=2", "cluster.procs_per_node=1",
                                        "cluster.gpus_per_node=0", "cluster.rdzv_host=10.0.0.1"))
    RunDir(run_dir).logs_dir.mkdir(exist_ok=True)
    RunDir(run_dir).rank_log(0).write_text("rank 0/2 started\n")  # the files say running
    return run_dir


def _agent(run_dir: Path, node: int) -> subprocess.Popen:
    proc = subprocess.Popen([sys.executable, "-c", AGENT, str(run_dir), str(node)], cwd=REPO,
                            stdout=subprocess.PIPE, text=True)
    assert proc.stdout.readline().strip() == "present"
    return proc


def _kill(proc: subprocess.Popen) -> None:
    proc.kill()
    proc.wait()


def test_one_agent_per_node_and_a_clean_end_leaves_no_record(run_dir):
    with agent_presence(run_dir, 0) as me:
        assert me["node"] == 0 and me["pid"] == os.getpid()
        with pytest.raises(ConfigError, match="node 0's agent is already running"):
            with agent_presence(run_dir, 0):
                pass
        (seen,) = agents_seen(run_dir, 2)
        assert seen.alive and seen.record == {k: v for k, v in me.items() if k != "since_ns"}
        assert me["since_ns"] == agent_lock_file(run_dir, 0).stat().st_mtime_ns
        assert NodesBackend().state(run_dir) == {}  # a live agent owns it
    (seen,) = agents_seen(run_dir, 2)
    assert not seen.alive and seen.record == {}


def test_stop_names_the_live_agents_and_only_they_honour_it(run_dir):
    with pytest.raises(ConfigError, match="has no live node agent") as refused:
        NodesBackend().stop(run_dir)
    assert str(run_dir) in str(refused.value) and "meshrun status" in str(refused.value)
    node0, node1 = _agent(run_dir, 0), _agent(run_dir, 1)
    try:
        _kill(node1)
        said = NodesBackend().stop(run_dir)
        assert f"node 0 (pid {node0.pid} " in said and "no live agent on node(s) 1" in said
        named = read_stop_request(run_dir)["agents"]
        assert [a["pid"] for a in named] == [node0.pid]
        record = json.loads(agent_lock_file(run_dir, 0).read_text())
        assert stop_asked_of(run_dir, record)
        assert not stop_asked_of(run_dir, {**record, "pid": node0.pid + 1})  # a later agent
        assert NodesBackend().stop(run_dir) == said  # twice: harmless, the same request
    finally:
        _kill(node0)
    with pytest.raises(ConfigError, match="has no live node agent"):
        NodesBackend().stop(run_dir)


def test_status_says_failed_once_every_agent_was_killed(run_dir):
    node0, node1 = _agent(run_dir, 0), _agent(run_dir, 1)
    _kill(node0)
    assert NodesBackend().state(run_dir) == {}  # node 1's agent still owns it
    _kill(node1)
    state = NodesBackend().state(run_dir)
    assert state["state"] is RunState.failed, state
    assert f"pid {node0.pid}" in state["owner_note"] and f"pid {node1.pid}" in state["owner_note"]


def test_an_agent_on_another_host_is_alive_while_it_touches_its_file(run_dir):
    path = agent_lock_file(run_dir, 1)
    path.parent.mkdir(parents=True)
    path.write_text(json.dumps({"node": 1, "host": "elsewhere", "pid": 7, "started": "t"}))
    (seen,) = agents_seen(run_dir, 2)
    assert seen.alive and NodesBackend().state(run_dir) == {}
    old = time.time() - AGENT_STALE_S - 1
    os.utime(path, (old, old))
    (seen,) = agents_seen(run_dir, 2)
    assert not seen.alive
    assert NodesBackend().state(run_dir)["state"] is RunState.failed
