"""The one place that reads the cluster kind: `backend_for(cluster)` picks the launch backend.

Each backend's module is imported only when its kind is asked for (a dry run on this machine
never imports the Slurm side's modules, nor the other way round).
"""
from __future__ import annotations

import importlib
import json
from pathlib import Path
from typing import TYPE_CHECKING

from conf.choices import ClusterKind
from conf.run_dir.paths import RunDir

if TYPE_CHECKING:
    from conf.spec import ClusterSpec
    from launcher.backends.interface import LaunchBackend

BACKENDS = {
    ClusterKind.local: ("launcher.backends.local_torchrun", "LocalBackend"),
    ClusterKind.nodes: ("launcher.backends.nodes_torchrun", "NodesBackend"),
    ClusterKind.slurm: ("launcher.backends.slurm_backend", "SlurmBackend"),
}
"""cluster.kind -> (module, class) of its LaunchBackend."""


def backend_for(cluster: ClusterSpec) -> LaunchBackend:
    """The launch backend of a resolved cluster section."""
    return _backend(cluster.kind)


def backend_of_run_dir(run_dir: Path) -> LaunchBackend | None:
    """The launch backend a run dir was made for (the cluster kind in its spec.json); None
    when spec.json does not say (damaged, or a stub that only marks a run dir)."""
    try:
        return _backend(json.loads(RunDir(run_dir).spec_file.read_text())["cluster"]["kind"])
    except (OSError, ValueError, KeyError, TypeError):
        return None


def _backend(kind: str) -> LaunchBackend:
    module, name = BACKENDS[ClusterKind(kind)]
    return getattr(importlib.import_module(module), name)()
