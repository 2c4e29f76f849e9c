"""End to end: train a BPE, `meshrun data prepare` a corpus, `meshrun run data=files
data.prepared=DIR` trains 3 steps on the shards (one torchrun rank)."""
from __future__ import annotations

import json
import random
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = [pytest.mark.distributed, pytest.mark.e2e]
REPO = Path(__file__).resolve().parents[2]


def meshrun(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "launcher.cli", *args], cwd=REPO,
                          capture_output=True, text=True, timeout=300)


def test_run_trains_three_steps_on_prepared_shards(tmp_path):
    rnd = random.Random(1)
    words = "alpha beta gamma delta tokens shards loss falls".split()
    for i in range(30):
        (tmp_path / f"d{i}.txt").write_text(" ".join(rnd.choices(words, k=200)))
    files = sorted(str(p) for p in tmp_path.glob("d*.txt"))
    done = meshrun("data", "train-tokenizer", "--vocab-size", "300", "--out",
                   str(tmp_path / "tok"), *files)
    assert done.returncode == 0, done.stderr
    done = meshrun("data", "prepare", "--tokenizer", str(tmp_path / "tok"), "--out",
                   str(tmp_path / "prep"), "--val-fraction", "0.2", "--workers", "1", *files)
    assert done.returncode == 0, done.stderr
    done = meshrun("run", "model=tiny", "data=files", f"data.prepared={tmp_path / 'prep'}",
                   f"data.tokenizer={tmp_path / 'tok'}", "model.vocab_size=320",
                   "training.steps=3", "training.seq_len=32", "training.micro_batch_size=4",
                   "training.eval_every=0", "training.eval_batches=1", "checkpoint.every_steps=0",
                   "checkpoint.export_safetensors=false", "logging=disabled",
                   "cluster.procs_per_node=1", f"runs_dir={tmp_path / 'runs'}")
    assert done.returncode == 0, done.stdout + done.stderr
    (run_dir,) = (tmp_path / "runs").iterdir()
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    assert sorted(r["step"] for r in rows if r["kind"] == "train") == [1, 2, 3]
    spec = json.loads((run_dir / "spec.json").read_text())
    assert spec["data"]["dtype"] == "uint16" and spec["data"]["prepared"].endswith("prep")
