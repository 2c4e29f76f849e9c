"""Run the real `meshrun` command in a subprocess, as a person types it (stdlib only).

    result = meshrun("run", "--dry-run", "model=tiny", timeout=60)
    assert result.returncode == 0, result.stderr

`meshrun` runs `python -m launcher.cli` with this interpreter, from the repository root (so the
checkout under test is what runs), and returns the finished `CompletedProcess` with text
stdout/stderr captured. `start_meshrun` starts the same command and returns the `Popen`, for
tests that signal, kill or race a live launcher; `meshrun_command` is the argument list itself.
"""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[2]
DEFAULT_TIMEOUT_S = 300.0


def meshrun_command(*args: str) -> list[str]:
    """The argument list that runs `meshrun *args` with this interpreter."""
    return [sys.executable, "-m", "launcher.cli", *args]


def meshrun(*args: str, timeout: float = DEFAULT_TIMEOUT_S, env: dict[str, str] | None = None,
            columns: int | None = None, stdin: Any = None, input: str | None = None,
            cwd: Path = REPO, check: bool = False) -> subprocess.CompletedProcess:
    """Run `meshrun *args` to the end; stdout and stderr captured as text.

    `env` is the whole environment (None: inherit this one); `columns` sets COLUMNS in it, the
    terminal width rich lays tables out for. `stdin` is a file or `subprocess.DEVNULL`, `input`
    text fed to stdin; `check` raises on a non-zero exit."""
    return subprocess.run(meshrun_command(*args), cwd=cwd, env=with_columns(env, columns),
                          stdin=stdin, input=input, capture_output=True, text=True,
                          timeout=timeout, check=check)


def start_meshrun(*args: str, env: dict[str, str] | None = None, columns: int | None = None,
                  cwd: Path = REPO, **popen: Any) -> subprocess.Popen:
    """Start `meshrun *args` and return the live process; `popen` goes to `subprocess.Popen`."""
    return subprocess.Popen(meshrun_command(*args), cwd=cwd, env=with_columns(env, columns),
                            **popen)


def with_columns(env: dict[str, str] | None, columns: int | None) -> dict[str, str] | None:
    """`env` (None: this process's environment) with COLUMNS=`columns`; unchanged without."""
    if columns is None:
        return env
    return {**(os.environ if env is None else env), "COLUMNS": str(columns)}
