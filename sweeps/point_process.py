"""One point of a local sweep, in a process of its own that dies with the sweep's runner.

    python -m sweeps.point_process {launch|resume|restart} <run_dir>

The runner (sweeps.run_local) starts it with PR_SET_PDEATHSIG=SIGTERM
(launcher.backends.process_lifetime.parent_death_preexec), so the chain of lifetimes is
runner -> point process -> torchrun -> ranks, each link a parent-death signal:

- the runner dies (even SIGKILL): the kernel sends the point process SIGTERM; it acts as Ctrl-C
  (launcher.backends.local_torchrun): torchrun is told to stop, the ranks finish their step,
  save a checkpoint and exit; the point process then exits 130;
- the point process dies too (SIGKILL): torchrun gets SIGTERM from its own parent-death signal
  and stops the ranks the same way; a rank whose torchrun is gone is SIGKILLed.

The point holds its run dir's lock (launcher.backends.run_lock) from before torchrun starts
until the last of these processes has exited: that is how `meshrun sweep status` knows a point
is alive, whoever its runner was.

How a point starts:
- `launch`: a fresh run dir, as `meshrun run` would;
- `resume`: its newest complete checkpoint, in the same run dir (`meshrun resume`);
- `restart`: an interrupted point that left no complete checkpoint starts over in the same run
  dir: a resume marker at step 0 in metrics.jsonl supersedes the rows of the lost attempt, so
  each step is in the run's history once (conf.run_dir.metrics_rows) and no second run dir is
  made for the point.
"""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from rich.console import Console

LAUNCH, RESUME, RESTART = "launch", "resume", "restart"
MODES = (LAUNCH, RESUME, RESTART)
INTERRUPTED = 130


def start_point_process(mode: str, run_dir: Path, *, env: dict[str, str],
                        log_path: Path) -> subprocess.Popen:
    """Start `python -m sweeps.point_process MODE RUN_DIR`, output appended to `log_path`,
    dying with this process (must be called from the main thread: the parent-death signal
    fires when the creating thread ends). In a session of its own, as torchrun is: a
    terminal's Ctrl-C reaches the runner only, which asks each point to stop once."""
    from launcher.backends.process_lifetime import parent_death_preexec

    with open(log_path, "ab") as log:
        return subprocess.Popen([sys.executable, "-m", "sweeps.point_process", mode, str(run_dir)],
                                stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
                                env={**os.environ, **env, "PYTHONUNBUFFERED": "1"},
                                start_new_session=True,
                                preexec_fn=parent_death_preexec(signal.SIGTERM))


def run_point(mode: str, run_dir: Path, *, console: Console, show_progress: bool,
              warm=None) -> int:
    """Launch, resume or restart the point in `run_dir` here, to its end; its exit status.
    `warm`: a torchrun agent already started (launcher.backends.warm_torchrun) that the point's
    torchrun becomes; discarded when the point does not launch on this machine."""
    from conf.run_dir.paths import RunDir
    from launcher.backends.choose import backend_for
    from launcher.backends.warm_torchrun import warm_torchrun

    run_dir = Path(run_dir)
    if mode == RESUME:
        from launcher import commands

        return commands.resume(run_dir, [], console=console, warm=warm)
    spec = RunDir(run_dir).read_spec()
    backend = backend_for(spec.cluster)
    with warm_torchrun(warm is not None and backend.on_this_machine, started=warm) as warm:
        if mode == LAUNCH:
            return backend.launch(spec, run_dir, console=console, show_progress=show_progress,
                                  warm=warm)
        from launcher.backends.run_lock import acquire_run_lock

        with acquire_run_lock(run_dir, action="restart") as lock:
            mark_restart(run_dir)
            return backend.launch(spec, run_dir, console=console, show_progress=show_progress,
                                  lock=lock, warm=warm)


def mark_restart(run_dir: Path) -> None:
    """Append a resume marker at step 0: readers drop every row the lost attempt logged."""
    from conf.run_dir.metrics_rows import RESUME_ROW_KIND
    from conf.run_dir.paths import RunDir

    with open(RunDir(run_dir).metrics_file, "a") as f:
        f.write(json.dumps({"kind": RESUME_ROW_KIND, "step": 0, "time": round(time.time(), 3),
                            "restart": "sweep retry: no complete checkpoint"}) + "\n")


def main(argv: list[str]) -> int:
    from conf.errors import ConfigError

    if len(argv) != 2 or argv[0] not in MODES:
        print(f"usage: python -m sweeps.point_process {{{'|'.join(MODES)}}} RUN_DIR",
              file=sys.stderr)
        return 2
    console = Console(file=sys.stdout, force_terminal=False, soft_wrap=True)
    try:
        return run_point(argv[0], Path(argv[1]), console=console, show_progress=False)
    except ConfigError as err:
        print(str(err), file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return INTERRUPTED


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
