"""W&B started in a thread before the model build (training.loggers.BackgroundWandb) logs exactly
what W&B started in place does; a failed start surfaces at the first log, before any row is
written; a run the loggers never took over is closed as failed, one they took is left to them.
Offline runs, read back."""
from __future__ import annotations

from pathlib import Path

import pytest

from conf.run_dir.paths import RunDir
from tests.support.loop_runs import prepare_run_dir
from tests.support.specs import cpu_spec
from tests.support.wandb_reader import read_runs
from training.loggers import BackgroundWandb, RunLoggers

ROWS = [{"kind": "eval", "step": 0, "val_loss": 5.5},
        {"kind": "train", "step": 1, "loss": 5.25, "lr": 1e-4},
        {"kind": "train", "step": 2, "loss": 5.0, "lr": 2e-4}]


@pytest.fixture(autouse=True)
def _quiet_wandb_env(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in ("WANDB_MODE", "WANDB_RUN_ID", "WANDB_RESUME", "WANDB_DIR", "WANDB_PROJECT"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("WANDB_SILENT", "true")


def offline_run_dir(root: Path):
    spec = cpu_spec("model=tiny", "logging=offline", f"runs_dir={root}",
                    "logging.wandb_system_metrics=false")
    return spec, prepare_run_dir(spec)


def log_all(loggers: RunLoggers) -> None:
    for row in ROWS:
        loggers.log(row)
    loggers.finish({"steps_done": 2})


def test_background_start_logs_what_an_inline_start_logs(tmp_path):
    spec, inline_dir = offline_run_dir(tmp_path / "inline")
    log_all(RunLoggers(spec, inline_dir, resume_step=None))
    spec, background_dir = offline_run_dir(tmp_path / "background")
    started = BackgroundWandb(spec, background_dir)
    started.start()
    assert started._thread.is_alive()  # start() did not wait for W&B (>= 0.2 s)
    log_all(RunLoggers(spec, background_dir, resume_step=None, wandb=started))

    inline, background = read_runs(inline_dir), read_runs(background_dir)
    assert background.user_history() == inline.user_history()
    assert [row["eval/val_loss"] for row in background.user_history()[:1]] == [5.5]
    assert background.user_summary() == inline.user_summary()
    assert background.user_config()["model"] == inline.user_config()["model"]
    assert background.exit_code == 0
    assert RunDir(background_dir).metrics_file.read_text().count("\n") == len(ROWS)


def test_failed_start_raises_at_the_first_log_before_any_row(tmp_path):
    spec, run_dir = offline_run_dir(tmp_path)
    RunDir(run_dir).wandb_id_file.unlink()  # the start cannot read the run's W&B id
    started = BackgroundWandb(spec, run_dir)
    started.start()
    loggers = RunLoggers(spec, run_dir, resume_step=None, wandb=started)
    with pytest.raises(FileNotFoundError, match="wandb"):
        loggers.log(ROWS[0])
    with pytest.raises(FileNotFoundError):  # as the loop's `finally` calls it
        loggers.finish({"steps_done": 0}, exit_code=1)
    assert RunDir(run_dir).metrics_file.read_text() == ""


def test_abandoned_start_closes_the_run_as_failed(tmp_path):
    spec, run_dir = offline_run_dir(tmp_path)
    BackgroundWandb(spec, run_dir).abandon()  # never started: nothing to close, nothing written
    assert not (run_dir / "wandb").exists()
    started = BackgroundWandb(spec, run_dir)
    started.start()
    started.abandon()
    run = read_runs(run_dir)
    assert run.exit_code == 1 and run.user_history() == []
    assert run.user_config()["logging"]["wandb_mode"] == "offline"


def test_abandon_leaves_a_run_the_loggers_took_over_to_them(tmp_path):
    spec, run_dir = offline_run_dir(tmp_path)
    started = BackgroundWandb(spec, run_dir)
    started.start()
    loggers = RunLoggers(spec, run_dir, resume_step=None, wandb=started)
    loggers.log(ROWS[0])
    started.abandon()  # as training.main does when the loop fails after the first log
    loggers.finish({"steps_done": 0})
    run = read_runs(run_dir)
    assert run.exit_code == 0 and run.user_history()[0]["eval/val_loss"] == 5.5
