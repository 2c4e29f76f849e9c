"""WandbLogger writes exactly what it was given, resumes the same run id, and costs nothing disabled.

Offline runs only (there is no network here); `tests.support.wandb_reader` decodes the `.wandb`
files, so each check compares values, not just "a file appeared".
"""

from __future__ import annotations

import subprocess
import sys
import textwrap
import time
from pathlib import Path
from typing import Any

import pytest

from tests.support.wandb_reader import find_offline_runs, read_run, read_runs
from training.wandb_logger import WandbLogger

RUN_ID = "unit-run-1"
CONFIG = {"model": {"d_model": 64, "n_layers": 2}, "optim": {"lr": 3e-4}, "seed": 7}


@pytest.fixture(autouse=True)
def _quiet_wandb_env(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in ("WANDB_MODE", "WANDB_RUN_ID", "WANDB_RESUME", "WANDB_DIR", "WANDB_PROJECT"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("WANDB_SILENT", "true")


def make_logger(run_dir: Path, *, mode: str = "offline", **options: Any) -> WandbLogger:
    return WandbLogger(
        run_dir=run_dir,
        mode=mode,
        project="meshrun-tests",
        entity="",
        run_id=RUN_ID,
        name="unit",
        config=CONFIG,
        group="sweep-a",
        tags=("unit", "cpu"),
        **options,
    )


def loss_rows(steps: range) -> list[dict[str, float]]:
    return [{"train/loss": 10.0 / (step + 1), "train/lr": 1e-3 * step, "step": step} for step in steps]


def log_rows(logger: WandbLogger, rows: list[dict[str, float]]) -> None:
    for row in rows:
        metrics = {key: value for key, value in row.items() if key != "step"}
        logger.log(metrics, step=int(row["step"]))


def test_offline_run_reads_back_config_history_and_summary(tmp_path: Path) -> None:
    logger = make_logger(tmp_path)
    log_rows(logger, loss_rows(range(3)))
    logger.summary({"best/loss": 3.25, "tokens_seen": 12288})
    logger.finish()

    (path,) = find_offline_runs(tmp_path)
    run = read_run(path)
    assert (run.run_id, run.project, run.name, run.group) == (RUN_ID, "meshrun-tests", "unit", "sweep-a")
    assert run.tags == ("unit", "cpu")
    assert run.user_config() == CONFIG
    assert run.user_history() == loss_rows(range(3))
    assert run.user_summary() == {**loss_rows(range(3))[-1], "best/loss": 3.25, "tokens_seen": 12288}
    assert run.exit_code == 0


def test_resume_continues_the_same_run_id(tmp_path: Path) -> None:
    first = make_logger(tmp_path)
    log_rows(first, loss_rows(range(3)))
    first.summary({"best/loss": 3.3})
    first.finish()

    resumed = make_logger(tmp_path)
    log_rows(resumed, loss_rows(range(2, 5)))  # resumes from the step-2 checkpoint: replays step 2
    resumed.summary({"best/loss": 2.0})
    resumed.finish(exit_code=3)

    segments = [read_run(path) for path in find_offline_runs(tmp_path)]
    assert len(segments) == 2
    assert {segment.run_id for segment in segments} == {RUN_ID}

    run = read_runs(tmp_path)
    assert run.run_id == RUN_ID
    assert run.user_history() == loss_rows(range(3)) + loss_rows(range(2, 5))
    assert run.user_config() == CONFIG
    assert run.user_summary()["best/loss"] == 2.0
    assert run.user_summary()["step"] == 4
    assert run.exit_code == 3
    assert run.resume_requested
    assert run.start_time_s == min(segment.start_time_s for segment in segments)


def test_finish_twice_and_context_manager(tmp_path: Path) -> None:
    with make_logger(tmp_path) as logger:
        log_rows(logger, loss_rows(range(1)))
        assert logger.enabled
    assert not logger.enabled
    logger.finish()  # no-op once closed
    logger.log({"train/loss": 1.0}, step=9)  # ignored once closed
    assert read_runs(tmp_path).user_history() == loss_rows(range(1))


def test_unknown_mode_is_rejected(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="offline, online, disabled"):
        make_logger(tmp_path, mode="dryrun")


def test_disabled_writes_nothing_and_never_imports_wandb(tmp_path: Path) -> None:
    run_dir = tmp_path / "run"
    script = textwrap.dedent(
        f"""
        import sys
        from pathlib import Path
        from training.wandb_logger import WandbLogger

        logger = WandbLogger(run_dir=Path({str(run_dir)!r}), mode="disabled", project="p",
                             entity="", run_id="r", name="n", config={{"a": 1}})
        logger.log({{"loss": 1.0}}, step=0)
        logger.summary({{"best": 1.0}})
        logger.finish()
        assert not logger.enabled
        print("wandb" in sys.modules)
        """
    )
    result = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=60, check=False
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "False"
    assert not run_dir.exists()


def test_records_spanning_several_blocks_read_back(tmp_path: Path) -> None:
    notes = "x" * 70_000  # one config record: FIRST, MIDDLE, LAST chunks over 32 KiB blocks
    logger = WandbLogger(
        run_dir=tmp_path, mode="offline", project="p", entity="", run_id="big", name="big",
        config={"notes": notes},
    )
    log_rows(logger, loss_rows(range(400)))
    logger.finish()

    (path,) = find_offline_runs(tmp_path)
    assert path.stat().st_size > 3 * 32 * 1024
    run = read_run(path)
    assert run.user_config() == {"notes": notes}
    assert run.user_history() == loss_rows(range(400))


def test_system_metrics_console_and_x_axes_are_on_by_default(tmp_path: Path) -> None:
    """What a GPU run needs on its W&B page: System panels (stats records), a Logs tab (console
    output), and every metric charted against `step`, with `tokens_seen` as the other x-axis."""
    logger = make_logger(tmp_path, system_metrics_interval_s=0.2)
    print("rank 0: step 1 loss 10.0")
    print("rank 0: a warning", file=sys.stderr)
    for step in (1, 2):
        logger.log({"train/loss": 1.0 / step, "train/mfu": 0.4}, step=step, tokens_seen=step * 512)
    time.sleep(1.0)  # a few samples
    logger.finish()

    run = read_runs(tmp_path)
    assert run.stats, "no system-metric samples"
    assert all(isinstance(value, (int, float)) for sample in run.stats for value in sample.values())
    assert any("proc.memory.rssMB" in sample for sample in run.stats)
    assert "rank 0: step 1 loss 10.0" in run.console_text("stdout")
    assert "rank 0: a warning" in run.console_text("stderr")
    (output_log,) = tmp_path.glob("wandb/offline-run-*/files/output.log")
    assert "rank 0: step 1 loss 10.0" in output_log.read_text()
    assert run.metric_definitions == [{"name": "step"},
                                      {"name": "tokens_seen", "step_metric": "step"},
                                      {"glob_name": "*", "step_metric": "step"}]
    assert run.user_history() == [
        {"train/loss": 1.0, "train/mfu": 0.4, "step": 1, "tokens_seen": 512},
        {"train/loss": 0.5, "train/mfu": 0.4, "step": 2, "tokens_seen": 1024}]


def test_system_metrics_and_console_can_be_switched_off(tmp_path: Path) -> None:
    logger = WandbLogger(run_dir=tmp_path, mode="offline", project="p", entity="", run_id="quiet",
                         name="quiet", config={}, system_metrics=False, console=False)
    print("not captured")
    log_rows(logger, loss_rows(range(2)))
    logger.finish()

    run = read_runs(tmp_path)
    assert run.stats == [] and run.console == []
    assert not list(tmp_path.glob("wandb/offline-run-*/files/output.log"))
    assert run.user_history() == loss_rows(range(2))


def test_run_rows_become_namespaced_wandb_keys() -> None:
    from training.loggers import wandb_values

    row = {"kind": "train", "step": 7, "loss": 2.5, "mfu": 0.31, "mem_peak_gib": 11.5,
           "tokens_per_s": 1e5, "tokens_seen": 7168, "nonfinite": True, "note": "x"}
    assert wandb_values(row) == {"train/loss": 2.5, "train/mfu": 0.31, "train/mem_peak_gib": 11.5,
                                 "train/tokens_per_s": 1e5, "train/nonfinite": True}
    assert wandb_values({"kind": "eval", "step": 7, "val_loss": 2.7}) == {"eval/val_loss": 2.7}


def test_per_rank_memory_is_one_series_per_rank_with_its_peak_kept(tmp_path: Path) -> None:
    """Each rank's memory charted against `step` as `memory/<stat>/rank<r>` (one W&B section, a
    regex `memory/mem_peak_gib/rank.*` overlays the ranks), its maximum in the run summary."""
    from training.loggers import wandb_values
    from training.metrics import memory_fields

    logger = make_logger(tmp_path, system_metrics=False, console=False)
    peaks = {1: [1.5, 2.0], 2: [3.0, 1.0], 3: [2.5, 2.5]}  # rank 0, rank 1 per step
    for step, per_rank in peaks.items():
        row = {"kind": "train", "step": step, "loss": 1.0,
               **memory_fields({"mem_peak_gib": per_rank})}
        assert row["mem_peak_gib"] == max(per_rank)
        logger.log(wandb_values(row), step=step)
    logger.finish()

    run = read_runs(tmp_path)
    assert [(h["step"], h["memory/mem_peak_gib/rank0"], h["memory/mem_peak_gib/rank1"],
             h["train/mem_peak_gib"]) for h in run.user_history()] == [
        (1, 1.5, 2.0, 2.0), (2, 3.0, 1.0, 3.0), (3, 2.5, 2.5, 2.5)]
    assert {"name": "memory/mem_peak_gib/rank1", "step_metric": "step",
            "summary": "max"} in run.metric_definitions  # by name: no glob ordering to lose
    summary = run.user_summary()
    assert summary["memory/mem_peak_gib/rank0"] == {"max": 3.0}
    assert summary["memory/mem_peak_gib/rank1"] == {"max": 2.5}
