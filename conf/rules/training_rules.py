"""Rules on the batch (micro x accumulation x dp), the training loop's knobs, the LR schedule
and the optimizer."""
from __future__ import annotations

from conf.errors import ProblemList
from conf.rules.field_rules import INT64_MAX, check_positive
from conf.schema import OptimConfig, ScheduleConfig, ScheduleKind, TrainingConfig
from conf.spec import ModelSpec, TrainingSpec

SEED_MAX = 2**63 - 1
SEQ_LEN_MAX = 2**24
"""16,777,216 tokens: above every context anyone has trained (the longest published is 10M
tokens); beyond it the RoPE tables and position ids alone outgrow any device."""


def resolve_batch(t: TrainingConfig, dp: int, problems: ProblemList) -> tuple[int, int]:
    """Return (grad_accum_steps, global_batch_size); rule: global = micro x accum x dp."""
    micro, accum, global_bs = t.micro_batch_size, t.grad_accum_steps, t.global_batch_size
    if micro <= 0:
        problems.add("training.micro_batch_size", micro, "must be positive", "give a value > 0")
        return max(accum, 1), max(global_bs, 1)
    if accum == 0 or accum < -1 or global_bs == 0 or global_bs < -1:
        bad = ("training.grad_accum_steps", accum) if accum == 0 or accum < -1 else (
            "training.global_batch_size", global_bs)
        problems.add(bad[0], bad[1], "must be positive, or -1 for auto", "give a value > 0")
        return max(accum, 1), max(global_bs, 1)
    per_step = micro * dp
    if global_bs == -1:
        accum = 1 if accum == -1 else accum
        return accum, per_step * accum
    if accum == -1:
        if global_bs % per_step:
            problems.add("training.global_batch_size", global_bs,
                         f"must be a multiple of micro_batch_size({micro}) x dp({dp})={per_step}",
                         f"use a multiple of {per_step}, e.g. {per_step * max(1, global_bs // per_step)}")
            return 1, global_bs
        return global_bs // per_step, global_bs
    if micro * accum * dp != global_bs:
        problems.add("training.global_batch_size", global_bs,
                     f"must equal micro_batch_size({micro}) x grad_accum_steps({accum}) x "
                     f"dp({dp})={micro * accum * dp}",
                     "set grad_accum_steps=-1 to derive it, or fix one of the three")
    return accum, global_bs


def check_training(t: TrainingSpec, model: ModelSpec, problems: ProblemList) -> None:
    check_positive(problems, "training", t, ("steps", "seq_len", "eval_batches", "log_every"))
    _check_token_counts(t, model, problems)
    if t.seq_len > model.max_seq_len > 0:
        problems.add("training.seq_len", t.seq_len,
                     f"exceeds model.max_seq_len={model.max_seq_len} ({model.name})",
                     f"use training.seq_len<={model.max_seq_len}")
    if t.eval_every < 0:
        problems.add("training.eval_every", t.eval_every, "must be >= 0 (0 = only at the ends)",
                     "give a value >= 0")
    if not 0 <= t.stop_at_step <= max(t.steps, 0):
        problems.add("training.stop_at_step", t.stop_at_step,
                     f"must be within [0, training.steps={t.steps}] (0 = run to the end)",
                     "give a step within the run")
    if not 0 <= t.seed <= SEED_MAX:
        problems.add("training.seed", t.seed, f"must be within [0, {SEED_MAX}]",
                     "give a non-negative seed, e.g. 1234")
    if t.max_restarts < 0:
        problems.add("training.max_restarts", t.max_restarts, "must be >= 0 (0 = never restart)",
                     "give a value >= 0, e.g. 2")
    if t.hang_timeout_s != -1 and t.hang_timeout_s <= 0:
        problems.add("training.hang_timeout_s", t.hang_timeout_s,
                     "must be > 0 seconds, or -1 (auto: derived from the step time)",
                     "give e.g. training.hang_timeout_s=600, or -1")
    if t.cpu_peak_flops < 0:
        problems.add("training.cpu_peak_flops", t.cpu_peak_flops, "must be >= 0 (0 = measure)",
                     "give a value >= 0")


def _check_token_counts(t: TrainingSpec, model: ModelSpec, problems: ProblemList) -> None:
    """Sequence lengths that mean something, and a run whose token count fits the int64
    counters the loop, the metrics and the checkpoints keep."""
    for key, value in (("training.seq_len", t.seq_len), ("model.max_seq_len", model.max_seq_len)):
        if value > SEQ_LEN_MAX:
            problems.add(key, value, f"exceeds {SEQ_LEN_MAX:,} tokens (2^24), longer than any "
                         "context ever trained", f"use {key}<={SEQ_LEN_MAX}")
    tokens = t.steps * max(t.global_batch_size, 1) * max(t.seq_len, 1)
    if t.steps > 0 and tokens > INT64_MAX:
        most = INT64_MAX // (max(t.global_batch_size, 1) * max(t.seq_len, 1))
        problems.add("training.steps", t.steps,
                     f"the run would train {tokens:.3g} tokens, more than the int64 token "
                     "counter holds (2^63)", f"use training.steps<={most}")


AUTO_WARMUP_MAX_STEPS = 10


def warmup_steps(s: ScheduleConfig, steps: int) -> int:
    """schedule.warmup_steps with -1 (auto) filled: min(10, steps // 10)."""
    if s.warmup_steps == -1:
        return min(AUTO_WARMUP_MAX_STEPS, max(steps, 0) // 10)
    return s.warmup_steps


def check_schedule(s: ScheduleConfig, steps: int, problems: ProblemList) -> None:
    warmup = warmup_steps(s, steps)
    suggested = f"schedule.warmup_steps={min(AUTO_WARMUP_MAX_STEPS, max(steps, 0) // 10)}"
    if warmup < 0:
        problems.add("schedule.warmup_steps", s.warmup_steps, "must be >= 0, or -1 for auto",
                     "give a value >= 0, or -1 (auto: min(10, training.steps // 10))")
    elif warmup > steps > 0:
        problems.add("schedule.warmup_steps", s.warmup_steps,
                     f"exceeds training.steps={steps}",
                     f"set {suggested} (or -1 for auto), or raise training.steps to at least {warmup}")
    if not 0.0 <= s.min_lr_ratio <= 1.0:
        problems.add("schedule.min_lr_ratio", s.min_lr_ratio, "must be within [0, 1]",
                     "e.g. 0.1 ends at a tenth of the peak LR")
    if s.kind == ScheduleKind.wsd:
        if not 0.0 < s.decay_fraction <= 1.0:
            problems.add("schedule.decay_fraction", s.decay_fraction, "must be within (0, 1]",
                         "e.g. 0.2 decays over the last 20% of steps")
        elif 0 <= warmup <= steps and warmup + round(s.decay_fraction * steps) > steps > 0:
            decay = round(s.decay_fraction * steps)
            problems.add("schedule.decay_fraction", s.decay_fraction,
                         f"warmup ({warmup}) + decay ({decay}) steps exceed training.steps={steps}",
                         f"shorten warmup or decay_fraction: e.g. schedule.warmup_steps="
                         f"{max(steps - decay, 0)}, or schedule.decay_fraction="
                         f"{round((steps - warmup) / steps, 3)}")


OPTIMIZERS = ("adamw", "muon")
"""optim.name's choices (training/optim.py builds each)."""


def check_optim(o: OptimConfig, problems: ProblemList) -> None:
    if o.name not in OPTIMIZERS:
        problems.add("optim.name", o.name, "unknown optimizer",
                     f"use {' or '.join(f'optim={n}' for n in OPTIMIZERS)}")
    if not 0.0 <= o.momentum < 1.0:
        problems.add("optim.momentum", o.momentum, "must be within [0, 1)", "e.g. 0.95")
    if not 1 <= o.ns_steps < 100:  # torch.optim.Muon refuses 100 or more
        problems.add("optim.ns_steps", o.ns_steps, "must be within [1, 99]", "e.g. 5")
    check_positive(problems, "optim", o, ("lr", "eps"))
    for name in ("beta1", "beta2"):
        value = getattr(o, name)
        if not 0.0 <= value < 1.0:
            problems.add(f"optim.{name}", value, "must be within [0, 1)", "e.g. 0.9 or 0.95")
    for name in ("weight_decay", "grad_clip"):
        if getattr(o, name) < 0:
            problems.add(f"optim.{name}", getattr(o, name), "must be >= 0", "give a value >= 0")
