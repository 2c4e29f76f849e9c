"""Making run directories: runs/<name>-<timestamp>/ with everything needed to reproduce a run.

What a run dir holds, and under which names, is `conf.run_dir`'s to say; this writes one.

A run dir's name is claimed by an atomic mkdir, its files are written whole into a private
temporary folder and renamed over the claimed (empty) name, so a failure while writing never
leaves a half-made run dir, an existing run dir is never overwritten, and any number of
processes creating run dirs of one name at once each get their own.
"""
from __future__ import annotations

import json
import os
import platform
import secrets
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from importlib import metadata
from pathlib import Path

from conf.run_dir.paths import RunDir, safe_name
from conf.search_path import ENV_VAR as CONFIG_PATH_ENV
from conf.spec import RunSpec
from conf.errors import ConfigError, Problem
from conf.run_dir.disk_space import disk_full_line

def new_run_dir_path(spec: RunSpec, *, now: float | None = None) -> Path:
    """runs_dir/<name>-<YYYYmmdd-HHMMSS>, with a numeric suffix if that already exists
    (what the next run would get; `create_run_dir` claims its name atomically)."""
    return next(p for p in _candidate_paths(spec, now=now) if not p.exists())


def _candidate_paths(spec: RunSpec, *, now: float | None = None):
    stamp = time.strftime("%Y%m%d-%H%M%S", time.localtime(now))
    base = Path(spec.runs_dir) / f"{safe_name(spec.name)}-{stamp}"
    yield base
    n = 1
    while True:
        n += 1
        yield base.with_name(f"{base.name}-{n}")


def claim_run_dir_path(spec: RunSpec) -> Path:
    """Claim the first free candidate name by creating it (mkdir is atomic: of any number of
    processes racing for one name, exactly one gets it and the others move on to the next)."""
    Path(spec.runs_dir).mkdir(parents=True, exist_ok=True)
    for path in _candidate_paths(spec):
        try:
            path.mkdir()
        except FileExistsError:
            continue
        return path
    raise AssertionError("unreachable")


def create_run_dir(spec: RunSpec, *, overrides: list[str], config_yaml: str,
                   command: list[str]) -> Path:
    """Write the run dir atomically; return its path. Never overwrites, never races: the name
    is claimed as an empty folder, the files are written into a private temporary folder
    beside it, and that is renamed over the (still empty) claimed folder in one step."""
    final = claim_run_dir_path(spec)
    try:
        tmp = Path(tempfile.mkdtemp(prefix=f".{final.name}.", suffix=".tmp", dir=final.parent))
    except BaseException:
        final.rmdir()
        raise
    try:
        rd = RunDir(tmp)
        rd.write_spec(spec)
        rd.config_file.write_text(config_yaml)
        rd.overrides_file.write_text(json.dumps(overrides, indent=2) + "\n")
        rd.command_file.write_text(render_command(command, run_dir=final) + "\n")
        rd.env_file.write_text(json.dumps(environment_record(), indent=2) + "\n")
        rd.wandb_id_file.write_text(secrets.token_hex(4) + "\n")
        rd.logs_dir.mkdir()
        os.chmod(tmp, 0o777 & ~_umask())  # mkdtemp makes it 0700; a run dir is a plain folder
        os.rename(tmp, final)  # replaces only an empty folder: ours, claimed above
    except BaseException as exc:
        shutil.rmtree(tmp, ignore_errors=True)
        try:
            final.rmdir()
        except OSError:
            pass
        full = disk_full_line(exc, tmp) if isinstance(exc, OSError) else None
        if full:
            raise ConfigError([Problem("runs_dir", str(final.parent), full,
                                       "free space there, or give another runs_dir=")],
                              "Cannot create the run dir") from None
        raise
    return final


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


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
        "config_path": os.environ.get(CONFIG_PATH_ENV, ""),  # user config dirs (resume reuses)
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
