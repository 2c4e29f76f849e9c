"""metrics.jsonl is append-only: a resumed leg adds a marker, readers keep each step's last
row, and the launcher's tail survives any content (torn lines, garbage, a truncated file)."""
from __future__ import annotations

import json

from conf.run_dir.metrics_rows import read_metrics_rows
from launcher.views.progress import MetricsTail
from training.loggers import MetricsFile


def train(step: int, loss: float) -> dict:
    return {"kind": "train", "step": step, "loss": loss}


def test_a_resume_marker_drops_the_rows_of_the_leg_that_died(tmp_path):
    first = MetricsFile(tmp_path, resume_step=None)
    for step in range(1, 6):
        first.write(train(step, 10.0 - step))
    first.close()
    before = (tmp_path / "metrics.jsonl").read_bytes()
    second = MetricsFile(tmp_path, resume_step=3)  # checkpoint at 3: steps 4, 5 are redone
    second.write(train(4, 0.4))
    second.close()
    assert (tmp_path / "metrics.jsonl").read_bytes().startswith(before)  # never rewritten
    rows = read_metrics_rows(tmp_path / "metrics.jsonl")
    steps = [(r["kind"], r["step"]) for r in rows]
    assert steps == [("train", 1), ("train", 2), ("train", 3), ("resume", 3), ("train", 4)]
    assert rows[-1]["loss"] == 0.4


def test_readers_skip_garbage_and_a_torn_last_line(tmp_path):
    path = tmp_path / "metrics.jsonl"
    path.write_text(json.dumps(train(1, 1.0)) + "\n{not json\n[1, 2]\n\x00\x00\n"
                    + json.dumps(train(2, 2.0)) + '\n{"kind": "tr')
    assert [r["step"] for r in read_metrics_rows(path)] == [1, 2]


def test_the_tail_survives_garbage_and_a_truncated_file(tmp_path):
    path = tmp_path / "metrics.jsonl"
    tail = MetricsTail(path)
    assert tail.new_rows() == []
    path.write_text(json.dumps(train(1, 1.0)) + "\n" + json.dumps(train(2, 2.0)) + "\n")
    assert [r["step"] for r in tail.new_rows()] == [1, 2]
    path.write_text("garbage}\n")  # shorter than what was read: read again from the start
    assert tail.new_rows() == []
    with path.open("a") as f:
        f.write(json.dumps(train(3, 3.0)) + "\n")
    assert [r["step"] for r in tail.new_rows()] == [3]
