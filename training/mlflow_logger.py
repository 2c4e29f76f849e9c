"""MLflow tracking for rank 0 (logging.mlflow), through MLflow's own client (MlflowClient).

- The store: logging.mlflow_tracking_uri, or by default a SQLite file in the run dir
  (<run_dir>/mlflow/mlflow.db, artifacts beside it; MLflow 3 refuses plain file stores). View:
  `mlflow ui --backend-store-uri sqlite:///<run_dir>/mlflow/mlflow.db`.
- The run: experiment logging.mlflow_experiment, named like the run dir. Its id and store go
  into <run_dir>/mlflow_run.json; a resumed leg (a `meshrun resume`, a requeue, an automatic
  restart) continues that run, its steps going on (MLflow keeps every value: a step replayed
  after resuming from an older checkpoint has two points, the later one the leg's).
- Metrics: every value W&B gets, under the same name (`train/loss`,
  `memory/mem_peak_gib/rank1`, ...), at the training step, plus `tokens_seen`. The config:
  the flattened spec as params (`model.dim`, ...; a param a resumed leg changed is kept as
  first logged, MLflow's params being write-once) and spec.json as an artifact. Events: tags
  `event.<step>.<name>` (their extra fields as JSON) and `meshrun.state`. The summary:
  numbers as metrics `summary/<key>`, the rest as tags `summary.<key>`; the run ends FINISHED,
  or FAILED with a non-zero exit code.
- A store that cannot be reached fails fast (MLflow's HTTP retries are cut from 7 to 2 unless
  set in the environment) and QueuedBackend names it once; training goes on.
"""
from __future__ import annotations

import json
import logging
import os
import time
from pathlib import Path
from typing import Any

from conf.run_dir.heartbeats import write_atomically
from conf.run_dir.paths import RunDir
from training.logger_backend import flat_config, numbers

log = logging.getLogger("meshrun.loggers")

HTTP_DEFAULTS = {"MLFLOW_HTTP_REQUEST_MAX_RETRIES": "2",
                 "MLFLOW_HTTP_REQUEST_BACKOFF_FACTOR": "1",
                 "MLFLOW_HTTP_REQUEST_TIMEOUT": "30"}
"""MLflow's own defaults (7 retries, factor 2, 120 s) take minutes to give up on a server that
is down; a user's environment still wins."""
DB_FILE = "mlflow.db"
ARTIFACTS_DIR = "artifacts"
BATCH = 1000
"""Metrics per log_batch call (MLflow's limit); params go 100 at a time."""
PARAM_BATCH = 100
MAX_VALUE_CHARS = 5000
"""Param and tag values are cut to this (MLflow's limits: 6000 and 8000)."""


def default_tracking_uri(run_dir: Path) -> str:
    return f"sqlite:///{RunDir(run_dir).mlflow_dir / DB_FILE}"


class MlflowLogger:
    name = "MLflow"

    def __init__(self, *, run_dir: Path, tracking_uri: str, experiment: str,
                 config: dict[str, Any], tags: dict[str, str]) -> None:
        for key, value in HTTP_DEFAULTS.items():
            os.environ.setdefault(key, value)
        from mlflow.tracking import MlflowClient  # lazy: several seconds, only when wanted

        self.run_dir = Path(run_dir)
        local = not tracking_uri
        if local:
            RunDir(run_dir).mlflow_dir.mkdir(parents=True, exist_ok=True)
        self.tracking_uri = tracking_uri or default_tracking_uri(run_dir)
        self.client = MlflowClient(tracking_uri=self.tracking_uri)
        self.run_id = self._resumed_run_id()
        self.last_step = 0
        if self.run_id is None:
            self.run_id = self._create_run(experiment, tags, local=local)
            self.client.log_dict(self.run_id, config, "spec.json")
        else:
            self.client.update_run(self.run_id, status="RUNNING")
        self._log_params(flat_config(config))

    def _resumed_run_id(self) -> str | None:
        """The run an earlier leg started in this store, if it is still there."""
        path = RunDir(self.run_dir).mlflow_run_file
        if not path.is_file():
            return None
        kept = json.loads(path.read_text())
        if kept.get("tracking_uri") != self.tracking_uri:
            log.warning("MLflow: the run's earlier legs logged to %s, this leg to %s: a new "
                        "MLflow run starts", kept.get("tracking_uri"), self.tracking_uri)
            return None
        from mlflow.exceptions import MlflowException

        try:
            return self.client.get_run(kept["run_id"]).info.run_id
        except MlflowException:
            log.warning("MLflow run %s is gone from %s: a new run starts", kept["run_id"],
                        self.tracking_uri)
            return None

    def _create_run(self, experiment: str, tags: dict[str, str], *, local: bool) -> str:
        experiment_id = self._experiment_id(experiment, local=local)
        run = self.client.create_run(experiment_id, run_name=self.run_dir.name, tags=tags)
        write_atomically(RunDir(self.run_dir).mlflow_run_file, json.dumps(
            {"tracking_uri": self.tracking_uri, "experiment_id": experiment_id,
             "run_id": run.info.run_id}) + "\n")  # a kill mid-write leaves the old file
        return run.info.run_id

    def _experiment_id(self, name: str, *, local: bool) -> str:
        """The experiment's id, created if missing (by another run at the same time too)."""
        from mlflow.exceptions import MlflowException

        found = self.client.get_experiment_by_name(name)
        if found is not None:
            return found.experiment_id
        where = (RunDir(self.run_dir).mlflow_dir / ARTIFACTS_DIR).as_uri() if local else None
        try:
            return self.client.create_experiment(name, artifact_location=where)
        except MlflowException:  # created meanwhile by a sweep's other point
            return self.client.get_experiment_by_name(name).experiment_id

    def _log_params(self, params: dict[str, Any]) -> None:
        from mlflow.entities import Param

        logged = self.client.get_run(self.run_id).data.params
        new = {k: _text(v) for k, v in params.items() if k not in logged}
        changed = sorted(k for k, v in params.items() if k in logged and logged[k] != _text(v))
        if changed:
            log.info("MLflow params are write-once; kept as first logged: %s", ", ".join(changed))
        items = [Param(k, v) for k, v in new.items()]
        for i in range(0, len(items), PARAM_BATCH):
            self.client.log_batch(self.run_id, params=items[i:i + PARAM_BATCH])

    def log(self, values: dict[str, float], *, step: int, tokens_seen: int) -> None:
        self._metrics({**values, "tokens_seen": tokens_seen}, step=step)
        self.last_step = step

    def _metrics(self, values: dict[str, float], *, step: int) -> None:
        from mlflow.entities import Metric

        now_ms = int(time.time() * 1000)
        items = [Metric(k, float(v), now_ms, step) for k, v in values.items()]
        for i in range(0, len(items), BATCH):
            self.client.log_batch(self.run_id, metrics=items[i:i + BATCH])

    def event(self, row: dict[str, Any]) -> None:
        extra = {k: v for k, v in row.items() if k not in ("kind", "event", "step")}
        self.client.set_tag(self.run_id, f"event.{row['step']}.{row['event']}",
                            _text(json.dumps(extra)))
        self.client.set_tag(self.run_id, "meshrun.state", str(row["event"]))

    def finish(self, summary: dict[str, Any], *, exit_code: int) -> None:
        step = int(summary.get("steps_done") or self.last_step)
        self._metrics({f"summary/{k}": v for k, v in numbers(summary).items()}, step=step)
        for key, value in summary.items():
            if key not in numbers(summary):
                self.client.set_tag(self.run_id, f"summary.{key}", _text(value))
        self.client.set_terminated(self.run_id, status="FINISHED" if exit_code == 0
                                   else "FAILED")


def _text(value: Any) -> str:
    text = value if isinstance(value, str) else json.dumps(value)
    return text[:MAX_VALUE_CHARS]
