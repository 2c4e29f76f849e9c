"""The warm torchrun agent (launcher/backends/warm_torchrun.py): started before the config is
composed, it runs the torchrun command it is handed, with the given environment, writing to the
given log and holding the run dir's lock; a dead agent falls back to a cold torchrun; a
discarded one is gone at once. Real processes: the agent, torchrun and a 1-rank script (no torch)."""
from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from conf.run_dir.paths import RunDir
from launcher.backends.local_torchrun import TORCHRUN, start_torchrun
from launcher.backends.run_lock import acquire_run_lock
from launcher.backends.warm_agent import WARM_MARK
from launcher.backends.warm_torchrun import WarmTorchrun, launches_locally, warm_torchrun

REPO = Path(__file__).resolve().parents[2]
RANK_SCRIPT = textwrap.dedent("""
    import fcntl, os, sys
    fd = os.open(sys.argv[1], os.O_RDWR)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        print("lock free")
    except BlockingIOError:
        print("lock held")
    print("rank", os.environ["RANK"], "mark", os.environ.get("WARM_TEST_MARK"))
""")


@pytest.fixture
def launch_parts(tmp_path, monkeypatch):
    """(torchrun command for a 1-rank script, environment, run dir) in tmp_path."""
    monkeypatch.chdir(REPO)  # the agent is `python -m launcher.backends.warm_agent`
    script = tmp_path / "rank.py"
    script.write_text(RANK_SCRIPT)
    command = [*TORCHRUN, "--standalone", "--nnodes=1", "--nproc_per_node=1", str(script),
               str(RunDir(tmp_path).lock_file)]  # the file `launch` below locks
    env = {**os.environ, "WARM_TEST_MARK": "from-launch",
           "PYTHONPATH": os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")]))}
    return command, env, tmp_path


def launch(warm, command, env, run_dir: Path) -> tuple[subprocess.Popen, str]:
    """Launch through start_torchrun, let go of our copy of the lock (the agent keeps its
    own), wait; (the process, its log)."""
    lock = acquire_run_lock(run_dir, action="run")
    log_path = run_dir / "torchrun.log"
    with open(log_path, "ab") as log:
        proc = start_torchrun(command, env=env, log=log, lock=lock, warm=warm)
    os.close(lock.fd)  # close without unlocking: only torchrun's copy holds it now
    lock.fd = -1
    assert proc.wait(timeout=120) == 0, log_path.read_text()
    return proc, log_path.read_text()


def test_the_warm_agent_runs_torchrun_with_the_launch_env_log_and_lock(launch_parts):
    command, env, run_dir = launch_parts
    warm = WarmTorchrun.start()
    proc, log = launch(warm, command, env, run_dir)
    assert proc is warm.proc and warm.launched
    assert log.startswith(WARM_MARK), log
    assert "rank 0 mark from-launch" in log, log  # the environment sent, not the agent's own
    assert "lock held" in log, log  # the lock's descriptor travelled to the agent


def test_a_dead_agent_falls_back_to_a_cold_torchrun(launch_parts):
    command, env, run_dir = launch_parts
    warm = WarmTorchrun.start()
    warm.proc.kill()
    warm.proc.wait()
    proc, log = launch(warm, command, env, run_dir)
    assert proc is not warm.proc and not warm.launched
    assert WARM_MARK not in log
    assert "rank 0 mark from-launch" in log and "lock held" in log, log


def test_an_unused_agent_is_gone_when_the_block_ends(monkeypatch):
    monkeypatch.chdir(REPO)
    with pytest.raises(RuntimeError):
        with warm_torchrun(True) as warm:
            raise RuntimeError("the config was refused")
    assert warm.proc.returncode is not None  # killed and reaped, not left importing torch
    with warm_torchrun(False) as nothing:
        assert nothing is None


def test_an_agent_started_early_is_used_or_killed(monkeypatch):
    monkeypatch.chdir(REPO)
    early = WarmTorchrun.start()
    with warm_torchrun(True, started=early) as warm:
        assert warm is early  # adopted, not a second agent
    assert early.proc.returncode is not None  # not launched: killed when the block ended
    early = WarmTorchrun.start()
    with warm_torchrun(False, started=early) as warm:  # a dry run after all
        assert warm is None and early.proc.returncode is not None


@pytest.mark.parametrize("argv, guess", [
    (["run", "model=tiny"], True), (["resume", "runs/x"], True), (["preflight"], True),
    (["run", "--dry-run", "model=tiny"], False), (["run", "--prepare-only"], False),
    (["run", "--cfg=job"], False), (["run", "-m", "optim.lr=1e-3,1e-4"], False),
    (["run", "--help"], False), (["plan", "model=tiny"], False), ([], False),
])
def test_the_cli_guesses_from_its_raw_arguments_whether_to_start_an_agent(argv, guess):
    assert launches_locally(argv) is guess


def test_the_cli_imports_nothing_of_meshrun_before_it_starts_the_agent():
    """`meshrun` starts the agent first thing: importing launcher.cli must stay cheap (no
    Hydra, rich, config or command modules: ~0.15 s the agent would wait for)."""
    code = ("import sys, launcher.cli; print(sorted({m.split('.')[0] for m in sys.modules} & "
            "{'conf', 'hydra', 'omegaconf', 'rich', 'torch', 'training', 'parallel'}))")
    out = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True,
                         text=True, check=True).stdout
    assert out.strip() == "[]"
