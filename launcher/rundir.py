"""Making run directories: runs/<name>-<timestamp>/ with everything needed to reproduce a run.

What a run dir holds, and under which names, is `conf.rundir`'s to say; this writes one.

A run dir is written whole into a temporary folder and renamed into place, so a failure while
writing never leaves a half-made run dir, and an existing run dir is never overwritten.
"""
from __future__ import annotations

import json
import os
import platform
import re
import secrets
import shutil
import socket
import subprocess
import sys
import time
from importlib import metadata
from pathlib import Path

from conf.rundir import RunDir
from conf.spec import RunSpec

SAFE_NAME = re.compile(r"[^A-Za-z0-9_.-]+")


def safe_name(text: str) -> str:
    """`text` reduced to characters safe in paths and #SBATCH lines."""
    return SAFE_NAME.sub("_", text)


def new_run_dir_path(spec: RunSpec, *, now: float | None = None) -> Path:
    """runs_dir/<name>-<YYYYmmdd-HHMMSS>, with a numeric suffix if that already exists."""
    stamp = time.strftime("%Y%m%d-%H%M%S", time.localtime(now))
    base = Path(spec.runs_dir) / f"{safe_name(spec.name)}-{stamp}"
    path, n = base, 1
    while path.exists() or path.with_name(path.name + ".tmp").exists():
        n += 1
        path = base.with_name(f"{base.name}-{n}")
    return path


def create_run_dir(spec: RunSpec, *, overrides: list[str], config_yaml: str,
                   command: list[str]) -> Path:
    """Write the run dir atomically; return its path. Raises FileExistsError, never overwrites."""
    final = new_run_dir_path(spec)
    final.parent.mkdir(parents=True, exist_ok=True)
    tmp = final.with_name(final.name + ".tmp")
    tmp.mkdir()
    try:
        rd = RunDir(tmp)
        rd.write_spec(spec)
        rd.config_file.write_text(config_yaml)
        rd.overrides_file.write_text(json.dumps(overrides, indent=2) + "\n")
        rd.command_file.write_text(render_command(command, run_dir=final) + "\n")
        rd.env_file.write_text(json.dumps(environment_record(), indent=2) + "\n")
        rd.wandb_id_file.write_text(secrets.token_hex(4) + "\n")
        rd.logs_dir.mkdir()
        os.rename(tmp, final)  # fails if `final` appeared meanwhile: never overwrite
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return final


def render_command(command: list[str], *, run_dir: Path) -> str:
    import shlex

    return shlex.join(str(run_dir) if part == "<run_dir>" else part for part in command)


def environment_record() -> dict:
    """Python/torch versions, host and git state, gathered without importing torch."""
    return {
        "python": sys.version.split()[0],
        "python_executable": sys.executable,
        "torch": _version("torch"),
        "cuda_driver": _nvidia_driver(),
        "host": socket.gethostname(),
        "platform": platform.platform(),
        "git": git_state(Path(__file__).resolve().parent.parent),
        "created": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        "argv": sys.argv,
    }


def _version(package: str) -> str:
    try:
        return metadata.version(package)
    except metadata.PackageNotFoundError:
        return "not installed"


def _nvidia_driver() -> str:
    exe = shutil.which("nvidia-smi")
    if not exe:
        return ""
    out = subprocess.run([exe, "--query-gpu=driver_version", "--format=csv,noheader"],
                         capture_output=True, text=True, timeout=10)
    return out.stdout.strip().splitlines()[0] if out.returncode == 0 and out.stdout else ""


def git_state(repo: Path) -> dict:
    def git(*args: str) -> str:
        out = subprocess.run(["git", "-C", str(repo), *args], capture_output=True, text=True)
        return out.stdout.strip() if out.returncode == 0 else ""

    commit = git("rev-parse", "HEAD")
    dirty = bool(git("status", "--porcelain", "--untracked-files=no")) if commit else False
    return {"commit": commit or "unknown", "dirty": dirty}
