"""Several machines without a scheduler (cluster=nodes): one torchrun command per node, with a
c10d rendezvous on cluster.rdzv_host. meshrun prints the commands; a person (or a tool of
theirs) starts one on each node."""
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
    """One torchrun command per node (cluster=nodes): c10d rendezvous on cluster.rdzv_host."""
    c = spec.cluster
    python = c.python or sys.executable
    endpoint = f"{c.rdzv_host}:{c.rdzv_port or DEFAULT_NODES_PORT}"
    run_id = Path(run_dir).name
    return [[python, "-m", "torch.distributed.run", f"--nnodes={c.nodes}",
             f"--nproc_per_node={c.procs_per_node}", f"--node_rank={node}",
             "--rdzv_backend=c10d", f"--rdzv_endpoint={endpoint}", f"--rdzv_id={run_id}",
             "-m", "training", run_dir]
            for node in range(c.nodes)]


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
