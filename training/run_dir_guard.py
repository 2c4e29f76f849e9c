"""The ranks never write into a run dir that is not theirs any more.

A run dir removed (or replaced by another folder of the same name) while training must stop
the run with an error: writing on would recreate a dir that holds only checkpoints, summary and
export (metrics, spec and logs gone), and the run would end with exit 0. The guard remembers the
run dir's identity (device and inode) when the rank starts, and checks before each step's
writes that the same folder, still holding spec.json, is there.
"""
from __future__ import annotations

import os
from pathlib import Path

from conf.run_dir.paths import RunDir


class RunDirGone(RuntimeError):
    """The run dir was removed or replaced while this run trained."""


def _identity(path: Path) -> tuple[int, int]:
    info = os.stat(path)
    return info.st_dev, info.st_ino


class RunDirGuard:
    def __init__(self, run_dir: Path) -> None:
        self.run_dir = Path(run_dir)
        self.identity = _identity(self.run_dir)

    def check(self, *, before: str) -> None:
        """RunDirGone (one line: what happened, what is not written) if the run dir is not the
        one this rank started in, or lost its spec.json. Two stat calls: no cost per step."""
        try:
            same = _identity(self.run_dir) == self.identity
        except FileNotFoundError:
            raise RunDirGone(f"run dir {self.run_dir} was removed while training; stopping "
                             f"before {before} (nothing is recreated or written)") from None
        if not same:
            raise RunDirGone(f"run dir {self.run_dir} was replaced by another folder while "
                             f"training; stopping before {before} (nothing written into it)")
        if not RunDir(self.run_dir).spec_file.is_file():
            raise RunDirGone(f"run dir {self.run_dir} lost its spec.json while training; "
                             f"stopping before {before}")
