"""A run paused at training.stop_at_step says where it stopped and how to continue."""
from __future__ import annotations

import io
import json
from pathlib import Path

from rich.console import Console

from conf.run_dir.paths import RunDir
from launcher.views.run_status import print_status, run_status
from launcher.views.run_summary import print_summary


def run_dir_with(tmp_path: Path, *rows: dict) -> Path:
    run_dir = tmp_path / "tiny-20260101-000000"
    metrics = RunDir(run_dir).metrics_file
    metrics.parent.mkdir(parents=True, exist_ok=True)
    metrics.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return run_dir


def printed(fn, *args) -> str:
    out = io.StringIO()
    fn(*args, Console(file=out, width=200))
    return out.getvalue()


TRAIN = {"kind": "train", "step": 5, "loss": 3.2, "tokens_per_s": 100.0, "mfu": 0.01}


def test_end_of_a_paused_run_names_the_step_and_the_resume_command(tmp_path):
    run_dir = run_dir_with(tmp_path, TRAIN, {"kind": "event", "event": "paused", "step": 5})
    text = printed(print_summary, run_dir)
    assert f"paused at step 5; continue with: meshrun resume {run_dir}" in text
    assert "summary.json" not in text


def test_status_of_a_paused_run_says_how_to_continue(tmp_path):
    run_dir = run_dir_with(tmp_path, TRAIN, {"kind": "event", "event": "paused", "step": 5})
    RunDir(run_dir).spec_file.write_text("{}")  # marks a run dir; status does not read it
    text = printed(print_status, run_status(run_dir))
    assert f"paused at step 5; continue with: meshrun resume {run_dir}" in text


def test_a_run_that_ended_without_summary_or_event_still_says_so(tmp_path):
    run_dir = run_dir_with(tmp_path, TRAIN)
    assert "no summary.json" in printed(print_summary, run_dir)
