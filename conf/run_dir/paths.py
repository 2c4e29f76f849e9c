"""The run dir's layout, owned here: every name in it, and `RunDir`, its paths by name.

The launcher, the sweeps, `meshrun status`/`compare` and the ranks all name the run dir's
files through this module, so its layout is written down once::

    <run_dir>/spec.json          the frozen RunSpec every rank reads (conf.run_dir.spec_io
                                 round-trips it)
              config.yaml        the composed Hydra config, for people
              overrides.json     the command-line overrides (`meshrun resume` recomposes from them)
              command.txt        the launch command
              env.json           Python/torch versions, host, git state
              wandb_id.txt       the W&B run id (one W&B run across resumes and requeues)
              mlflow_run.json    the MLflow store and run id (logging.mlflow: one run across legs)
              mlflow/            the default MLflow store (mlflow.db, artifacts/)
              tensorboard/       TensorBoard event files (logging.tensorboard), one per leg
              resumes.jsonl      one line per `meshrun resume` leg: time, the overrides it
                                 was given, the effective overrides it composed from; and
                                 per automatic restart (conf/run_dir/restart_legs.py)
              launcher.lock      held (flock) by the one launcher driving the run: host, pid, start
              logs/rank<R>.log   each rank's log; logs/torchrun.log, logs/launcher.log
              metrics.jsonl      one JSON row per train step / eval / event (rank 0 appends)
              summary.json       the final numbers (rank 0, only when the last step is done)
              preflight.json     the preflight report (rank 0)
              checkpoints/step_<N>/   complete checkpoints (see below)
              export/            the safetensors export (Hugging Face layout)
              profile/           torch.profiler traces, rank<R>.<time>.pt.trace.json
              memory_snapshot/   CUDA allocator snapshots, rank<R>_step<N>.pickle / _oom.pickle
              slurm/jobs.json    the Slurm submissions (slurm/<job id>/ are submitit's folders)

Checkpoint folders and the complete-checkpoint rule: conf/run_dir/checkpoint_dirs.py. The
rows of metrics.jsonl and their reader: conf/run_dir/metrics_rows.py.
"""
from __future__ import annotations

import json
import re
from pathlib import Path

from conf.run_dir.checkpoint_dirs import is_complete_checkpoint, latest_checkpoint
from conf.run_dir.metrics_rows import parse_metrics_line, read_metrics_rows
from conf.run_dir.spec_io import read_spec, write_spec
from conf.spec import RunSpec

SPEC_FILE = "spec.json"
CONFIG_FILE = "config.yaml"
OVERRIDES_FILE = "overrides.json"
COMMAND_FILE = "command.txt"
ENV_FILE = "env.json"
WANDB_ID_FILE = "wandb_id.txt"
MLFLOW_RUN_FILE = "mlflow_run.json"
MLFLOW_DIR = "mlflow"
TENSORBOARD_DIR = "tensorboard"
RESUMES_FILE = "resumes.jsonl"
LOCK_FILE = "launcher.lock"
LOGS_DIR = "logs"
TORCHRUN_LOG = "torchrun.log"
LAUNCHER_LOG = "launcher.log"
METRICS_FILE = "metrics.jsonl"
SUMMARY_FILE = "summary.json"
PREFLIGHT_FILE = "preflight.json"
CHECKPOINTS_DIR = "checkpoints"
EXPORT_DIR = "export"
PROFILE_DIR = "profile"
MEMORY_SNAPSHOT_DIR = "memory_snapshot"
SLURM_DIR = "slurm"
JOBS_FILE = "jobs.json"

LEG_UNPAUSE = "training.stop_at_step=0"
"""stop_at_step pauses one leg of a run: a resumed leg runs on unless told again."""


SAFE_NAME = re.compile(r"[^A-Za-z0-9_.-]+")
"""Characters a run dir's name (and an #SBATCH job name) may not hold; `safe_name` maps them."""


def safe_name(text: str) -> str:
    """`text` reduced to characters safe in paths and #SBATCH lines."""
    return SAFE_NAME.sub("_", text)


def rank_log_name(rank: int) -> str:
    return f"rank{rank}.log"


class RunDir:
    """A run dir's paths by name: `RunDir(path).metrics_file`, `.rank_log(3)`, ..."""

    __slots__ = ("path",)

    def __init__(self, path: Path | str) -> None:
        self.path = Path(path)

    def __repr__(self) -> str:
        return f"RunDir({str(self.path)!r})"

    spec_file = property(lambda self: self.path / SPEC_FILE)
    config_file = property(lambda self: self.path / CONFIG_FILE)
    overrides_file = property(lambda self: self.path / OVERRIDES_FILE)
    command_file = property(lambda self: self.path / COMMAND_FILE)
    env_file = property(lambda self: self.path / ENV_FILE)
    wandb_id_file = property(lambda self: self.path / WANDB_ID_FILE)
    mlflow_run_file = property(lambda self: self.path / MLFLOW_RUN_FILE)
    mlflow_dir = property(lambda self: self.path / MLFLOW_DIR)
    tensorboard_dir = property(lambda self: self.path / TENSORBOARD_DIR)
    resumes_file = property(lambda self: self.path / RESUMES_FILE)
    lock_file = property(lambda self: self.path / LOCK_FILE)
    logs_dir = property(lambda self: self.path / LOGS_DIR)
    torchrun_log = property(lambda self: self.path / LOGS_DIR / TORCHRUN_LOG)
    launcher_log = property(lambda self: self.path / LOGS_DIR / LAUNCHER_LOG)
    metrics_file = property(lambda self: self.path / METRICS_FILE)
    summary_file = property(lambda self: self.path / SUMMARY_FILE)
    preflight_file = property(lambda self: self.path / PREFLIGHT_FILE)
    checkpoints_dir = property(lambda self: self.path / CHECKPOINTS_DIR)
    export_dir = property(lambda self: self.path / EXPORT_DIR)
    profile_dir = property(lambda self: self.path / PROFILE_DIR)
    memory_snapshot_dir = property(lambda self: self.path / MEMORY_SNAPSHOT_DIR)
    slurm_dir = property(lambda self: self.path / SLURM_DIR)
    jobs_file = property(lambda self: self.path / SLURM_DIR / JOBS_FILE)

    def rank_log(self, rank: int) -> Path:
        return self.logs_dir / rank_log_name(rank)

    def rank_logs(self) -> list[Path]:
        """The rank logs written so far, sorted by name."""
        return sorted(self.logs_dir.glob("rank*.log"))

    @property
    def is_run_dir(self) -> bool:
        """A folder made by the launcher: it holds spec.json."""
        return self.spec_file.is_file()

    def read_spec(self) -> RunSpec:
        return read_spec(self.spec_file)

    def write_spec(self, spec: RunSpec) -> None:
        write_spec(spec, self.spec_file)

    def read_overrides(self) -> list[str]:
        return json.loads(self.overrides_file.read_text())

    def read_resumes(self) -> list[dict]:
        """resumes.jsonl, one dict per resumed leg (torn or foreign lines skipped)."""
        if not self.resumes_file.is_file():
            return []
        lines = self.resumes_file.read_text(errors="replace").split("\n")
        return [row for row in map(parse_metrics_line, lines) if row is not None]

    def append_resume(self, *, time: str, overrides: list[str], effective: list[str],
                      extra: dict | None = None) -> None:
        """One leg; `extra`: more keys (an automatic restart's, conf/run_dir/restart_legs.py)."""
        with open(self.resumes_file, "a") as f:
            f.write(json.dumps({"time": time, "overrides": overrides,
                                "effective": effective, **(extra or {})}) + "\n")

    def leg_overrides(self) -> list[str]:
        """The overrides the newest leg ran with (a plain `meshrun resume` continues with
        them): overrides.json, then each resume's, each leg un-pausing the last."""
        effective = self.read_overrides()
        for leg in self.read_resumes():
            effective = leg.get("effective") or (
                effective + [LEG_UNPAUSE] + list(leg.get("overrides", [])))
        return effective

    def read_rows(self) -> list[dict]:
        return read_metrics_rows(self.metrics_file)

    def read_summary(self) -> dict | None:
        """summary.json, or None before the run has finished."""
        path = self.summary_file
        return json.loads(path.read_text()) if path.is_file() else None

    def latest_checkpoint(self) -> Path | None:
        return latest_checkpoint(self.checkpoints_dir)


def find_checkpoint(source: Path) -> Path | None:
    """`source` itself if it is a complete checkpoint, else the newest one of the run dir
    `source` (checkpoint.load_from accepts either)."""
    source = Path(source)
    return source if is_complete_checkpoint(source) else RunDir(source).latest_checkpoint()
