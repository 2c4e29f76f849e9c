"""Several machines without a scheduler (cluster=nodes): one node agent command per node
(launcher/node_agent.py: it runs that node's torchrun, with a c10d rendezvous on
cluster.rdzv_host, under a hang watchdog and training.max_restarts). meshrun prints the
commands; a person (or a tool of theirs) starts one on each node. `meshrun stop` asks the
live agents to stop through the shared run dir (conf/run_dir/stop_request.py)."""
from __future__ import annotations

import json
import os
import socket
import sys
from pathlib import Path

from rich.console import Console

from conf.run_dir.paths import RunDir
from conf.run_dir.stop_request import clear_stop_request, request_stop
from conf.spec import RunSpec
from launcher.backends.interface import LaunchBackend
from launcher.backends.local_torchrun import RUN_DIR_PLACEHOLDER, print_rank_commands
from launcher.backends.node_presence import agents_seen, no_live_agent, nodes_owner_state

DEFAULT_NODES_PORT = 29500


def node_commands(spec: RunSpec, run_dir: str) -> list[list[str]]:
    """One node agent command per node (cluster=nodes), the commands a person starts."""
    python = spec.cluster.python or sys.executable
    return [[python, "-m", "launcher.node_agent", run_dir, f"--node-rank={node}"]
            for node in range(spec.cluster.nodes)]


def node_torchrun_command(spec: RunSpec, run_dir: str, *, node: int, leg: int) -> list[str]:
    """Node `node`'s torchrun for leg `leg` of the run (its node agent starts it): c10d
    rendezvous on cluster.rdzv_host, one rendezvous id per leg, so that every node's torchrun
    of a restart leg meets the others of that leg and no earlier one."""
    c = spec.cluster
    endpoint = f"{c.rdzv_host}:{c.rdzv_port or DEFAULT_NODES_PORT}"
    return [sys.executable, "-m", "torch.distributed.run", f"--nnodes={c.nodes}",
            f"--nproc_per_node={c.procs_per_node}", f"--node_rank={node}",
            "--rdzv_backend=c10d", f"--rdzv_endpoint={endpoint}",
            f"--rdzv_id={Path(run_dir).name}-leg{leg}", "-m", "training", run_dir]


class NodesBackend(LaunchBackend):
    """cluster=nodes: launching prints each node's torchrun command; nothing is started here."""

    kind = "nodes"
    where = "on other nodes"
    on_this_machine = False
    detached = True
    sweepable = False

    def launch_command(self, spec: RunSpec) -> list[str]:
        return node_commands(spec, RUN_DIR_PLACEHOLDER)[0]

    def render(self, spec: RunSpec, run_dir: Path, command: list[str], console: Console) -> None:
        print_rank_commands(node_commands(spec, str(run_dir)), run_dir, console,
                            title="launch command per node:")

    def rank_commands(self, spec: RunSpec, run_dir: str) -> list[list[str]]:
        return node_commands(spec, run_dir)

    def launch(self, spec: RunSpec, run_dir: Path, *, console: Console, show_progress: bool,
               wait: bool = False, preflight_only: bool = False, lock=None,
               warm=None) -> None:
        self.render(spec, run_dir, [], console)
        console.print("start each command on its node (node_rank 0 on cluster.rdzv_host)",
                      markup=False)
        return None

    def resume(self, spec: RunSpec, run_dir: Path, **options) -> None:
        clear_stop_request(run_dir)  # the last leg's, already honoured
        return self.launch(spec, run_dir, **options)

    def stop(self, run_dir: Path) -> str:
        """Ask every live node agent to stop (a request in the run dir each polls): each sends
        its torchrun SIGTERM, the ranks checkpoint and stop, the agents exit 130."""
        nodes = _nodes_of(run_dir)
        seen = agents_seen(run_dir, nodes)
        alive = [a for a in seen if a.alive]
        if not alive:
            raise no_live_agent(run_dir, nodes)
        request_stop(run_dir, [a.record for a in alive],
                     by={"host": socket.gethostname(), "pid": os.getpid()})
        said = (f"asked the node agents of {', '.join(a.describe() for a in alive)} to stop "
                f"{run_dir} (each SIGTERMs its torchrun; the ranks checkpoint first)")
        gone = [n for n in range(nodes) if n not in {a.node for a in alive}]
        if gone:
            said += f"; no live agent on node(s) {', '.join(map(str, gone))}"
        return said

    def state(self, run_dir: Path, *, scheduler: dict | None = None) -> dict:
        """`failed`, not "running", when none of the run's node agents is alive."""
        return nodes_owner_state(run_dir, _nodes_of(run_dir))


def _nodes_of(run_dir: Path) -> int:
    """cluster.nodes from spec.json (0 when it does not say: no agent is looked for)."""
    try:
        return int(json.loads(RunDir(run_dir).spec_file.read_text())["cluster"]["nodes"])
    except (OSError, ValueError, KeyError, TypeError):
        return 0
