"""The training loop: step, log, evaluate, checkpoint; then the final eval, export, summary."""
from __future__ import annotations

import logging
import math
import sys
import time

import torch

from conf.run_dir.metrics_rows import FAILED_EVENT
from conf.run_dir.paths import RunDir
from conf.schema import NonFinite
from parallel.cost.flops import run_flops_convention
from training.dist import all_reduce_sum, barrier, set_collective_timeout
from conf.run_dir.heartbeats import collective_timeouts_s, hung_in_this_leg
from training.collective_waits import time_collective_waits
from training.evals.in_training import log_task_evals
from training.export import export_hf, gather_full_state
from training.failure_requeue import failure_requeues
from training.fault_injection import kill_if_asked
from training.metrics import StepTimer, memory_by_rank, memory_fields, mfu_fields
from training.rank_times import step_split, time_fields
from training.optim import set_lr
from training.preemption import requeue_job, restart_count, slurm_job_id
from training.schedule import lr_at
from training.router_losses import update_expert_biases
from training.routing_metrics import routing_fields
from training.step import clip_and_step, eval_loss_sum, forward_backward
from training.summary_json import summarize, write_summary
from training.train_state import TrainState, checkpoint_degrees

log = logging.getLogger("meshrun.loop")


def train(tr: TrainState) -> str:
    """Run from tr.step to training.stop_at_step (or training.steps), then wrap up.

    Returns the outcome: "finished", "paused" (stop_at_step), "stopped" or "requeued" (a
    stop signal), "failed" (a non-finite loss with training.nonfinite=stop). W&B is always
    closed here, also on an error: ranks leave with os._exit, so nothing may be left for
    interpreter-exit hooks to flush.
    """
    t = tr.spec.training
    stop = t.stop_at_step or t.steps
    outcome = "paused"
    untime_waits = time_collective_waits(tr.heartbeat)  # each rank's wait under every layout
    try:
        if tr.step == 0:
            evaluate(tr)
        timer = StepTimer(tr.ctx.device)
        while tr.step < stop:
            kill_if_asked(tr.ctx.rank, tr.step + 1)  # tests only (training/fault_injection.py)
            timer.begin()
            tr.heartbeat.take_wait_s()
            row = train_step(tr)
            row["step_time_s"] = timer.elapsed_s()
            tr.heartbeat.end_step(tr.step, row["step_time_s"])
            if tr.step == 1:
                set_collective_timeout(collective_timeouts_s(
                    t.hang_timeout_s, join_timeout_s=tr.spec.cluster.preflight_timeout_s)[1])
            _add_throughput(tr, row)
            if row.get("nonfinite"):
                if t.nonfinite is NonFinite.stop:
                    return fail_nonfinite(tr, row)
                log.warning("step %d: non-finite loss %s or grad norm %s; update skipped",
                            tr.step, row["loss"], row["grad_norm"])
            _after_step(tr, row, stop)
            if tr.probes is not None:  # profiling off: this test is all it costs
                tr.probes = tr.probes.after_step(tr.step)
            if tr.stop_agreed:
                return stop_early(tr)
        if tr.step == t.steps:
            finish(tr)
            outcome = "finished"
        elif tr.loggers is not None:
            tr.loggers.event({"kind": "event", "event": "paused", "step": tr.step})
        return outcome
    finally:
        if tr.probes is not None:  # a leg that ends inside the profile window
            tr.probes.close()
        untime_waits()
        _wait_for_save(tr, failing=sys.exc_info()[0] is not None)
        if tr.loggers is not None:  # paused, stopped or failed: close W&B with what is known
            failed = sys.exc_info()[0] is not None
            tr.loggers.finish({"steps_done": tr.step}, exit_code=1 if failed else 0)
            tr.loggers = None


def stop_early(tr: TrainState) -> str:
    """A rank got a stop signal: checkpoint this step, then requeue (Slurm) or stop. A leg the
    watchdog declared hung is being stopped (or requeued) by it: no save, no requeue, no
    event over `hung`."""
    if hung_in_this_leg(tr.run_dir):
        log.warning("step %d: stopped by the hang watchdog (state hung)", tr.step)
        return "hung"
    if tr.last_saved_step != tr.step:
        save(tr)
    _wait_for_save(tr)  # requeue or stop only once the checkpoint is published
    job_id = slurm_job_id()
    preemptions = restart_count() - failure_requeues(tr.run_dir, job_id) if job_id else 0
    requeue = bool(job_id) and preemptions < tr.spec.cluster.max_requeues
    outcome = "requeued" if requeue else "stopped"
    if tr.loggers is not None:
        tr.loggers.event({"kind": "event", "event": outcome, "step": tr.step,
                          "signal": tr.stop.signal_name or "peer", "restarts": restart_count()})
        # Close W&B before requeueing: Slurm ends this job's processes right after.
        tr.loggers.finish({"steps_done": tr.step})
        tr.loggers = None
    log.warning("step %d: %s after a stop signal", tr.step, outcome)
    if requeue and tr.ctx.is_main:
        requeue_job(job_id)
    barrier()
    return outcome


def fail_nonfinite(tr: TrainState, row: dict) -> str:
    """Every rank saw the same non-finite loss (it is all-reduced): stop without saving or
    exporting, so the newest checkpoint stays the last finite state; record why."""
    _wait_for_save(tr)
    where = tr.last_checkpoint or "none was saved"
    loss, norm = row["loss"], row["grad_norm"]
    what = f"loss {loss}" if not math.isfinite(loss) else f"gradient norm {norm} (loss {loss:.4f})"
    message = (f"step {row['step']}: non-finite {what}; the run stopped, saving and exporting "
               f"nothing (last finite checkpoint: {where}); lower optim.lr or check the data, "
               "then `meshrun resume`")
    log.error(message)
    if tr.loggers is not None:
        tr.loggers.log(row)
        tr.loggers.event({"kind": "event", "event": FAILED_EVENT, "step": row["step"],
                          "loss": row["loss"], "reason": "non-finite loss", "message": message})
        tr.loggers.finish({"steps_done": row["step"], "failed": message}, exit_code=1)
        tr.loggers = None
    barrier()
    return "failed"


def train_step(tr: TrainState) -> dict:
    t, o = tr.spec.training, tr.spec.optim
    lr = lr_at(tr.step, schedule=tr.spec.schedule, peak_lr=o.lr, total_steps=t.steps)
    set_lr(tr.optimizers, lr)
    for part in tr.model.parts:
        part.train()
    micro_batches = tr.train_batches.next_step()
    tr.heartbeat.enter("token-count all_reduce, fwd/bwd grad sync")
    loss = forward_backward(tr.model, micro_batches, device=tr.ctx.device,
                            autocast=tr.autocast, scaler=tr.scaler)
    tr.heartbeat.settle_clocks()
    # The one host sync of the step's loss: reduced before the update, so a non-finite loss
    # (the same value on every rank) is never applied to the weights.
    own_loss = float(loss.local_loss_sum) if tr.model.reports_loss else 0.0
    with tr.heartbeat.collective("loss all_reduce"):
        loss_sum, stop_votes = all_reduce_sum([own_loss, float(tr.stop.requested)],
                                              tr.ctx.device)
    tr.stop_agreed = stop_votes > 0
    mean_loss = loss_sum / loss.global_tokens
    tr.heartbeat.enter("grad-norm all_reduce, optimizer step")
    grad_norm = clip_and_step(tr.model, tr.optimizers, grad_clip=o.grad_clip, scaler=tr.scaler,
                              loss_finite=math.isfinite(mean_loss))
    update_expert_biases(tr.model.parts, group=tr.model.group("dp_cp"))
    tr.step += 1
    row = {"kind": "train", "step": tr.step, "loss": mean_loss, "grad_norm": grad_norm,
           "lr": lr, "tokens": loss.global_tokens}
    if not math.isfinite(mean_loss) or (tr.scaler is None and not math.isfinite(grad_norm)):
        row["nonfinite"] = True  # no update was applied (clip_and_step)
    return row


def _after_step(tr: TrainState, row: dict, stop: int) -> None:
    t, c = tr.spec.training, tr.spec.checkpoint
    tr.run_dir_guard.check(before=f"writing step {tr.step}")
    logged = tr.step % t.log_every == 0 or tr.step == stop
    if logged and tr.spec.model.moe.enabled:
        row.update(routing_fields(tr.model.parts, group=tr.model.group("dp_cp"),
                                  pp_group=tr.model.group("pp")))
    if tr.loggers is not None and logged:
        tr.loggers.log(row)
    if t.eval_every and tr.step % t.eval_every == 0 and tr.step < t.steps:
        evaluate(tr)
    if tr.task_evals is not None and tr.task_evals.due(tr.step) and tr.step < t.steps:
        log_task_evals(tr)
    due = c.every_steps and tr.step % c.every_steps == 0
    if due or tr.step == stop:
        save(tr)


def _add_throughput(tr: TrainState, row: dict) -> None:
    """Tokens/s, MFU, tokens seen and memory (a collective: every rank calls it)."""
    t = tr.spec.training
    tokens_per_s = row.pop("tokens") / row["step_time_s"]
    per_device = tokens_per_s / tr.ctx.world_size
    row.update(tokens_per_s=tokens_per_s, tokens_per_s_per_device=per_device,
               **mfu_fields(tokens_per_s_per_device=per_device,
                            flops_per_token=tr.flops_per_token, peak=tr.peak),
               tokens_seen=tr.step * t.tokens_per_step)
    tr.heartbeat.enter("metrics all_gather")
    by_rank = memory_by_rank(tr.ctx.device, extra=step_split(row["step_time_s"],
                                                              tr.heartbeat.take_wait_s()))
    row.update(time_fields(by_rank, spec=tr.spec), **memory_fields(by_rank))


@torch.no_grad()
def evaluate(tr: TrainState) -> float:
    """Mean token loss over the fixed validation batches of every dp rank."""
    tr.heartbeat.phase("eval")
    for part in tr.model.parts:
        part.eval()
    loss_sum, tokens = 0.0, 0
    for inputs, targets in tr.val_batches:
        batch_loss, batch_tokens = eval_loss_sum(tr.model, inputs, targets,
                                                 device=tr.ctx.device, autocast=tr.autocast)
        if tr.model.reports_loss:
            loss_sum, tokens = loss_sum + batch_loss, tokens + batch_tokens
    with tr.heartbeat.collective("eval loss all_reduce"):
        loss_sum, tokens = all_reduce_sum([loss_sum, float(tokens)], tr.ctx.device)
    tr.heartbeat.phase("step")
    val_loss = loss_sum / tokens
    if tr.loggers is not None:
        tr.loggers.log({"kind": "eval", "step": tr.step, "val_loss": val_loss})
    log.info("step %d: val loss %.4f", tr.step, val_loss)
    return val_loss


def save(tr: TrainState) -> None:
    extra = {"step": tr.step, "data": tr.train_batches.state_dict(),
             "scaler": tr.scaler.state_dict() if tr.scaler is not None else {}}
    metadata = {"world_size": tr.ctx.world_size, "layout": checkpoint_degrees(tr.spec)}
    tr.run_dir_guard.check(before=f"saving the checkpoint of step {tr.step}")
    tr.heartbeat.phase("checkpoint_save")
    tr.saver.save(tr.checkpoint_root, step=tr.step, model=tr.model.parts,
                  optimizer=tr.optimizers, extra=extra, metadata=metadata,
                  keep_last=tr.spec.checkpoint.keep_last)
    tr.heartbeat.phase("step")
    tr.last_checkpoint = tr.saver.last_published or tr.last_checkpoint
    tr.last_saved_step = tr.step
    if tr.saver.in_flight:
        log.info("step %d: checkpoint staged in %.3f s, written in the background", tr.step,
                 tr.saver.stall_s[-1])
    else:
        log.info("step %d: checkpoint %s (%.3f s)", tr.step, tr.last_checkpoint,
                 tr.saver.stall_s[-1])


def _wait_for_save(tr: TrainState, *, failing: bool = False) -> None:
    """The save in flight (checkpoint.async_save) is published before the run ends, stops or
    fails; while failing, its own error is logged, not raised over the first one."""
    try:
        tr.saver.wait()
    except Exception:
        if not failing:
            raise
        log.exception("the checkpoint save in flight failed too")
    tr.last_checkpoint = tr.saver.last_published or tr.last_checkpoint


def finish(tr: TrainState) -> None:
    """Final evaluation, safetensors export, summary (rank 0)."""
    started = time.perf_counter()
    evaluate(tr)
    log_task_evals(tr)
    tr.heartbeat.phase("checkpoint_save")
    _wait_for_save(tr)
    tr.run_dir_guard.check(before="the export and summary")
    tr.heartbeat.phase("export")
    export_dir = ""
    if tr.spec.checkpoint.export_safetensors:
        state = gather_full_state(tr.model)  # collective; the full weights land on rank 0
        if tr.ctx.is_main:
            export_dir = str(export_hf(state, tr.spec.model, RunDir(tr.run_dir).export_dir,
                                       tokenizer=tr.spec.data.tokenizer))
    if tr.loggers is not None:
        tr.loggers.event({"kind": "event", "event": "finished", "step": tr.step})
        summary = summarize(tr.run_dir, peak_source=tr.peak.source,
                            last_checkpoint=tr.last_checkpoint, export_dir=export_dir,
                            flops_convention=run_flops_convention(tr.spec))
        write_summary(tr.run_dir, summary)
        tr.loggers.finish(summary)
        tr.loggers = None
    log.info("finished in %.1f s after the last step", time.perf_counter() - started)
