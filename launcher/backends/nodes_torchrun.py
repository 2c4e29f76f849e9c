"""Several machines without a scheduler (cluster=nodes): one node agent command per node
(launcher/node_agent.py: it runs that node's torchrun, with a c10d rendezvous on
cluster.rdzv_host, under a hang watchdog and training.max_restarts). meshrun prints the
commands; a person (or a tool of theirs) starts one on each node."""
from __future__ import annotations

import sys
from pathlib import Path

from rich.console import Console

from conf.errors import ConfigError, Problem
from conf.spec import RunSpec
from launcher.backends.interface import LaunchBackend
from launcher.backends.local_torchrun import RUN_DIR_PLACEHOLDER, print_rank_commands

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

    def stop(self, run_dir: Path) -> str:
        raise ConfigError([Problem("run_dir", str(run_dir),
                                   "runs on nodes whose torchrun commands were started by hand",
                                   "stop the torchrun on each node (Ctrl-C, or SIGTERM: the "
                                   "ranks checkpoint first)")], "Cannot stop")
