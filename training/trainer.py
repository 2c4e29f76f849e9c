"""Build the parts of a run on one rank: model, optimizer, data, precision, state to resume."""
from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path


from conf.rundir import RunDir, find_checkpoint, latest_checkpoint
from conf.spec import RunSpec
from parallel.cost.devices import PeakFlops
from parallel.cost.flops import flops_per_token
from parallel.dims import ParallelDims
from training.checkpoint import load_checkpoint
from training.data import build_train_batches, build_val_batches
from training.dist import RankContext
from training.layout import RankLayout, build_layout
from training.loggers import RunLoggers
from training.metrics import resolve_peak
from training.optim import build_optimizers
from training.precision import autocast_context, build_grad_scaler
from training.preemption import StopRequest


@dataclass(kw_only=True)
class Trainer:
    """Everything the loop touches. Built once per rank by `build_trainer`."""

    spec: RunSpec
    run_dir: Path
    ctx: RankContext
    layout: RankLayout
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

    @property
    def autocast(self):
        return autocast_context(self.spec.precision, self.ctx.device)

    @property
    def checkpoint_root(self) -> Path:
        return RunDir(self.run_dir).checkpoints_dir


def build_trainer(spec: RunSpec, run_dir: Path, ctx: RankContext) -> Trainer:
    layout = build_layout(spec, rank=ctx.rank, device=ctx.device)
    dp_rank, dp_size = layout.dims.dp_rank(ctx.rank), layout.dims.dp
    trainer = Trainer(
        spec=spec, run_dir=run_dir, ctx=ctx, layout=layout,
        optimizers=build_optimizers(layout, optim=spec.optim,
                                    state_dtype=spec.precision.optimizer_state_dtype),
        train_batches=build_train_batches(spec.data, spec.training, dp_rank=dp_rank,
                                          dp_size=dp_size),
        val_batches=build_val_batches(spec.data, spec.training, dp_rank=dp_rank,
                                      dp_size=dp_size),
        scaler=build_grad_scaler(spec.precision),
        peak=resolve_peak(spec, ctx.device),
        flops_per_token=flops_per_token(spec.model, spec.training.seq_len),
        loggers=None,
    )
    if latest_checkpoint(trainer.checkpoint_root) is not None:
        restore(trainer)  # this run's own checkpoint: a resume, a requeue, or a restart
    elif spec.checkpoint.load_from:
        restore(trainer, source=spec.checkpoint.load_from, allow_reshard=True)
    trainer.stop.install(spec.cluster.warning_signal)
    if ctx.is_main:
        trainer.loggers = RunLoggers(spec, run_dir, resume_step=trainer.resumed_from)
    return trainer


def checkpoint_layout(spec: RunSpec) -> dict:
    """What must match for an exact resume (per-rank files): world size and degrees."""
    return ParallelDims.from_spec(spec.parallel).checkpoint_layout()


def restore(trainer: Trainer, *, source: str = "", allow_reshard: bool = False) -> None:
    """Load the newest complete checkpoint of this run (or of `source`, a run dir or step
    folder, resharded to this layout): weights, optimizer, data position, RNG, scaler."""
    path = find_checkpoint(Path(source)) if source else latest_checkpoint(trainer.checkpoint_root)
    if path is None:
        raise FileNotFoundError(f"no complete checkpoint under {source or trainer.checkpoint_root}")
    extra = load_checkpoint(path, model=trainer.layout.parts, optimizer=trainer.optimizers,
                            layout=checkpoint_layout(trainer.spec), allow_reshard=allow_reshard)
    trainer.train_batches.load_state_dict(extra["data"])
    if trainer.scaler is not None and extra.get("scaler"):
        trainer.scaler.load_state_dict(extra["scaler"])
    trainer.step = int(extra["step"])
    if not source:  # the same run continues (W&B resumes); a new run only starts from there
        trainer.resumed_from = trainer.step
    trainer.last_saved_step = trainer.step
    trainer.last_checkpoint = str(path)
