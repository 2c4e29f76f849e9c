"""Weights & Biases logging for rank 0 of the training process.

`wandb` is imported only when a run is actually created (mode "offline" or "online"), so a
disabled logger costs nothing and keeps `wandb` out of `sys.modules`.

Design choices:
- `step` (the optimizer step) is the x-axis of every metric via `define_metric`, and is logged as
  an ordinary value; `tokens_seen`, when given, is logged beside it on every row (and defined
  against `step`), so a panel can switch its x-axis to tokens and runs of a sweep with different
  batch sizes line up. W&B's own `_step` counter is left alone: after a resume from a checkpoint
  older than the last logged step, passing `step=` to `run.log` would make W&B drop the replayed
  rows with only a warning (its step must increase); logging `step` as a value keeps them.
- A resumed training run passes the same `run_id` and `run_dir`; `resume="allow"` makes W&B
  continue the same run id (offline, it writes a second `offline-run-*` folder for that id).
- `finish()` also tears down wandb-core, so the run's files are complete when it returns (and
  not left to an atexit hook, which multiprocessing-style launchers may skip). One W&B run per
  process: do not share the process's wandb with another run.
- System metrics (W&B's sampler: CPU, memory, disk, network, and GPU utilisation, memory, power
  and temperature where there are GPUs; it needs the machine metadata probe too) and console
  capture (the Logs tab, `files/output.log`) are on unless `system_metrics=False` /
  `console=False` (`logging.wandb_system_metrics`, `logging.wandb_console`). Measured offline on
  a shared 2-core CPU machine, 5 runs per process: init median 0.25 s (first one 0.6-1.0 s),
  finish 10 ms, the same with them on or off.
- Per-rank memory is charted as `memory/<stat>/rank<r>` (`memory/mem_peak_gib/rank1`, ...): one
  W&B section, one series per rank, each defined against `step` with its maximum kept in the
  summary; a dashboard panel overlays the ranks with the regex `memory/mem_peak_gib/rank.*`.
  `train/mem_peak_gib` stays the largest of any rank, and `train/mfu` the job's MFU.
- Code, git, pip freeze and launch jobs are never collected: the run dir already records the
  command, environment and git sha, and metrics.jsonl is the local source of truth.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

VALID_MODES = ("offline", "online", "disabled")
STEP_METRIC = "step"
TOKENS_METRIC = "tokens_seen"
MEMORY_SECTION = "memory"
DEFAULT_INIT_TIMEOUT_S = 60.0
DEFAULT_SYSTEM_METRICS_INTERVAL_S = 15.0  # W&B's own default


class WandbLogger:
    """Logs metrics, config and summary of one training run to W&B (rank 0 only)."""

    def __init__(
        self,
        *,
        run_dir: Path,
        mode: str,
        project: str,
        entity: str,
        run_id: str,
        name: str,
        config: dict[str, Any],
        group: str = "",
        tags: tuple[str, ...] = (),
        init_timeout_s: float = DEFAULT_INIT_TIMEOUT_S,
        system_metrics: bool = True,
        system_metrics_interval_s: float = DEFAULT_SYSTEM_METRICS_INTERVAL_S,
        console: bool = True,
    ) -> None:
        if mode not in VALID_MODES:
            raise ValueError(f"wandb mode={mode!r}: must be one of {', '.join(VALID_MODES)}")
        self.mode = mode
        self.run_id = run_id
        self._run = None
        self._max_kept: set[str] = set()
        """Per-rank memory keys already defined with their maximum kept in the summary."""
        if mode == "disabled":
            return
        self._run = _init_run(
            run_dir=Path(run_dir),
            mode=mode,
            project=project,
            entity=entity,
            run_id=run_id,
            name=name,
            config=config,
            group=group,
            tags=tags,
            init_timeout_s=init_timeout_s,
            system_metrics=system_metrics,
            system_metrics_interval_s=system_metrics_interval_s,
            console=console,
        )
        _define_x_axes(self._run)

    @property
    def enabled(self) -> bool:
        """True while a W&B run is open (not disabled, not yet finished)."""
        return self._run is not None

    def log(self, metrics: dict[str, Any], step: int, *, tokens_seen: int | None = None) -> None:
        """Log one row of metrics at training step `step` (the x-axis of every chart); with
        `tokens_seen`, the tokens trained on up to that step too (the other x-axis)."""
        if self._run is None:
            return
        axes = {STEP_METRIC: step} if tokens_seen is None else {STEP_METRIC: step,
                                                                 TOKENS_METRIC: tokens_seen}
        self._keep_memory_maxima(metrics)
        self._run.log({**metrics, **axes})

    def _keep_memory_maxima(self, metrics: dict[str, Any]) -> None:
        """Define each new `memory/...` key by name, with its maximum as the summary: a glob
        definition `memory/*` beside the catch-all `*` is matched in no fixed order by W&B
        (one CI run kept the last value instead of the maximum), a named one always wins."""
        for key in metrics:
            if key.startswith(f"{MEMORY_SECTION}/") and key not in self._max_kept:
                self._run.define_metric(key, step_metric=STEP_METRIC, summary="max")
                self._max_kept.add(key)

    def summary(self, values: dict[str, Any]) -> None:
        """Set run summary values (final or best numbers shown in the W&B runs table)."""
        if self._run is None:
            return
        for key, value in values.items():
            self._run.summary[key] = value

    def finish(self, exit_code: int = 0) -> None:
        """Close the run and wait until its data is on disk; safe to call more than once.

        `run.finish()` alone returns before wandb-core has closed the run file (measured: 2 runs
        in 15 read back incomplete right after it), so the service is torn down too (~10 ms).
        """
        if self._run is None:
            return
        run, self._run = self._run, None
        import wandb

        run.finish(exit_code=exit_code)
        wandb.teardown(exit_code=exit_code)

    def __enter__(self) -> WandbLogger:
        return self

    def __exit__(self, exc_type: object, exc: object, tb: object) -> None:
        self.finish(exit_code=0 if exc_type is None else 1)


def _init_run(
    *,
    run_dir: Path,
    mode: str,
    project: str,
    entity: str,
    run_id: str,
    name: str,
    config: dict[str, Any],
    group: str,
    tags: tuple[str, ...],
    init_timeout_s: float,
    system_metrics: bool,
    system_metrics_interval_s: float,
    console: bool,
) -> Any:
    if mode == "offline":
        # wandb-core's own error reporting is the one thing that would reach for the network.
        os.environ.setdefault("WANDB_ERROR_REPORTING", "false")
    import wandb  # lazy: 0.6 s, and never wanted by a disabled logger

    run_dir.mkdir(parents=True, exist_ok=True)
    return wandb.init(
        dir=str(run_dir),
        id=run_id,
        resume="allow",
        mode=mode,
        project=project,
        entity=entity or None,
        name=name or None,
        group=group or None,
        tags=list(tags) or None,
        config=config,
        settings=_build_settings(wandb, mode=mode, init_timeout_s=init_timeout_s,
                                 system_metrics=system_metrics,
                                 system_metrics_interval_s=system_metrics_interval_s,
                                 console=console),
    )


def _build_settings(wandb: Any, *, mode: str, init_timeout_s: float, system_metrics: bool,
                    system_metrics_interval_s: float, console: bool) -> Any:
    return wandb.Settings(
        # "wrap" patches sys.stdout/sys.stderr writes (no fd redirection, no extra process):
        # rank 0's log lines reach the Logs tab and still reach the launcher.
        console="wrap" if console else "off",
        save_code=False,
        disable_code=True,
        disable_git=True,  # the run dir already records the git sha
        disable_job_creation=True,
        x_save_requirements=False,  # no pip freeze
        x_disable_stats=not system_metrics,  # the sampler behind the System panels
        x_disable_meta=not system_metrics,  # host/GPU metadata: without it no stats are sampled
        x_disable_machine_info=not system_metrics,
        x_stats_sampling_interval=system_metrics_interval_s,
        quiet=True,  # online: only the run URL, warnings and errors
        silent=mode == "offline",  # offline: no terminal lines; they go to wandb/debug.log
        init_timeout=init_timeout_s,
    )


def per_rank_values(by_rank: dict[str, list[float]], *, section: str = MEMORY_SECTION
                    ) -> dict[str, float]:
    """{stat: [per rank]} -> W&B keys `<section>/<stat>/rank<r>` (`memory/mem_peak_gib/rank0`,
    `rank_time/compute_s/rank1`): one series per rank."""
    return {f"{section}/{stat}/rank{rank}": value
            for stat, values in by_rank.items() for rank, value in enumerate(values)}


def _define_x_axes(run: Any) -> None:
    run.define_metric(STEP_METRIC)
    run.define_metric(TOKENS_METRIC, step_metric=STEP_METRIC)
    run.define_metric("*", step_metric=STEP_METRIC)
