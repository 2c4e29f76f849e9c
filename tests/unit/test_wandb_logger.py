"""WandbLogger writes exactly what it was given, resumes the same run id, and costs nothing disabled.

Offline runs only (there is no network here); `tests.support.wandb_reader` decodes the `.wandb`
files, so each check compares values, not just "a file appeared".
"""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

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


def make_logger(run_dir: Path, *, mode: str = "offline") -> WandbLogger:
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
