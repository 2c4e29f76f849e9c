"""The one launch interface: what every place a run can go (this machine, several nodes, Slurm)
does for `meshrun run`, `resume`, `status`, the dry run and sweeps.

A backend is one class per cluster kind (local_torchrun.LocalBackend, nodes_torchrun.NodesBackend,
slurm_backend.SlurmBackend); `launcher.backends.choose.backend_for` picks it from the spec's
cluster section, and is the only code that reads `cluster.kind`. Callers ask a backend what it
can do (its class attributes) instead of comparing the kind. Like submitit's executors and
NeMo-Run's, a backend renders what it would launch (the dry run) and launches it; unlike them it
also says where a run stands (`state`) and stops it (`stop`), from the run dir alone.
"""
from __future__ import annotations

from abc import ABC, abstractmethod
from pathlib import Path
from typing import TYPE_CHECKING, ClassVar

if TYPE_CHECKING:
    from rich.console import Console

    from conf.spec import RunSpec
    from launcher.backends.run_lock import RunLock
    from launcher.backends.warm_torchrun import WarmTorchrun


class LaunchBackend(ABC):
    """Launches a run dir somewhere; every method takes the resolved spec or the run dir."""

    kind: ClassVar[str]
    """The cluster kind it serves (`cluster.kind`), as a sweep's points.json records it."""
    where: ClassVar[str]
    """Where its runs go, in a sentence: "on this machine", "on Slurm"."""
    on_this_machine: ClassVar[bool]
    """The ranks run on this machine: a warm torchrun agent is kept, its GPUs are the ones."""
    detached: ClassVar[bool]
    """`launch` returns once a scheduler holds the job (sweeps submit these points first)."""
    sweepable: ClassVar[bool]
    """Sweeps may run points on it."""

    @abstractmethod
    def launch_command(self, spec: RunSpec) -> list[str]:
        """The command a run dir records (command.txt); "<run_dir>" stands for its path."""

    @abstractmethod
    def render(self, spec: RunSpec, run_dir: Path, command: list[str], console: Console) -> None:
        """Print what `launch` would start for `run_dir` (the dry run's launch section)."""

    def rank_commands(self, spec: RunSpec, run_dir: str) -> list[list[str]] | None:
        """The commands a person may run to start the ranks themselves, one per node; None
        when a scheduler starts them."""
        return None

    @abstractmethod
    def launch(self, spec: RunSpec, run_dir: Path, *, console: Console, show_progress: bool,
               wait: bool = False, preflight_only: bool = False, lock: RunLock | None = None,
               warm: WarmTorchrun | None = None) -> int | None:
        """Start the run in `run_dir` (spec.json written, its lock `lock` held). Returns the
        exit status of a run followed to its end, or None when it was only started (submitted,
        or commands printed) and nothing is followed here."""

    def resume(self, spec: RunSpec, run_dir: Path, **options) -> int | None:
        """Continue `run_dir` from its newest checkpoint (the ranks find it): launch it again."""
        return self.launch(spec, run_dir, **options)

    def state(self, run_dir: Path, *, scheduler: dict | None = None) -> dict:
        """What the scheduler adds to the run dir's own status (`meshrun status`): job id,
        state, elapsed time, ...; `scheduler`: job states already asked for many runs."""
        return {}

    def describe_points(self, specs: list[RunSpec], *, array_parallelism: int) -> list[str]:
        """Lines a sweep's preview prints about how its points on this backend go (e.g. as
        which job arrays); none by default."""
        return []

    @abstractmethod
    def stop(self, run_dir: Path) -> str:
        """Ask the run to stop (its ranks checkpoint first); say what was done. ConfigError
        when it cannot be stopped from here."""
