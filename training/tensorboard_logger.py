"""TensorBoard event files for rank 0 (logging.tensorboard), written with torch's SummaryWriter.

- Every metric W&B gets is a scalar under the same name (`train/loss`, `eval/val_loss`,
  `memory/mem_peak_gib/rank1`, `rank_time/compute_s/rank0`, `tokens_seen`), at the training
  step.
- The config: the HParams dashboard (the flattened spec, `model.dim`, ...) and the whole spec
  as JSON text under `config`, in the run's own event files (no hparams sub-run).
- Events are text under `events` at their step; the summary is text under `summary` and
  scalars `summary/<key>` at the last step.
- One folder per run (<run_dir>/tensorboard), one event file per leg. A resumed leg purges
  what the previous legs wrote after the checkpoint it resumed from (SummaryWriter's
  `purge_step`), so each step shows once, as the last leg trained it, as in metrics.jsonl.
"""
from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from training.logger_backend import flat_config, numbers

HPARAM_METRICS = ("train/loss", "eval/val_loss")
"""The metrics the HParams dashboard shows beside each run's config."""
FLUSH_S = 10
"""Seconds between SummaryWriter flushes (its default 120 leaves a live view behind)."""


class TensorBoardLogger:
    name = "TensorBoard"

    def __init__(self, log_dir: Path, *, config: dict[str, Any], resume_step: int | None) -> None:
        from torch.utils.tensorboard import SummaryWriter  # lazy: 0.6 s, only when wanted

        purge = None if resume_step is None else resume_step + 1
        self.writer = SummaryWriter(log_dir=str(log_dir), purge_step=purge, flush_secs=FLUSH_S)
        self.last_step = resume_step or 0
        if resume_step is None:
            self._write_hparams(config)
        else:
            self.writer.add_text("events", f"**resumed** from the checkpoint of step "
                                 f"{resume_step}", global_step=resume_step)
        self.writer.add_text("config", f"```json\n{json.dumps(config, indent=1)}\n```",
                             global_step=self.last_step)

    def _write_hparams(self, config: dict[str, Any]) -> None:
        from torch.utils.tensorboard.summary import hparams

        values = {k: v if isinstance(v, (int, float, str, bool)) else json.dumps(v)
                  for k, v in flat_config(config).items()}
        file_writer = self.writer._get_file_writer()
        for summary in hparams(values, dict.fromkeys(HPARAM_METRICS, 0.0)):
            file_writer.add_summary(summary)

    def log(self, values: dict[str, float], *, step: int, tokens_seen: int) -> None:
        for key, value in {**values, "tokens_seen": tokens_seen}.items():
            self.writer.add_scalar(key, float(value), global_step=step)
        self.last_step = step

    def event(self, row: dict[str, Any]) -> None:
        extra = {k: v for k, v in row.items() if k not in ("kind", "event", "step")}
        text = f"**{row['event']}** at step {row['step']}"
        self.writer.add_text("events", f"{text}: `{json.dumps(extra)}`" if extra else text,
                             global_step=row["step"])

    def finish(self, summary: dict[str, Any], *, exit_code: int) -> None:
        step = int(summary.get("steps_done") or self.last_step)
        for key, value in numbers(summary).items():
            self.writer.add_scalar(f"summary/{key}", value, global_step=step)
        lines = ["| key | value |", "|---|---|",
                 *(f"| {k} | {v} |" for k, v in summary.items())]
        if exit_code:
            lines.append(f"| exit_code | {exit_code} |")
        self.writer.add_text("summary", "\n".join(lines), global_step=step)
        self.writer.close()
