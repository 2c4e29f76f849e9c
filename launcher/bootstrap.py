"""Set up the repo's virtual environment, then run meshrun or the tests. Standard library only.

    python3 -m launcher.bootstrap run [overrides...]   # set up, then `meshrun run ...`
    python3 -m launcher.bootstrap test [pytest args]   # set up, then the test suite

`test` runs pytest on two pytest-xdist workers (`-n 2 --dist loadfile`: each test module, and
all the Slurm tests together, stay on one worker; tests/support/worker_groups.py) unless the
pytest args choose their own (`-n`, `--dist`, `-p no:xdist`).

`test` also installs the Debian packages the tests use (a local Slurm cluster, which the Slurm
tests start themselves, and chromium for the report test) when they are missing and this runs
as root with apt-get.

The venv lives in <repo>/.venv and is reused. torch is pinned to 2.13.0 when it is missing
(an unpinned torch pulls a multi-GB CUDA build on CPU machines); an installed torch is kept.
"""
from __future__ import annotations

import hashlib
import os
import subprocess
import sys
import venv
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
VENV = REPO / ".venv"
TORCH_PIN = "torch==2.13.0"
STAMP = VENV / ".meshrun-installed"
# Debian packages the tests use: a throwaway Slurm cluster, and a browser for the HTML report.
TEST_PACKAGES = ("slurmctld", "slurmd", "slurm-client", "munge", "slurmdbd", "mariadb-server",
                 "chromium")
TEST_BINARIES = ("slurmctld", "slurmd", "sbatch", "munged", "slurmdbd", "mariadbd", "chromium")
XDIST_ARGS = ("-n", "2", "--dist", "loadfile", "--no-loadscope-reorder")
"""Two workers: a Slurm job or a hang timeout waits while the other worker computes."""


def venv_python() -> Path:
    return VENV / "bin" / "python"


def ensure_venv() -> None:
    if not venv_python().exists():
        print(f"[bootstrap] creating {VENV}", flush=True)
        venv.EnvBuilder(with_pip=True).create(VENV)


def has_module(module: str) -> bool:
    probe = [str(venv_python()), "-c", f"import importlib.util,sys; "
             f"sys.exit(importlib.util.find_spec('{module}') is None)"]
    return subprocess.run(probe, capture_output=True).returncode == 0


def pip_install(*args: str) -> None:
    cmd = [str(venv_python()), "-m", "pip", "install", "--disable-pip-version-check", *args]
    print("[bootstrap] " + " ".join(cmd[3:]), flush=True)
    subprocess.run(cmd, check=True, cwd=REPO)


def install_fingerprint() -> str:
    return hashlib.sha256((REPO / "pyproject.toml").read_bytes()).hexdigest()


def ensure_installed() -> None:
    """torch (pinned if missing), then meshrun editable with its test extras, once per pyproject."""
    ensure_venv()
    if not has_module("torch"):
        pip_install("--quiet", TORCH_PIN)
    fingerprint = install_fingerprint()
    if STAMP.exists() and STAMP.read_text() == fingerprint and has_module("launcher"):
        return
    pip_install("--quiet", "-e", ".[test]")
    STAMP.write_text(fingerprint)


def ensure_test_packages() -> None:
    """apt-get install the Slurm test cluster's and the browser's packages when missing (root)."""
    import shutil

    path = os.environ.get("PATH", "") + ":/usr/sbin:/sbin"
    if all(shutil.which(b, path=path) for b in TEST_BINARIES):
        return
    if os.geteuid() != 0 or not shutil.which("apt-get"):
        print("[bootstrap] Slurm/chromium packages missing and not root: their tests will be "
              "skipped (under CI=true they fail)", flush=True)
        return
    env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
    install = ["apt-get", "install", "-y", "-q", "--no-install-recommends", *TEST_PACKAGES]
    print("[bootstrap] " + " ".join(install), flush=True)
    if subprocess.run(install, env=env).returncode != 0:
        subprocess.run(["apt-get", "update", "-q"], env=env, check=True)
        subprocess.run(install, env=env, check=True)


def pytest_args(args: list[str]) -> list[str]:
    """`args` after the two-worker options, unless `args` set workers or the plugin itself."""
    own = any(a.startswith(("-n", "--numprocesses", "--dist")) or a == "no:xdist" for a in args)
    return list(args) if own else [*XDIST_ARGS, *args]


def main(argv: list[str]) -> int:
    if not argv or argv[0] not in ("run", "test"):
        sys.stderr.write(__doc__)
        return 2
    ensure_installed()
    bin_dir = VENV / "bin"
    os.chdir(REPO)
    if argv[0] == "test":
        ensure_test_packages()
        cmd = [str(bin_dir / "python"), "-m", "pytest", *pytest_args(argv[1:])]
    else:
        cmd = [str(bin_dir / "meshrun"), *argv]
    os.execv(cmd[0], cmd)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
