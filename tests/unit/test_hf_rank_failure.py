"""A Hugging Face folder that breaks after the launcher checked it (a shard truncated while the
job waited) fails in the rank with one line naming the file and the rule: no traceback in the
rank log, and the reason the launcher and `meshrun status` show is that line."""
from __future__ import annotations

import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from conf.run_dir.failure_diagnosis import failure_tail
from conf.run_dir.paths import RunDir
from tests.support.hf_models import make_llama
from tests.support.specs import cpu_spec

pytest.importorskip("transformers")

REPO = Path(__file__).resolve().parents[2]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_weights_broken_after_the_check_fail_the_rank_in_one_line(tmp_path):
    folder = tmp_path / "hf"
    make_llama(folder, tied=True)
    spec = cpu_spec("model=hf", f"model.path={folder}", "data=synthetic", "training.seq_len=40",
                    "cluster.procs_per_node=1", "training.steps=1", f"runs_dir={tmp_path}")
    run_dir = tmp_path / "run"
    RunDir(run_dir).logs_dir.mkdir(parents=True)  # what the launcher's run dir writer makes
    RunDir(run_dir).write_spec(spec)
    weights = folder / "model.safetensors"
    os.truncate(weights, weights.stat().st_size - 100)  # after resolve(), before the rank
    env = {**os.environ, "PYTHONPATH": str(REPO), "RANK": "0", "LOCAL_RANK": "0",
           "WORLD_SIZE": "1", "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(_free_port())}
    proc = subprocess.run([sys.executable, "-m", "training", str(run_dir)], env=env, cwd=REPO,
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 1, proc.stderr
    log = RunDir(run_dir).rank_log(0).read_text()
    assert "Traceback" not in log + proc.stderr
    assert f"rank 0 failed: {folder}: model.safetensors: its tensors need" in log
    tail = failure_tail(run_dir)
    assert tail.startswith(f"{folder}: model.safetensors:") and "truncated?" in tail
