"""On a CUDA machine: the same default command uses the GPUs (NCCL, bf16) without edits.

Skipped without CUDA (this project's CI machines have none); run on a GPU machine with
`.venv/bin/pytest tests/gpu`.
"""
from __future__ import annotations

import json

import pytest
import torch

from tests.support.meshrun_cli import meshrun

pytestmark = [pytest.mark.gpu,
              pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")]


def test_default_command_runs_on_the_gpus_in_bf16(tmp_path):
    result = meshrun("run", "training.steps=30", "training.eval_every=0", f"runs_dir={tmp_path}",
                     timeout=600)
    assert result.returncode == 0, result.stdout + result.stderr
    (run_dir,) = list(tmp_path.iterdir())
    spec = json.loads((run_dir / "spec.json").read_text())
    assert spec["training"]["device"] == "cuda"
    assert spec["cluster"]["procs_per_node"] == torch.cuda.device_count()
    if torch.cuda.get_device_capability() >= (8, 0):
        assert spec["precision"]["name"] == "bf16"
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    train = [r for r in rows if r["kind"] == "train"]
    assert train[-1]["loss"] < train[0]["loss"]
    assert {"mem_allocated_gib", "mem_reserved_gib", "mem_peak_gib",
            "mem_reserved_peak_gib"} <= set(train[-1])
    assert train[-1]["mem_reserved_peak_gib"] >= train[-1]["mem_peak_gib"] > 0
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["peak_flops_source"].startswith("table:"), summary["peak_flops_source"]
    assert 0 < summary["mfu"] < 1
