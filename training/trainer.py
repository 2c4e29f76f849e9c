"""Build the parts of a run on one rank: model, optimizer, data, precision, state to resume."""
from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

import torch

from conf.spec import RunSpec
from parallel.data_parallel import apply_ddp
from parallel.recompute import apply_recompute
from training.accounting import flops_per_token
from training.checkpoint import load_checkpoint
from training.checkpoint_paths import latest_checkpoint
from training.data import build_train_batches, build_val_batches
from training.dist import RankContext
from training.loggers import RunLoggers
from training.metrics import resolve_peak
from training.model import build_model
from training.optim import build_optimizer
from training.peaks import PeakFlops
from training.precision import apply_fp8, autocast_context, build_grad_scaler
from training.preemption import StopRequest

CHECKPOINT_DIR = "checkpoints"


@dataclass(kw_only=True)
class Trainer:
    """Everything the loop touches. Built once per rank by `build_trainer`."""

    spec: RunSpec
    run_dir: Path
    ctx: RankContext
    model: torch.nn.Module
    optimizer: torch.optim.Optimizer
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
        return self.run_dir / CHECKPOINT_DIR


def data_parallel_coordinates(spec: RunSpec, ctx: RankContext) -> tuple[int, int]:
    """(dp rank, dp size). Only data parallelism exists so far: every rank is a dp rank."""
    assert spec.parallel.dp == ctx.world_size, (spec.parallel, ctx.world_size)
    return ctx.rank, spec.parallel.dp


def build_parallel_model(spec: RunSpec, device: torch.device) -> torch.nn.Module:
    """Model on meta -> materialised -> fp8 -> recompute -> compile -> DDP, in that order."""
    model = build_model(spec.model, device=device, seed=spec.training.seed)
    apply_fp8(model, spec.precision)
    apply_recompute(model, recompute=spec.recompute)
    if spec.training.compile:
        for block in model.layers:
            block.compile()
    return apply_ddp(model, parallel=spec.parallel, device=device)


def build_trainer(spec: RunSpec, run_dir: Path, ctx: RankContext) -> Trainer:
    model = build_parallel_model(spec, ctx.device)
    dp_rank, dp_size = data_parallel_coordinates(spec, ctx)
    trainer = Trainer(
        spec=spec, run_dir=run_dir, ctx=ctx, model=model,
        optimizer=build_optimizer(model, optim=spec.optim),
        train_batches=build_train_batches(spec.data, spec.training, dp_rank=dp_rank,
                                          dp_size=dp_size),
        val_batches=build_val_batches(spec.data, spec.training, dp_rank=dp_rank,
                                      dp_size=dp_size),
        scaler=build_grad_scaler(spec.precision, ctx.device),
        peak=resolve_peak(spec, ctx.device),
        flops_per_token=flops_per_token(spec.model, spec.training.seq_len),
        loggers=None,
    )
    if latest_checkpoint(trainer.checkpoint_root) is not None:
        restore(trainer)  # this run's own checkpoint: a resume, a requeue, or a restart
    trainer.stop.install(spec.cluster.warning_signal)
    if ctx.is_main:
        trainer.loggers = RunLoggers(spec, run_dir, resume_step=trainer.resumed_from)
    return trainer


def restore(trainer: Trainer) -> None:
    """Load the newest complete checkpoint: weights, optimizer, data position, RNG, scaler."""
    path = latest_checkpoint(trainer.checkpoint_root)
    if path is None:
        raise FileNotFoundError(f"no complete checkpoint under {trainer.checkpoint_root}")
    extra = load_checkpoint(path, model=trainer.model, optimizer=trainer.optimizer)
    trainer.train_batches.load_state_dict(extra["data"])
    if trainer.scaler is not None and extra.get("scaler"):
        trainer.scaler.load_state_dict(extra["scaler"])
    trainer.step = int(extra["step"])
    trainer.resumed_from = trainer.step
    trainer.last_saved_step = trainer.step
    trainer.last_checkpoint = str(path)
