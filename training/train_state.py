"""Build the parts of a run on one rank: model, optimizer, data, precision, state to resume."""
from __future__ import annotations

import logging
from dataclasses import dataclass, field
from pathlib import Path


from conf.run_dir.paths import RunDir, find_checkpoint
from conf.run_dir.checkpoint_dirs import complete_checkpoints, latest_checkpoint
from conf.hf_model_config import is_hf_model_dir
from conf.hf_weights import loaded_weights_line
from conf.run_dir.metrics_rows import NOTE_ROW_KIND
from conf.spec import RunSpec
from parallel.cost.devices import PeakFlops
from parallel.cost.flops import flops_per_token
from parallel.dims import ParallelDims
from training.checkpoint_saver import CheckpointSaver
from training.run_dir_guard import RunDirGuard
from training.checkpoint import CheckpointCorrupt, CheckpointError, load_checkpoint
from training.data.build import build_train_batches, build_val_batches
from training.dist import RankContext
from training.evals.in_training import TaskEvals
from training.heartbeat import Heartbeat, NoHeartbeat
from training.hf_import import hf_start_dir
from training.parallel_model import ParallelModel, build_parallel_model
from training.loggers import BackgroundWandb, RunLoggers
from training.metrics import peak_row, resolve_peak
from training.optim import build_optimizers
from training.precision import autocast_context, build_grad_scaler
from training.preemption import StopRequest
from training.step_probes import StepProbes, build_step_probes


log = logging.getLogger("meshrun.checkpoint")


@dataclass(kw_only=True)
class TrainState:
    """Everything the loop touches. Built once per rank by `build_train_state`."""

    spec: RunSpec
    run_dir: Path
    ctx: RankContext
    model: ParallelModel
    """This rank's share of the model, its mesh and pipeline schedule."""
    optimizers: list
    train_batches: object
    val_batches: object
    scaler: object
    peak: PeakFlops
    flops_per_token: int
    loggers: RunLoggers | None
    stop: StopRequest = field(default_factory=StopRequest)
    step: int = 0
    stop_agreed: bool = False
    last_saved_step: int = -1
    last_checkpoint: str = ""
    resumed_from: int | None = None
    saver: CheckpointSaver | None = None
    """Built from spec.checkpoint.async_save when not given."""
    run_dir_guard: RunDirGuard | None = None
    """Stops the run if its run dir is removed or replaced (built when not given)."""
    heartbeat: Heartbeat = field(default_factory=NoHeartbeat)
    """This rank's heartbeat (training/heartbeat.py); set by `python -m training`."""
    probes: StepProbes | None = None
    """The profiler window and memory snapshots of this rank; None = none (the loop's one
    test a step). Built by build_train_state once the step to start from is known."""
    task_evals: TaskEvals | None = None
    """The eval tasks (eval.tasks) and their scorer; None without tasks."""

    def __post_init__(self) -> None:
        if self.saver is None:
            self.saver = CheckpointSaver(async_save=self.spec.checkpoint.async_save)
        if self.run_dir_guard is None:
            self.run_dir_guard = RunDirGuard(self.run_dir)

    @property
    def autocast(self):
        return autocast_context(self.spec.precision, self.ctx.device)

    @property
    def checkpoint_root(self) -> Path:
        return RunDir(self.run_dir).checkpoints_dir


def build_train_state(spec: RunSpec, run_dir: Path, ctx: RankContext, *,
                      wandb: BackgroundWandb | None = None) -> TrainState:
    """This rank's state. The CPU peak (MFU) is timed first, with nothing running beside it;
    then rank 0's W&B, if given, starts in the background (loggers.BackgroundWandb),
    overlapping the build; without it W&B starts after the build."""
    peak = resolve_peak(spec, ctx.device)
    if wandb is not None:
        wandb.start()
    state = _build(spec, run_dir, ctx, peak=peak)
    state.probes = build_step_probes(spec.training, run_dir=run_dir, rank=ctx.rank,
                                     device=ctx.device, done_step=state.step)
    if ctx.is_main:
        state.loggers = RunLoggers(spec, run_dir, resume_step=state.resumed_from, wandb=wandb)
        state.loggers.event(peak_row(peak, step=state.resumed_from or 0))
        _note_start_weights(state)
    return state


def _note_start_weights(state: TrainState) -> None:
    """A run that starts from a Hugging Face folder says so once: rank 0's log and the
    launcher's console (a note row of metrics.jsonl)."""
    folder = hf_start_dir(state.spec)
    if not folder or state.resumed_from is not None:
        return
    line = loaded_weights_line(folder, state.spec.model)
    logging.getLogger("meshrun.hf_import").info(line)
    state.loggers.event({"kind": NOTE_ROW_KIND, "step": state.step, "message": line})


def _build(spec: RunSpec, run_dir: Path, ctx: RankContext, *, peak: PeakFlops) -> TrainState:
    model = build_parallel_model(spec, rank=ctx.rank, device=ctx.device)
    dp_rank, dp_size = model.dims.dp_rank(ctx.rank), model.dims.dp
    state = TrainState(
        spec=spec, run_dir=run_dir, ctx=ctx, model=model,
        optimizers=build_optimizers(model, optim=spec.optim,
                                    state_dtype=spec.precision.optimizer_state_dtype),
        train_batches=build_train_batches(spec.data, spec.training, dp_rank=dp_rank,
                                          dp_size=dp_size),
        val_batches=build_val_batches(spec.data, spec.training, dp_rank=dp_rank,
                                      dp_size=dp_size),
        scaler=build_grad_scaler(spec.precision),
        peak=peak,
        flops_per_token=flops_per_token(spec.model, spec.training.seq_len),
        loggers=None,
    )
    if latest_checkpoint(state.checkpoint_root) is not None:
        restore(state)  # this run's own checkpoint: a resume, a requeue, or a restart
    elif spec.checkpoint.load_from and not is_hf_model_dir(spec.checkpoint.load_from):
        # (a Hugging Face folder is weights only, read when the model was materialised)
        restore(state, source=spec.checkpoint.load_from, allow_reshard=True)
    state.task_evals = TaskEvals.build(spec, model=model, device=ctx.device,
                                       autocast=state.autocast)
    state.stop.install(spec.cluster.warning_signal)
    return state


def checkpoint_degrees(spec: RunSpec) -> dict:
    """What must match for an exact resume (per-rank files): world size and degrees."""
    return ParallelDims.from_spec(spec.parallel).checkpoint_degrees()


def _candidates(state: TrainState, source: str) -> list[Path]:
    """Newest first: this run's complete checkpoints, or `source`'s (a run dir: all of its
    complete checkpoints; a step folder: that one only)."""
    if not source:
        return complete_checkpoints(state.checkpoint_root)[::-1]
    found = find_checkpoint(Path(source))
    if found is None or found == Path(source):
        return [found] if found is not None else []
    return complete_checkpoints(found.parent)[::-1]


def _load_newest_intact(state: TrainState, candidates: list[Path], *, allow_reshard: bool):
    """Load the newest candidate that verifies; each damaged one is skipped with a notice.
    Verification precedes any change to the model, so falling back is clean."""
    skipped = []
    for path in candidates:
        try:
            extra = load_checkpoint(path, model=state.model.parts, optimizer=state.optimizers,
                                    degrees=checkpoint_degrees(state.spec),
                                    allow_reshard=allow_reshard)
            return path, extra
        except CheckpointCorrupt as exc:
            skipped.append(str(exc))
            if state.ctx.is_main:
                log.warning("%s; trying the previous checkpoint", exc)
    raise CheckpointError(f"no intact checkpoint left to load: {' | '.join(skipped)}")


def restore(state: TrainState, *, source: str = "", allow_reshard: bool = False) -> None:
    """Load the newest complete, intact checkpoint of this run (or of `source`, a run dir or
    step folder, resharded to this layout): weights, optimizer, data position, RNG, scaler."""
    candidates = _candidates(state, source)
    if not candidates:
        raise FileNotFoundError(f"no complete checkpoint under {source or state.checkpoint_root}")
    path, extra = _load_newest_intact(state, candidates, allow_reshard=allow_reshard)
    state.train_batches.load_state_dict(extra["data"])
    if state.scaler is not None and extra.get("scaler"):
        state.scaler.load_state_dict(extra["scaler"])
    state.step = int(extra["step"])
    if not source:  # the same run continues (W&B resumes); a new run only starts from there
        state.resumed_from = state.step
    state.last_saved_step = state.step
    state.last_checkpoint = str(path)
