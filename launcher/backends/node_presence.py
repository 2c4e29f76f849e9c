"""Which node agents of a cluster=nodes run are alive: each agent holds
`logs/node_agents/node<K>.lock` while it runs (flock, as launcher.lock is held; a record of its
node, host, pid and start time in it) and touches the file every AGENT_BEAT_S.

An agent is alive while its flock is held (what the kernel says on this host; on a shared file
system that passes flocks on, on every host), or, for an agent on another host whose flock may
not be visible here, while the file was touched within AGENT_STALE_S. A clean exit empties the
file; a record left in a free, stale file was left by an agent that was killed.
`meshrun stop` asks the live ones to stop (conf/run_dir/stop_request.py); `meshrun status`
says `failed`, never "running", when none is left (`nodes_owner_state`).
"""
from __future__ import annotations

import contextlib
import json
import os
import socket
import threading
import time
from dataclasses import dataclass
from pathlib import Path

from conf.errors import ConfigError, Problem
from conf.run_dir.paths import RunDir
from conf.run_dir.run_states import RunState, state_from_files
from launcher.backends.run_lock import flock_holder, release_flock, try_flock, write_lock_record

AGENTS_DIR = "node_agents"
AGENT_BEAT_S = 5.0
"""How often a live agent touches its lock file."""
AGENT_STALE_S = 30.0
"""An agent on another host whose lock file was not touched for this long is gone."""


def agent_lock_file(run_dir: Path, node: int) -> Path:
    return RunDir(run_dir).logs_dir / AGENTS_DIR / f"node{node}.lock"


@dataclass(frozen=True)
class AgentSeen:
    node: int
    alive: bool
    record: dict
    """Its lock record ({}: never started, or ended cleanly)."""

    def describe(self) -> str:
        r = self.record
        return f"node {self.node} (pid {r.get('pid', '?')} on {r.get('host', '?')})"


@contextlib.contextmanager
def agent_presence(run_dir: Path, node: int):
    """Hold node `node`'s agent lock while the agent runs; yields its record, and `since_ns`:
    the lock file's mtime once written (when this agent started, on the file system's clock).
    ConfigError when another live agent of that node holds it."""
    path = agent_lock_file(run_dir, node)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, holder = try_flock(path)
    if fd is None:
        holder = holder or {}
        raise ConfigError([Problem(
            "--node-rank", str(node),
            f"node {node}'s agent is already running (pid {holder.get('pid', '?')} on "
            f"{holder.get('host', '?')}, holding {path})", "start one agent per node; stop "
            f"the run with `meshrun stop {run_dir}`")], "Cannot start the node agent") from None
    record = write_lock_record(fd, node=node)
    since_ns = os.fstat(fd).st_mtime_ns
    done = threading.Event()
    beat = threading.Thread(target=_touch_until, args=(path, done), daemon=True)
    beat.start()
    try:
        yield {**record, "since_ns": since_ns}
    finally:
        done.set()
        release_flock(fd)  # a clean end: nobody to stop, nothing was killed


def _touch_until(path: Path, done: threading.Event) -> None:
    while not done.wait(AGENT_BEAT_S):
        with contextlib.suppress(OSError):
            os.utime(path)


def agents_seen(run_dir: Path, nodes: int) -> list[AgentSeen]:
    """Every node's agent as its lock file shows it (nodes without a file are left out)."""
    seen = []
    for node in range(nodes):
        path = agent_lock_file(run_dir, node)
        if path.is_file():
            seen.append(_seen(node, path))
    return seen


def _seen(node: int, path: Path) -> AgentSeen:
    holder = flock_holder(path)
    try:
        text, touched = path.read_text(), path.stat().st_mtime
    except OSError:
        return AgentSeen(node=node, alive=holder is not None, record=holder or {})
    record = holder or _parse(text)
    if holder is not None:
        return AgentSeen(node=node, alive=True, record=record)
    elsewhere = bool(record) and record.get("host") != socket.gethostname()
    fresh = time.time() - touched < AGENT_STALE_S
    return AgentSeen(node=node, alive=elsewhere and fresh, record=record)


def _parse(text: str) -> dict:
    try:
        record = json.loads(text) if text.strip() else {}
    except ValueError:
        return {}
    return record if isinstance(record, dict) else {}


def nodes_owner_state(run_dir: Path, nodes: int) -> dict:
    """{} while a node agent is alive (or the files say how the run ended, or no agent ever
    ran here); else `failed` and a note naming the agents that are gone."""
    if state_from_files(run_dir) is not RunState.running:
        return {}
    seen = agents_seen(run_dir, nodes)
    if not seen or any(a.alive for a in seen):
        return {}
    killed = [a.describe() for a in seen if a.record]
    how = (f"its node agents ({', '.join(killed)}) are gone without ending it (killed?)"
           if killed else "its node agents ended without it saying how")
    return {"state": RunState.failed,
            "owner_note": f"no live process owns this run: {how}; their torchruns and ranks "
                          "die with them"}


def no_live_agent(run_dir: Path, nodes: int) -> ConfigError:
    """`meshrun stop` of a cluster=nodes run none of whose agents is alive."""
    folder = RunDir(run_dir).logs_dir / AGENTS_DIR
    return ConfigError([Problem(
        "run_dir", str(run_dir),
        f"has no live node agent (none of {nodes} holds its lock in {folder}, nor touched it "
        f"within {AGENT_STALE_S:.0f} s): it is not running",
        f"nothing to stop; `meshrun status {run_dir}` says how it ended, `meshrun resume "
        f"{run_dir}` continues it")], "Cannot stop")
