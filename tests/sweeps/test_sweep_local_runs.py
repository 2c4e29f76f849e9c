"""Local sweeps end to end: points run through torchrun (1 process each, so they are quick),
points.json and `meshrun sweep status` tell their states, W&B runs carry the sweep's group,
tags and summary, a rerun skips completed points, and a failing point neither stops the others
nor survives `meshrun sweep retry` once its cause is fixed."""
from __future__ import annotations

import json
import subprocess
from functools import partial
from pathlib import Path

import numpy as np
import pytest

from launcher.backends.warm_agent import WARM_MARK
from tests.support.meshrun_cli import meshrun as run_meshrun
from tests.support.wandb_reader import read_runs

pytestmark = [pytest.mark.distributed, pytest.mark.e2e]
TINY = ["model=tiny", "training.steps=6", "training.seq_len=32", "training.eval_every=3",
        "schedule.warmup_steps=1", "parallel=single", "checkpoint.every_steps=0"]
# every `meshrun` here: no stdin, 200 columns wide, up to 600 s
meshrun = partial(run_meshrun, timeout=600, stdin=subprocess.DEVNULL, columns=200)


def sweep_status(sweep_dir: Path) -> dict:
    proc = meshrun("sweep", "status", str(sweep_dir), "--json")
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout)


@pytest.fixture(scope="module")
def four_points(tmp_path_factory):
    sweep_dir = tmp_path_factory.mktemp("sweep") / "lr_wu"
    args = ["sweep", "--yes", "--parallel", "2", "--name", "lr_wu", "--dir", str(sweep_dir),
            *TINY, "optim.lr=1e-3,3e-3", "schedule.warmup_steps=1,2",
            "--run-name", "lr{lr}-wu{warmup_steps}"]
    return meshrun(*args), sweep_dir, args


def test_four_points_run_to_completion(four_points):
    proc, sweep_dir, _ = four_points
    assert proc.returncode == 0, proc.stdout + proc.stderr
    points = json.loads((sweep_dir / "points.json").read_text())["points"]
    assert [p["name"] for p in points] == ["lr0.001-wu1", "lr0.001-wu2", "lr0.003-wu1",
                                           "lr0.003-wu2"]
    status = sweep_status(sweep_dir)
    assert status["counts"] == {"completed": 4}
    for row, point in zip(status["points"], points):
        assert row["step"] == row["steps"] == 6 and row["loss"] > 0 and row["mfu"] > 0
        run_dir = sweep_dir / point["run_dir"]
        assert run_dir.parent == sweep_dir / "runs" and (run_dir / "summary.json").exists()
        stored = json.loads((run_dir / "overrides.json").read_text())
        assert stored[:len(point["overrides"])] == point["overrides"]
        assert stored[-1] == f"runs_dir='{sweep_dir / 'runs'}'"


def test_each_point_is_a_wandb_run_in_the_sweep_group(four_points):
    _, sweep_dir, _ = four_points
    for point in json.loads((sweep_dir / "points.json").read_text())["points"]:
        run_dir = sweep_dir / point["run_dir"]
        run = read_runs(run_dir)
        assert run.group == "lr_wu"
        assert run.tags == (f"optim.lr={point['values']['optim.lr']}",
                            f"schedule.warmup_steps={point['values']['schedule.warmup_steps']}")
        assert run.name == run_dir.name and run.name.startswith(point["name"])
        summary = json.loads((run_dir / "summary.json").read_text())
        assert run.user_summary()["final_loss"] == pytest.approx(summary["final_loss"])
        assert run.user_summary()["best_val_loss"] == pytest.approx(summary["best_val_loss"])
        # one MFU: W&B's train/mfu summary is the run's MFU after warm-up, not its last step's
        assert run.user_summary()["train/mfu"] == run.user_summary()["mfu"] == \
            pytest.approx(summary["mfu"])
        training = json.loads((run_dir / "spec.json").read_text())["training"]
        check_wandb_page(run, tokens_per_step=training["global_batch_size"] * training["seq_len"])


def check_wandb_page(run, *, tokens_per_step: int) -> None:
    """Logs tab (rank 0's log lines), both x-axes defined, tokens_seen on every row."""
    assert "val loss" in run.console_text()
    assert {"name": "tokens_seen", "step_metric": "step"} in run.metric_definitions
    assert {"glob_name": "*", "step_metric": "step"} in run.metric_definitions
    rows = run.user_history()
    assert rows and all(row["tokens_seen"] == row["step"] * tokens_per_step for row in rows)
    last_train = [row for row in rows if "train/loss" in row][-1]
    assert {"train/mfu", "train/mem_peak_gib", "train/tokens_per_s"} <= set(last_train)
    assert "train/tokens_seen" not in last_train


def test_rerunning_the_sweep_skips_completed_points(four_points):
    _, sweep_dir, args = four_points
    before = sorted((sweep_dir / "runs").iterdir())
    again = meshrun(*args)
    assert again.returncode == 0, again.stderr
    assert "(skipping 4 completed)" in again.stdout and "nothing to run" in again.stdout
    assert sorted((sweep_dir / "runs").iterdir()) == before
    table = meshrun("sweep", "status", str(sweep_dir))
    assert "4 points: 4 completed" in table.stdout and "lr0.001-wu2" in table.stdout


def test_a_failing_point_fails_alone_and_retry_reruns_only_it(tmp_path):
    good, bad = tmp_path / "good.npy", tmp_path / "bad.npy"
    np.save(good, (np.arange(4096) % 200).astype(np.int64))
    tokens = np.arange(4096, dtype=np.int64) % 200
    tokens[1500:2500] = 999  # beyond the tiny vocab (256), between the head and tail that
    np.save(bad, tokens)     # resolve() samples: only a rank reading it finds them
    sweep_dir = tmp_path / "sweep"
    first = meshrun("sweep", "--yes", "--parallel", "2", "--dir", str(sweep_dir), *TINY,
                    "data=files", f"data.val_files={good}", f"data.train_files={bad},{good}")
    assert first.returncode == 1, first.stdout + first.stderr
    assert "point 0 failed (exit status 1): ValueError: token id 999" in first.stdout
    status = sweep_status(sweep_dir)
    assert [r["state"] for r in status["points"]] == ["failed", "completed"]
    good_run = status["points"][1]["run_dir"]

    np.save(bad, (np.arange(4096) % 100).astype(np.int64))  # fix the cause
    retried = meshrun("sweep", "retry", str(sweep_dir), "--yes")
    assert retried.returncode == 0, retried.stdout + retried.stderr
    assert "(skipping 1 completed)" in retried.stdout
    status = sweep_status(sweep_dir)
    assert [r["state"] for r in status["points"]] == ["completed", "completed"]
    assert status["points"][1]["run_dir"] == good_run  # untouched
    points = json.loads((sweep_dir / "points.json").read_text())["points"]
    assert [len(p["attempts"]) for p in points] == [2, 1]
    assert [a["exit_status"] for a in points[0]["attempts"]] == [1, 0]


def test_retry_resumes_a_point_that_stopped_with_a_checkpoint(tmp_path):
    """A point that ended early (here: training.stop_at_step, as a time limit would) continues
    from its checkpoint in the same run dir on retry, instead of starting over."""
    sweep_dir = tmp_path / "sweep"
    first = meshrun("sweep", "--yes", "--dir", str(sweep_dir), *TINY, "training.stop_at_step=3",
                    "optim.lr=choice(1e-3)")  # a one-point sweep
    assert first.returncode == 1, first.stdout + first.stderr
    (row,) = sweep_status(sweep_dir)["points"]
    assert (row["state"], row["step"]) == ("paused", 3)  # its own event: stop_at_step
    retried = meshrun("sweep", "retry", str(sweep_dir), "--yes")
    assert retried.returncode == 0, retried.stdout + retried.stderr
    assert "resuming from its checkpoint" in retried.stdout
    (after,) = sweep_status(sweep_dir)["points"]
    assert (after["state"], after["step"], after["run_dir"]) == ("completed", 6, row["run_dir"])
    rows = [json.loads(line) for line in (Path(row["run_dir"]) / "metrics.jsonl").read_text()
            .splitlines() if line.strip()]
    assert [r["step"] for r in rows if r.get("kind") == "train"] == list(range(1, 7))
    # both legs' torchrun was an agent started warm (sweeps/run_local.WarmAgents)
    log = (Path(row["run_dir"]) / "logs" / "torchrun.log").read_text()
    assert log.count(WARM_MARK) == 2, log


def test_compare_reports_the_four_points_with_the_varied_keys(four_points):
    proc, sweep_dir, _ = four_points
    assert proc.returncode == 0, proc.stdout + proc.stderr
    result = meshrun("compare", str(sweep_dir), "--json", "-")
    assert result.returncode == 0, result.stderr
    rows = json.loads(result.stdout)
    rows = rows["rows"] if isinstance(rows, dict) else rows
    assert sorted(r["run"] for r in rows) == ["lr0.001-wu1", "lr0.001-wu2", "lr0.003-wu1",
                                              "lr0.003-wu2"]
    varied = {k for k in rows[0] if k.startswith(("optim.", "schedule.", "training."))}
    assert varied == {"optim.lr", "schedule.warmup_steps"}
    assert all(r["state"] == "completed" and r["final_val_loss"] > 0 for r in rows)
    assert (sweep_dir / "report.html").exists()
