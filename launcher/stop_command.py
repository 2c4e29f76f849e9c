"""`meshrun stop RUN_DIR`: ask a run to stop, its ranks checkpointing first, through the launch
backend it was made for (LaunchBackend.stop): SIGTERM to the local launcher holding its lock,
scancel/signal for Slurm, a stop request the node agents of cluster=nodes read. It says what
it did; a run nothing can stop (not a run dir, not running) is bad input: exit 2."""
from __future__ import annotations

from pathlib import Path

from conf.errors import ConfigError, Problem
from conf.run_dir.paths import RunDir
from launcher.backends.choose import backend_of_run_dir


def register(sub) -> None:
    """Add the `stop` subcommand to the `meshrun` subparsers."""
    stop = sub.add_parser("stop", help="stop a run after its current step, with a checkpoint "
                          "(`meshrun resume` continues it)")
    stop.add_argument("run_dir", type=Path)
    stop.set_defaults(handler=stop_command)


def stop_command(args, console) -> int:
    console.print(stop_run(args.run_dir), markup=False, highlight=False, soft_wrap=True)
    return 0


def stop_run(run_dir: Path) -> str:
    backend = backend_of_run_dir(run_dir) if RunDir(run_dir).is_run_dir else None
    if backend is None:
        raise ConfigError([Problem("run_dir", str(run_dir),
                                   "is not a meshrun run dir (no readable spec.json)",
                                   "pass a folder made by `meshrun run`")], "Cannot stop")
    return backend.stop(run_dir.resolve())
