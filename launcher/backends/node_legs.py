"""How the node agents of a cluster=nodes run agree on each leg's end, through small files in
the shared run dir (logs/node_legs/leg<N>/), each written atomically (a temporary file, then
renamed):

- `node<K>.json`, written by node K's agent when its torchrun of leg N ended: its exit status,
  whether the agent stopped it (a peer's failure, a hang) or it ended by itself, and the cause
  its own torchrun log names. A failed node's file tells every other agent to stop its node.
- `decision.json`, written by node 0's agent once every node's file is there (or a timeout
  passed): `{"restart": bool, "status": N}`; every agent then starts leg N+1 or exits N.
- `hang.claim`, created exclusively by the first agent whose watchdog fires: that agent writes
  the hang report and the `hung` event, once; the others only stop their node.

An agent reads only files written since it started (`since_ns`: its lock file's mtime, the same
file system's clock): node 0's agent removes an earlier launch's files when it starts, but
another node's agent may start first and must not take that launch's ends for this one's.
"""
from __future__ import annotations

import json
import os
import shutil
import time
from dataclasses import asdict, dataclass
from pathlib import Path

from conf.run_dir.paths import RunDir
from conf.run_dir.restart_legs import Failure, reached_step

LEGS_DIR = "node_legs"
DECISION_FILE = "decision.json"
HANG_CLAIM = "hang.claim"
INTERRUPTED = 130
STOPPED_ON_PURPOSE = ("interrupt", "stop")
"""NodeEnd.stopped of a node stopped gently (exit INTERRUPTED): Ctrl-C / SIGTERM to its
agent; `meshrun stop`, or a peer node stopped so."""
HUNG_STATUS = 3
"""A leg the watchdog stopped (launcher.watchdog.HUNG_EXIT, the local launcher's)."""


@dataclass(frozen=True)
class NodeEnd:
    """How one node's torchrun of a leg ended."""

    node: int
    status: int
    stopped: str | None
    """Why the agent stopped it ("peer", "hang", "interrupt", "stop"), None: it ended by
    itself."""
    cause: str
    time: float


@dataclass(frozen=True)
class Decision:
    restart: bool
    status: int


class NodeLegs:
    """The leg files of one run dir."""

    def __init__(self, run_dir: Path, nodes: int, *, since_ns: int = 0):
        self.run_dir, self.nodes, self.since_ns = Path(run_dir), nodes, since_ns
        self.root = RunDir(run_dir).logs_dir / LEGS_DIR

    def forget(self) -> None:
        """Node 0's agent at its start: an earlier launch's leg files say nothing of this one."""
        shutil.rmtree(self.root, ignore_errors=True)

    def leg_dir(self, leg: int) -> Path:
        return self.root / f"leg{leg}"

    def record_end(self, leg: int, end: NodeEnd) -> None:
        _write_atomic(self.leg_dir(leg) / f"node{end.node}.json", asdict(end))

    def ends(self, leg: int) -> list[NodeEnd]:
        found = []
        for node in range(self.nodes):
            data = self._read(self.leg_dir(leg) / f"node{node}.json")
            if data is not None:
                found.append(NodeEnd(**data))
        return found

    def peer_failed(self, leg: int, node: int) -> bool:
        """Another node's torchrun of `leg` ended with a failure: stop this node's."""
        return any(e.node != node and e.status != 0 for e in self.ends(leg))

    def peer_stopped(self, leg: int, node: int) -> bool:
        """Another node's torchrun of `leg` was stopped on purpose: stop this node's gently
        (its ranks checkpoint), not as after a failure."""
        return any(e.node != node and e.status == INTERRUPTED for e in self.ends(leg))

    def wait_ends(self, leg: int, timeout_s: float) -> list[NodeEnd]:
        deadline = time.monotonic() + timeout_s
        while len(ends := self.ends(leg)) < self.nodes and time.monotonic() < deadline:
            time.sleep(0.5)
        return ends

    def decide(self, leg: int, decision: Decision) -> None:
        _write_atomic(self.leg_dir(leg) / DECISION_FILE, asdict(decision))

    def wait_decision(self, leg: int, timeout_s: float) -> Decision | None:
        deadline = time.monotonic() + timeout_s
        while (data := self._read(self.leg_dir(leg) / DECISION_FILE)) is None:
            if time.monotonic() > deadline:
                return None
            time.sleep(0.5)
        return Decision(**data)

    def _read(self, path: Path) -> dict | None:
        """The file's data when it was written since this agent started, else None."""
        try:
            if path.stat().st_mtime_ns < self.since_ns:
                return None
        except OSError:
            return None
        return _read(path)

    def claim_hang(self, leg: int) -> bool:
        """True for the first agent to ask (O_EXCL create), False for every later one."""
        self.leg_dir(leg).mkdir(parents=True, exist_ok=True)
        try:
            os.close(os.open(self.leg_dir(leg) / HANG_CLAIM, os.O_CREAT | os.O_EXCL | os.O_WRONLY))
        except FileExistsError:
            return False
        return True


def leg_status(ends: list[NodeEnd]) -> int:
    """The leg's exit status from every node's end: 0 when all finished; an interrupt, then a
    hang, wins; else the status of the node that failed first by itself."""
    statuses = {e.status for e in ends}
    if statuses <= {0}:
        return 0
    for special in (INTERRUPTED, HUNG_STATUS):
        if special in statuses:
            return special
    return _first_failed(ends).status


def leg_failure(run_dir: Path, ends: list[NodeEnd]) -> Failure:
    """The failed leg as the restart rules see it (conf/run_dir/restart_legs.py): the step the
    run reached and the cause the failed node's torchrun named (a hang: "exit status 3", as
    locally)."""
    status = leg_status(ends)
    first = _first_failed(ends)
    cause = first.cause if status == first.status and status != HUNG_STATUS else f"exit status {status}"
    return Failure(step=reached_step(run_dir), cause=cause)


def _first_failed(ends: list[NodeEnd]) -> NodeEnd:
    failed = [e for e in ends if e.status != 0]
    own = [e for e in failed if e.stopped is None] or failed
    return min(own, key=lambda e: e.time)


def _write_atomic(path: Path, data: dict) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    tmp.write_text(json.dumps(data))
    os.replace(tmp, path)


def _read(path: Path) -> dict | None:
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return None
