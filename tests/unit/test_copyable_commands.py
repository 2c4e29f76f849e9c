"""`meshrun run --dry-run` prints commands that work when pasted: the run dir it shows does
not exist yet, so it prints `RUN_DIR=$(meshrun run --prepare-only ...)` and the torchrun line
that starts that dir's ranks. This test pastes them into bash (model from a user config dir
outside the package, 2 steps, one CPU rank) and checks that the run trained."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from conf.run_dir.paths import RunDir
from conf.search_path import ENV_VAR
from tests.support.meshrun_cli import meshrun
from tests.support.user_configs import write_user_configs

REPO = Path(__file__).resolve().parents[2]
pytestmark = pytest.mark.e2e


def test_the_printed_commands_run_when_pasted(tmp_path):
    user_dir = write_user_configs(tmp_path / "my_conf")
    runs = tmp_path / "runs"
    env = {k: v for k, v in os.environ.items() if k != ENV_VAR}
    env.update(COLUMNS="250", PYTHONPATH=os.pathsep.join([str(REPO), *sys.path[1:]]))
    overrides = ["+experiment=mine", "data=synthetic", "training.device=cpu",
                 "cluster.procs_per_node=1", "logging.progress=false", f"runs_dir={runs}"]
    dry = meshrun("run", "--dry-run", "--config-dir", str(user_dir), *overrides, env=env,
                  timeout=120)
    assert dry.returncode == 0, dry.stderr
    assert not runs.exists()
    lines = dry.stdout.split("to run it")[1].splitlines()
    one_step = next(ln.strip() for ln in lines if "launcher.cli run --config-dir" in ln)
    assert one_step.endswith(" ".join(overrides)) and str(user_dir) in one_step
    start = next(i for i, ln in enumerate(lines) if ln.strip().startswith("RUN_DIR=$("))
    pasted = "set -e\n" + "\n".join(ln.strip() for ln in lines[start:start + 2]) + "\n"
    assert "--prepare-only" in pasted and '-m training "$RUN_DIR"' in pasted
    # pasted in another folder, without MESHRUN_CONFIG_PATH: the commands carry all they need
    ran = subprocess.run(["bash", "-c", pasted + 'echo "RUN_DIR=$RUN_DIR"'], cwd=tmp_path,
                         env=env, capture_output=True, text=True, timeout=600)
    assert ran.returncode == 0, ran.stdout[-3000:] + ran.stderr[-3000:]
    run_dir = Path(ran.stdout.strip().splitlines()[-1].removeprefix("RUN_DIR="))
    assert run_dir.parent == runs and RunDir(run_dir).is_run_dir
    steps = [json.loads(x).get("step") for x in RunDir(run_dir).metrics_file.read_text()
             .splitlines()]
    assert max(s for s in steps if s is not None) == 2
    assert json.loads(RunDir(run_dir).spec_file.read_text())["model"]["name"] == "my1b"
