"""A local run's torchrun agent, started before the config is composed
(launcher/backends/warm_agent.py).

`WarmTorchrun.start()` spawns the agent at once, so its Python and `import torch` run on another
core while the CLI imports its own modules, composes, resolves and writes the run dir (`meshrun`
starts it first thing, on a guess from its raw arguments: `launches_locally`); `launch()` then
hands it torchrun's arguments, the ranks' environment, the run log and the run dir's lock, and
returns it as the Popen the launcher watches (the same session, parent-death signal and log as a
torchrun started cold). A run that is refused, is a dry run, or goes to Slurm or to other nodes
`discard()`s it: the agent, which has started nothing, is killed. When the agent is gone (its
import failed, say), `launch()` returns None and the caller starts torchrun cold, whose log
then shows the real error.
"""
from __future__ import annotations

import contextlib
import json
import os
import socket
import subprocess
import sys

from launcher.backends.process_lifetime import parent_death_preexec

NO_LAUNCH_FLAGS = frozenset({"--dry-run", "--prepare-only", "-h", "--help", "--cfg", "-c",
                             "--info", "-m", "--multirun"})
"""Flags after which `meshrun run` prints (or runs many) instead of launching one run here."""


def launches_locally(argv: list[str]) -> bool:
    """May `meshrun <argv>` start torchrun on this machine? A guess before any parsing: `run`,
    `resume` or `preflight` without a flag that only prints (a run that goes to Slurm is
    guessed yes). A wrong yes costs an agent started and killed; a wrong no, a cold start."""
    if not argv or argv[0] not in ("run", "resume", "preflight"):
        return False
    return not any(word.split("=", 1)[0] in NO_LAUNCH_FLAGS for word in argv[1:])


class WarmTorchrun:
    def __init__(self, proc: subprocess.Popen, sock: socket.socket):
        self.proc = proc
        self._sock = sock
        self.launched = False

    @classmethod
    def start(cls) -> WarmTorchrun:
        """Spawn the agent (call from the main thread: the parent-death signal follows it).
        Its environment at start is this one, unbuffered; the ranks' comes with `launch`."""
        ours, theirs = socket.socketpair()
        with theirs:
            proc = subprocess.Popen(
                [sys.executable, "-m", "launcher.backends.warm_agent", str(theirs.fileno()),
                 "for", *sys.argv],  # the words after FD only say, in `ps`, whose agent it is
                stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                env=dict(os.environ, PYTHONUNBUFFERED="1"), start_new_session=True,
                pass_fds=(theirs.fileno(),), preexec_fn=parent_death_preexec())
        return cls(proc, ours)

    def launch(self, torchrun_args: list[str], *, env: dict[str, str], log_fd: int,
               lock_fd: int) -> subprocess.Popen | None:
        """Run torchrun with `torchrun_args` in the agent; None if the agent is gone."""
        message = json.dumps({"argv": torchrun_args, "env": env}).encode()
        if self.proc.poll() is None:
            try:
                socket.send_fds(self._sock, [message], [log_fd, lock_fd])
                self.launched = True
            except OSError:  # it died just now
                pass
        if not self.launched:
            self.discard()
            return None
        self._sock.close()
        return self.proc

    def discard(self) -> None:
        """Not needed after all: the agent, which has started nothing yet, is killed (it
        may still be importing torch; a refused config must not wait for that)."""
        self._sock.close()
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait()


@contextlib.contextmanager
def warm_torchrun(wanted: bool, *, started: WarmTorchrun | None = None):
    """A `WarmTorchrun` for the block (None when not `wanted`), discarded at its end unless
    it was launched: `started` (one the caller started earlier) when given, else a new one."""
    if started is not None and not wanted:
        started.discard()
    warm = (started or WarmTorchrun.start()) if wanted else None
    try:
        yield warm
    finally:
        if warm is not None and not warm.launched:
            warm.discard()
