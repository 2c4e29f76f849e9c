"""The torchrun agent of a local run, started warm:
`python -m launcher.backends.warm_agent FD for ...`
(the words after FD, the CLI's own command line, only tell `ps` readers whose agent it is).

`meshrun run` and `meshrun resume` start this process before they compose the config, so
its Python start-up and `import torch` (about a second) overlap the CLI's own work instead
of following it. It then waits on the socket FD for the launch (launcher/backends/warm_torchrun.py):
one message with torchrun's arguments and the ranks' environment, carrying the run log and
the run dir's lock as file descriptors. It points stdout and stderr at the log, keeps the
lock open (as torchrun does when started cold with the lock fd passed on), and runs torchrun
in this process. The socket closing with no message (the CLI refused the config, launched
elsewhere, or died) ends it quietly.

Only the standard library and torch are imported here: nothing of meshrun's launcher.
"""
from __future__ import annotations

import importlib
import json
import os
import socket
import sys
import time

MAX_MESSAGE = 1 << 20
"""Bytes of one launch message (torchrun arguments and the environment)."""
FDS = 2
"""The log's and the lock's descriptors, in that order."""
WARM_MARK = "meshrun: torchrun agent started warm"
"""The first line of a warm-started torchrun's log (tests look for it)."""


def receive_launch(sock: socket.socket) -> tuple[dict, list[int]] | None:
    """The launch message and its descriptors; None when the socket closed without one."""
    data, fds, _, _ = socket.recv_fds(sock, MAX_MESSAGE, FDS)
    if not data:
        return None
    return json.loads(data), fds


def become_torchrun(message: dict, fds: list[int], *, ready_s: float) -> None:
    """Take the log as stdout/stderr and the environment, then run torchrun's main."""
    from torch.distributed.run import main as torchrun_main

    log_fd = fds[0]  # fds[1], the run dir's lock, stays open for this process's lifetime
    os.dup2(log_fd, sys.stdout.fileno())
    os.dup2(log_fd, sys.stderr.fileno())
    os.close(log_fd)
    print(f"{WARM_MARK} (Python and torch imported in {ready_s:.2f} s while the CLI "
          "prepared the run, or the sweep's point before it started)", flush=True)
    os.environ.clear()
    os.environ.update(message["env"])
    torchrun_main(message["argv"])


def main(fd: int) -> int:
    started = time.perf_counter()
    importlib.import_module("torch.distributed.run")  # what this process starts early for
    ready_s = time.perf_counter() - started

    sock = socket.socket(fileno=fd)
    launch = receive_launch(sock)
    sock.close()
    if launch is None:
        return 0
    become_torchrun(*launch, ready_s=ready_s)
    return 0


if __name__ == "__main__":
    sys.exit(main(int(sys.argv[1])))
