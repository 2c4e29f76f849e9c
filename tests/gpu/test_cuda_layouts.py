"""On a machine with 2+ CUDA GPUs: sharded layouts run over NCCL in bf16 and learn.

Skipped without 2 GPUs (this project's CI machines have none); run on a GPU machine with
`.venv/bin/pytest tests/gpu`.
"""
from __future__ import annotations

import json

import pytest
import torch

from tests.support.meshrun_cli import meshrun

pytestmark = [pytest.mark.gpu,
              pytest.mark.skipif(torch.cuda.device_count() < 2, reason="needs 2 CUDA GPUs")]


@pytest.mark.parametrize("layout", ["zero3", "tp", "pp", "cp"])
def test_layout_runs_on_two_gpus(tmp_path, layout):
    result = meshrun("run", f"parallel={layout}", "cluster.procs_per_node=2", "training.steps=20",
                     "training.eval_every=0", f"runs_dir={tmp_path}", timeout=600)
    assert result.returncode == 0, result.stdout + result.stderr
    (run_dir,) = list(tmp_path.iterdir())
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    train = [r for r in rows if r["kind"] == "train"]
    assert train[-1]["loss"] < train[0]["loss"]
    assert 0 < train[-1]["mfu"] < 1
