"""The node agent of cluster=nodes: `python -m launcher.node_agent RUN_DIR --node-rank=K`, the
command meshrun prints for each node (the run dir on a shared filesystem). Torch-free.

On its node it does what the local launcher does on one machine:
- runs the node's torchrun (launcher/backends/nodes_torchrun.py), its ranks dying with it
  (launcher/backends/process_lifetime.py), logging to logs/torchrun.log (node 0) or
  logs/torchrun.node<K>.log;
- watches every rank's heartbeat in the shared run dir (conf/run_dir/hang_watch.py): each
  agent sees the same stalled rank and stops its own node, so the whole run stops; the first
  to fire writes the hang report and the `hung` event, once (launcher/backends/node_legs.py);
- training.max_restarts without torchrun's --max-restarts (which hung re-forming the gloo group
  across nodes): each leg has its own rendezvous id; when a node's torchrun fails, every agent
  stops its own; node 0's agent decides with the local loop's rules (restart_loop.py) and
  writes the decision; every agent starts the next leg or exits with the leg's status;
- holds logs/node_agents/node<K>.lock while it runs (launcher/backends/node_presence.py) and
  polls the run dir for a `meshrun stop` request naming it (conf/run_dir/stop_request.py):
  then, as on Ctrl-C, SIGTERM to its torchrun (the ranks checkpoint first), no restart leg,
  exit 130, the run `stopped` as a local run stopped so.
"""
from __future__ import annotations

import argparse
import signal
import subprocess
import sys
import time
from pathlib import Path

from conf.errors import ConfigError
from conf.run_dir.hang_watch import STACK_WAIT_S, HangWatchdog
from conf.run_dir.paths import RunDir
from conf.run_dir.restart_legs import failure_of
from conf.run_dir.stop_request import stop_asked_of
from conf.spec import RunSpec
from launcher.backends.local_torchrun import rank_environment
from launcher.backends.node_legs import (HUNG_STATUS, INTERRUPTED, STOPPED_ON_PURPOSE,
                                         Decision, NodeEnd, NodeLegs, leg_failure, leg_status)
from launcher.backends.node_presence import agent_presence
from launcher.backends.nodes_torchrun import node_torchrun_command
from launcher.backends.process_lifetime import kill_tree, parent_death_preexec
from launcher.backends.restart_loop import ENDED_ON_PURPOSE, restart_decided
from launcher.watchdog import clear_heartbeats, hung_exit

POLL_S = 0.5
ENDS_WAIT_S = 60.0
"""How long node 0's agent waits for every node's end of a leg before deciding without it."""
DECISION_WAIT_S = ENDS_WAIT_S + 120.0
TERM_GRACE_S = 60.0
"""After SIGTERM (the ranks checkpoint and stop), how long before the node is killed."""


class NodeHangWatchdog(HangWatchdog):
    """A HangWatchdog of one node's agent: the first agent to fire reports the hang; the
    others give it time to collect the stacks, then stop their node."""

    def __init__(self, run_dir: Path, *, legs: NodeLegs, leg: int, **kwargs):
        super().__init__(run_dir, **kwargs)
        self.legs, self.leg, self.claimed = legs, leg, False

    def fire(self, stalled: list[int]) -> None:
        self.claimed = self.legs.claim_hang(self.leg)
        if self.claimed:
            super().fire(stalled)
            return
        self.report = "hang: named by another node's agent (logs/hang_report.txt)"
        time.sleep(STACK_WAIT_S + 1.0)
        self.stop_all()


def node_log(run_dir: Path, node: int) -> Path:
    rd = RunDir(run_dir)
    return rd.torchrun_log if node == 0 else rd.logs_dir / f"torchrun.node{node}.log"


def run_leg(spec: RunSpec, run_dir: Path, node: int, legs: NodeLegs, leg: int,
            stop_asked) -> NodeEnd:
    """Run this node's torchrun of `leg` to its end (or stop it: a peer failed, a hang, an
    interrupt, a stop request: `stop_asked()`); record and return how it ended."""
    log_path = node_log(run_dir, node)
    log_from = log_path.stat().st_size if log_path.exists() else 0
    stopped: list[str] = []
    with open(log_path, "ab") as log:
        proc = subprocess.Popen(node_torchrun_command(spec, str(run_dir), node=node, leg=leg),
                                stdout=log, stderr=subprocess.STDOUT,
                                env=rank_environment(spec), start_new_session=True,
                                preexec_fn=parent_death_preexec())

        def stop(why: str, *, kill: bool = True) -> None:
            if not stopped:
                stopped.append(why)
                if kill:
                    kill_tree(proc.pid)

        c = spec.cluster
        with NodeHangWatchdog(run_dir, legs=legs, leg=leg, world_size=c.nodes * c.procs_per_node,
                              setting=spec.training.hang_timeout_s,
                              stop_all=lambda: stop("hang")) as watchdog:
            _follow(proc, legs, leg, node, stop, stop_asked)
    if watchdog.claimed:
        hung_exit(watchdog)
    elif watchdog.report:
        sys.stderr.write(f"{watchdog.report}\n")
    status = _status(proc.returncode, stopped[0] if stopped else None)
    cause = (failure_of(run_dir, status, torchrun_log_from=log_from, log=log_path).cause
             if not stopped else f"stopped ({stopped[0]})")
    end = NodeEnd(node=node, status=status, stopped=stopped[0] if stopped else None,
                  cause=cause, time=time.time())
    legs.record_end(leg, end)
    return end


def _follow(proc: subprocess.Popen, legs: NodeLegs, leg: int, node: int, stop,
            stop_asked) -> None:
    """Wait for torchrun; stop it gently when asked to (or another node's was), at once when
    another node's torchrun of this leg failed."""
    try:
        while proc.poll() is None:
            if stop_asked() or legs.peer_stopped(leg, node):
                stop_gently(proc, stop, why="stop")
            elif legs.peer_failed(leg, node):
                stop("peer")
            try:
                proc.wait(timeout=POLL_S)
            except subprocess.TimeoutExpired:
                pass
    except KeyboardInterrupt:
        stop_gently(proc, stop)


def stop_gently(proc: subprocess.Popen, stop, *, why: str = "interrupt") -> None:
    """Ctrl-C / SIGTERM to the agent, or a stop request: SIGTERM to torchrun (its ranks
    checkpoint and stop), then the whole tree after TERM_GRACE_S."""
    proc.terminate()
    try:
        proc.wait(timeout=TERM_GRACE_S)
    except subprocess.TimeoutExpired:
        pass
    stop(why, kill=proc.poll() is None)
    proc.wait()


def _status(returncode: int, stopped: str | None) -> int:
    if stopped == "hang":
        return HUNG_STATUS
    if stopped in STOPPED_ON_PURPOSE:
        return INTERRUPTED
    return 128 - returncode if returncode < 0 else returncode


def decide_leg(run_dir: Path, legs: NodeLegs, leg: int, *, max_restarts: int) -> Decision:
    """Node 0's agent: once every node's end of `leg` is known, restart or stop (the local
    loop's rules and lines), and write the decision for the other agents."""
    ends = legs.wait_ends(leg, ENDS_WAIT_S)
    status = leg_status(ends) if ends else 1
    restart = (status not in ENDED_ON_PURPOSE and max_restarts > 0 and bool(ends)
               and restart_decided(run_dir, leg_failure(run_dir, ends),
                                   max_restarts=max_restarts))
    if restart:
        clear_heartbeats(run_dir)  # before any node starts the next leg
    decision = Decision(restart=restart, status=status)
    legs.decide(leg, decision)
    return decision


def run_node(run_dir: Path, node: int) -> int:
    with agent_presence(run_dir, node) as me:
        return _run_legs(run_dir, node, since_ns=me["since_ns"],
                         stop_asked=lambda: stop_asked_of(run_dir, me))


def _run_legs(run_dir: Path, node: int, *, since_ns: int, stop_asked) -> int:
    spec = RunDir(run_dir).read_spec()
    legs = NodeLegs(run_dir, spec.cluster.nodes, since_ns=since_ns)
    if node == 0:
        legs.forget()
        clear_heartbeats(run_dir)  # no rank starts before node 0's torchrun joins
    leg = 0
    while True:
        end = run_leg(spec, run_dir, node, legs, leg, stop_asked)
        if end.status == INTERRUPTED:  # stopped on purpose: no restart, whatever the others
            if node == 0:
                legs.decide(leg, Decision(restart=False, status=INTERRUPTED))
            return INTERRUPTED
        if node == 0:
            decision = decide_leg(run_dir, legs, leg,
                                  max_restarts=spec.training.max_restarts)
        else:
            decision = legs.wait_decision(leg, DECISION_WAIT_S)
        if decision is None:
            sys.stderr.write(f"node {node}: no decision from node 0's agent within "
                             f"{DECISION_WAIT_S:.0f} s after leg {leg}; stopping\n")
            return end.status or 1
        if not decision.restart:
            return decision.status
        if stop_asked():  # asked between legs: no next leg
            return INTERRUPTED
        leg += 1


def _interrupt(signum: int, frame) -> None:
    raise KeyboardInterrupt


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m launcher.node_agent",
                                     description="run one node of a cluster=nodes run")
    parser.add_argument("run_dir", type=Path)
    parser.add_argument("--node-rank", type=int, required=True)
    args = parser.parse_args(argv)
    for sig in (signal.SIGTERM, signal.SIGHUP):
        signal.signal(sig, _interrupt)
    try:
        return run_node(args.run_dir.resolve(), args.node_rank)
    except ConfigError as err:  # another agent of this node runs: one message, exit 2
        sys.stderr.write(f"{err}\n")
        return 2
    except KeyboardInterrupt:  # between legs (a leg's own interrupt stops its torchrun)
        return INTERRUPTED


if __name__ == "__main__":
    sys.exit(main())
