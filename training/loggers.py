"""Where metrics go: metrics.jsonl (always), then every tracker behind the one interface of
training/logger_backend.py: W&B (unless disabled), TensorBoard and MLflow (when turned on)."""
from __future__ import annotations

import json
import logging
import threading
import time
from pathlib import Path

from conf.run_dir.metrics_rows import RESUME_ROW_KIND
from conf.run_dir.stragglers import TIME_BY_RANK_KEY
from conf.run_dir.paths import RunDir
from conf.spec import RunSpec
from conf.run_dir.spec_io import spec_to_dict
from training.wandb_logger import per_rank_values

log = logging.getLogger("meshrun.loggers")


class MetricsFile:
    """Appends one JSON object per line and never rewrites the file: a resumed leg starts with
    a resume marker (conf.run_dir.metrics_rows.RESUME_ROW_KIND); readers drop the rows it
    supersedes."""

    def __init__(self, run_dir: Path, *, resume_step: int | None) -> None:
        self.path = RunDir(run_dir).metrics_file
        self.file = open(self.path, "a", buffering=1)
        if resume_step is not None:
            self.file.write(json.dumps({"kind": RESUME_ROW_KIND, "step": resume_step,
                                        "time": round(time.time(), 3)}) + "\n")

    def write(self, row: dict) -> None:
        self.file.write(json.dumps({**row, "time": round(time.time(), 3)}) + "\n")

    def close(self) -> None:
        self.file.close()


PER_RANK_KEY = "mem_by_rank"
"""A train row's per-rank memory, {stat: [rank 0's value, rank 1's, ...]}
(training.metrics.memory_fields); the row's own `mem_*` values are the largest of these."""
TIME_SECTION = "rank_time"
"""W&B section of each rank's step time split: `rank_time/compute_s/rank<r>`, wait_s, ..."""
AXIS_KEYS = ("kind", "step", "tokens_seen")
"""Row keys that are not charted as `<kind>/<key>`: the kind is the namespace, and step and
tokens_seen are the x-axes W&B gets on every row."""


def wandb_values(row: dict) -> dict[str, float]:
    """A metrics row as W&B keys: `train/loss`, `train/mfu`, `train/mem_peak_gib` (the largest
    of any rank), `eval/val_loss`, ...; numbers only; and each rank's memory as
    `memory/mem_peak_gib/rank<r>` (wandb_logger.per_rank_values). A key already holding a
    `/` keeps its name (`eval/<task>/acc`, conf.eval_tasks.metric_key)."""
    return {**{k if "/" in k else f"{row['kind']}/{k}": v for k, v in row.items()
               if k not in AXIS_KEYS and isinstance(v, (int, float))},
            **per_rank_values(row.get(PER_RANK_KEY, {})),
            **per_rank_values(row.get(TIME_BY_RANK_KEY, {}), section=TIME_SECTION)}


def wandb_summary(summary: dict) -> dict:
    """summary.json's values as W&B's run summary. `train/mfu`, whose W&B summary would be the
    last step's, is set to the run's MFU after warm-up (summary["mfu"],
    conf.run_dir.outcomes.mfu_after_warmup): W&B shows the one MFU compare and status show."""
    values = {k: v for k, v in summary.items() if v is not None}
    if "mfu" in values:
        values["train/mfu"] = values["mfu"]
    return values


def start_wandb(spec: RunSpec, run_dir: Path):
    """The run's WandbLogger (training.wandb_logger), started now; disabled costs nothing."""
    from training.wandb_logger import WandbLogger

    run_id = RunDir(run_dir).wandb_id_file.read_text().strip()
    return WandbLogger(run_dir=run_dir, mode=spec.logging.wandb_mode.value,
                       project=spec.logging.wandb_project,
                       entity=spec.logging.wandb_entity, run_id=run_id,
                       name=run_dir.name, config=spec_to_dict(spec),
                       group=spec.logging.wandb_group,
                       tags=spec.logging.wandb_tags,
                       system_metrics=spec.logging.wandb_system_metrics,
                       system_metrics_interval_s=spec.logging.wandb_system_metrics_interval_s,
                       console=spec.logging.wandb_console)


class BackgroundWandb:
    """`start_wandb` in a thread, so W&B's start-up (import wandb, the wandb-core process, the
    run: 1-2 s offline on a busy CPU host) overlaps the model build instead of preceding the
    first step.

    Made by the rank entry (training.main), started by build_train_state once the CPU peak is
    timed (`start()`), handed to RunLoggers, whose first W&B call waits for it (`logger()`,
    which raises what the start raised). `abandon()` closes a run the loggers never took over
    as failed; the entry calls it after logging the failure, so the log's last line stays the
    error even when torchrun stops this rank while W&B is still starting."""

    def __init__(self, spec: RunSpec, run_dir: Path) -> None:
        self._logger = None
        self._error: BaseException | None = None
        self._taken = False
        self._elapsed_s = 0.0
        self._thread = threading.Thread(target=self._start, args=(spec, run_dir),
                                        name="meshrun-wandb-start", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def _start(self, spec: RunSpec, run_dir: Path) -> None:
        began = time.perf_counter()
        try:
            self._logger = start_wandb(spec, run_dir)
        except BaseException as exc:  # re-raised in the main thread by logger()
            self._error = exc
        self._elapsed_s = time.perf_counter() - began

    def logger(self):
        waited = time.perf_counter()
        self._thread.join()
        self._taken = True
        if self._error is not None:
            raise self._error
        if self._logger.enabled:
            log.info("W&B started in %.2f s beside the build (then waited for %.2f s)",
                     self._elapsed_s, time.perf_counter() - waited)
        return self._logger

    def abandon(self) -> None:
        """Close the W&B run as failed unless the loggers took it over (they close it)."""
        never_started = not self._thread.is_alive() and self._logger is None
        if self._taken or never_started:  # (or its start failed: no run to close)
            return
        self._thread.join()
        if self._logger is not None:
            self._logger.finish(exit_code=1)


class WandbBackend:
    """W&B behind the LoggerBackend interface (events stay in metrics.jsonl)."""

    name = "W&B"

    def __init__(self, wandb) -> None:
        self.wandb = wandb

    def log(self, values: dict[str, float], *, step: int, tokens_seen: int) -> None:
        self.wandb.log(values, step=step, tokens_seen=tokens_seen)

    def event(self, row: dict) -> None:
        pass

    def finish(self, summary: dict, *, exit_code: int) -> None:
        self.wandb.summary(summary)
        self.wandb.finish(exit_code=exit_code)


def start_trackers(spec: RunSpec, run_dir: Path, *, resume_step: int | None) -> list:
    """TensorBoard and MLflow as turned on, each started in a thread of its own
    (logger_backend.QueuedBackend): a tracker that fails is named once, training goes on."""
    from training.logger_backend import QueuedBackend

    lg, config, trackers = spec.logging, spec_to_dict(spec), []
    if lg.tensorboard:
        from training.tensorboard_logger import TensorBoardLogger

        trackers.append(QueuedBackend("TensorBoard", lambda: TensorBoardLogger(
            RunDir(run_dir).tensorboard_dir, config=config, resume_step=resume_step)))
    if lg.mlflow:
        from training.mlflow_logger import MlflowLogger

        tags = {"meshrun.run_dir": str(run_dir), "meshrun.group": lg.wandb_group,
                "meshrun.tags": ", ".join(lg.wandb_tags)}
        where = lg.mlflow_tracking_uri or "the run dir's store"
        trackers.append(QueuedBackend(f"MLflow ({where})", lambda: MlflowLogger(
            run_dir=run_dir, tracking_uri=lg.mlflow_tracking_uri,
            experiment=lg.mlflow_experiment, config=config,
            tags={k: v for k, v in tags.items() if v})))
    return trackers


class RunLoggers:
    """Fan-out used by rank 0: every row to metrics.jsonl, then to each tracker (W&B,
    TensorBoard, MLflow: training.logger_backend.LoggerBackend); events and the summary too.

    W&B is started here, or taken from a BackgroundWandb started earlier (training.main), whose
    start is waited for at the first W&B call only; its failure to start raises. TensorBoard and
    MLflow start here, in threads of their own; their failures are only named in the log."""

    def __init__(self, spec: RunSpec, run_dir: Path, *, resume_step: int | None,
                 wandb: BackgroundWandb | None = None) -> None:
        self.metrics = MetricsFile(run_dir, resume_step=resume_step)
        self.tokens_per_step = spec.training.tokens_per_step
        self._pending = wandb
        self._wandb = None if wandb is not None else start_wandb(spec, run_dir)
        self.trackers = start_trackers(spec, run_dir, resume_step=resume_step)

    @property
    def wandb(self):
        if self._wandb is None:
            self._wandb, self._pending = self._pending.logger(), None
        return self._wandb

    def backends(self) -> list:
        """Every tracker; W&B first (its failed start raises here)."""
        return [WandbBackend(self.wandb), *self.trackers]

    def log(self, row: dict) -> None:
        backends = self.backends()  # a failed W&B start raises before the row is written
        self.metrics.write(row)
        values = wandb_values(row)
        for backend in backends:
            backend.log(values, step=row["step"],
                        tokens_seen=row["step"] * self.tokens_per_step)

    def event(self, row: dict) -> None:
        """A row for metrics.jsonl; the trackers get it when it names an event (the run's
        peak and note rows are metrics.jsonl's alone: they have no "event")."""
        self.metrics.write(row)
        if "event" not in row:
            return
        for backend in self.trackers:
            backend.event(row)

    def finish(self, summary: dict, *, exit_code: int = 0) -> None:
        known = {k: v for k, v in summary.items() if v is not None}
        try:
            WandbBackend(self.wandb).finish(wandb_summary(summary), exit_code=exit_code)
        finally:
            for backend in self.trackers:
                backend.finish(known, exit_code=exit_code)
            self.metrics.close()
