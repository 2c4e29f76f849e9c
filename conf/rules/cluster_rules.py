"""The rules resolve() checks, one small function per section. Each adds Problems; none raises."""
from __future__ import annotations

import math
from dataclasses import MISSING, fields, is_dataclass, replace
from pathlib import Path
from typing import Callable

from conf.errors import ProblemList
from conf.hf_model_config import is_hf_model_dir
from conf.rundir import CHECKPOINTS_DIR, RunDir, find_checkpoint
from conf.checkpoint_dirs import DCP_METADATA_FILENAME, META_FILENAME, checkpoint_step
from conf.checkpoint_verify import prelaunch_problem
from conf.schema import (
    CheckpointConfig, ClusterConfig, ClusterKind, DataConfig, DataKind, DeviceKind, OptimConfig,
    Precision, RopeScaling, ScheduleConfig, ScheduleKind, TrainingConfig,
)
from conf.spec import TOKEN_DTYPES, HostSpec, ModelSpec, TrainingSpec

FP8_MIN_CC = 8.9
BF16_MIN_CC = 8.0


def divisors(n: int) -> list[int]:
    return [d for d in range(1, n + 1) if n % d == 0] if n > 0 else []


def _positive(problems: ProblemList, section: str, obj: object, names: tuple[str, ...]) -> None:
    for name in names:
        value = getattr(obj, name)
        if value <= 0:
            problems.add(f"{section}.{name}", value, "must be positive", "give a value > 0")


FINITE_RULE = "must be a finite number (nan and inf are refused)"
SEED_MAX = 2**63 - 1


def repair_fields(cfg, problems: ProblemList, check, prefix: str = ""):
    """Walk every field of every config section; `check(f, value, key, problems)` returns True
    when it reported the field as bad. A copy of `cfg` comes back with each bad field replaced
    by its schema default, so the rules after it see sane values (one problem per key)."""
    bad = {}
    for f in fields(cfg):
        value, key = getattr(cfg, f.name), f"{prefix}{f.name}"
        if is_dataclass(value):
            fixed = repair_fields(value, problems, check, prefix=f"{key}.")
            if fixed is not value:
                bad[f.name] = fixed
        elif check(f, value, key, problems):
            bad[f.name] = _schema_default(f)
    return replace(cfg, **bad) if bad else cfg


def _schema_default(f):
    return f.default_factory() if f.default_factory is not MISSING else f.default


def finite_floats(cfg, problems: ProblemList):
    """Every float knob of every section, in one place: NaN slips through any `value <= 0`
    test and inf through any upper-bound-free one, so each non-finite float is reported here
    and replaced by its schema default. A float field added to any schema section is covered
    without being named."""
    return repair_fields(cfg, problems, _non_finite)


def _non_finite(f, value, key: str, problems: ProblemList) -> bool:
    if not isinstance(value, float) or math.isfinite(value):
        return False
    problems.add(key, value, FINITE_RULE,
                 f"give a finite value, e.g. the default {_schema_default(f)}")
    return True


_ITEM_TYPES = {"list[str]": (str,), "list[int]": (int,), "dict[str, str]": (str,)}


def typed_lists(cfg, problems: ProblemList):
    """Every list (and str->str dict) knob holds items of its declared type. OmegaConf lets a
    nested list (`recompute.targets=[[a]]`) into a list[str] field; each such knob is reported
    here and replaced by its schema default, so the other rules see the declared types."""
    return repair_fields(cfg, problems, _mistyped_items)


def _mistyped_items(f, value, key: str, problems: ProblemList) -> bool:
    wanted = _ITEM_TYPES.get(str(f.type).replace("typing.", ""))
    if wanted is None or not isinstance(value, (list, dict)):
        return False
    items = list(value.values()) if isinstance(value, dict) else value
    odd = [v for v in items if not isinstance(v, wanted) or isinstance(v, bool)]
    if not odd:
        return False
    name = wanted[0].__name__
    if isinstance(value, list):
        problems.add(key, value, f"must be a flat list of {name} values (found {odd[0]!r})",
                     f"write {key}=[a,b] (no nested lists)")
    else:
        problems.add(key, value, f"values must be {name} (found {odd[0]!r})",
                     f"give {name} values")
    return True


def check_model(m: ModelSpec, problems: ProblemList) -> None:
    _positive(problems, "model", m, ("n_layers", "dim", "n_heads", "n_kv_heads", "ffn_dim",
                                     "vocab_size", "max_seq_len", "rope_theta", "norm_eps",
                                     "init_std"))
    if m.dim > 0 and m.n_heads > 0 and m.dim % m.n_heads:
        valid = ", ".join(map(str, divisors(m.dim)[:12]))
        problems.add("model.n_heads", m.n_heads, f"must divide model.dim={m.dim}",
                     f"pick a divisor of {m.dim} (e.g. {valid})")
    elif m.n_heads > 0 and m.head_dim % 2:
        problems.add("model.dim", m.dim,
                     f"head dim dim/n_heads={m.head_dim} must be even for RoPE",
                     "change model.dim or model.n_heads")
    if m.rope_scaling is RopeScaling.llama3:
        _check_llama3_rope(m, problems)
    if m.n_heads > 0 and m.n_kv_heads > 0 and m.n_heads % m.n_kv_heads:
        valid = ", ".join(map(str, divisors(m.n_heads)))
        problems.add("model.n_kv_heads", m.n_kv_heads,
                     f"must divide model.n_heads={m.n_heads} (grouped-query attention)",
                     f"use one of {valid}")


def _check_llama3_rope(m: ModelSpec, problems: ProblemList) -> None:
    if m.rope_scaling_factor < 1:
        problems.add("model.rope_scaling_factor", m.rope_scaling_factor,
                     "must be >= 1 (it divides the low RoPE frequencies)", "e.g. 8 or 32")
    _positive(problems, "model", m, ("rope_low_freq_factor", "rope_original_max_seq_len"))
    if m.rope_high_freq_factor <= m.rope_low_freq_factor:
        problems.add("model.rope_high_freq_factor", m.rope_high_freq_factor,
                     f"must exceed model.rope_low_freq_factor={m.rope_low_freq_factor} "
                     "(the blend between them divides by the difference)", "e.g. 4 with 1")


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
    _positive(problems, "training", t, ("steps", "seq_len", "eval_batches", "log_every"))
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
    if t.cpu_peak_flops < 0:
        problems.add("training.cpu_peak_flops", t.cpu_peak_flops, "must be >= 0 (0 = measure)",
                     "give a value >= 0")


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


def check_optim(o: OptimConfig, problems: ProblemList) -> None:
    if o.name != "adamw":
        problems.add("optim.name", o.name, "unknown optimizer", "use optim=adamw")
    _positive(problems, "optim", o, ("lr", "eps"))
    for name in ("beta1", "beta2"):
        value = getattr(o, name)
        if not 0.0 <= value < 1.0:
            problems.add(f"optim.{name}", value, "must be within [0, 1)", "e.g. 0.9 or 0.95")
    for name in ("weight_decay", "grad_clip"):
        if getattr(o, name) < 0:
            problems.add(f"optim.{name}", getattr(o, name), "must be >= 0", "give a value >= 0")


TIME_MODEL_KEYS = ("peak_tflops", "hbm_gbps", "intra_node_gbps", "inter_node_gbps",
                   "intra_node_latency_us", "inter_node_latency_us", "matmul_efficiency",
                   "layer_overhead_us", "tp_overhead_us", "collective_overhead_us",
                   "host_link_gbps", "update_overhead_us")
"""The step-time model's cluster knobs (parallel/cost/step_time.py): 0 or more."""


def check_cluster(c: ClusterConfig, procs: int, host: HostSpec, device: DeviceKind,
                  problems: ProblemList) -> None:
    if c.kind is ClusterKind.local and c.nodes != 1:
        problems.add("cluster.nodes", c.nodes, "cluster=local runs on exactly one node",
                     "use cluster=slurm or cluster=nodes for several nodes")
    elif c.nodes < 1:
        problems.add("cluster.nodes", c.nodes, "must be positive", "give a value >= 1")
    if c.gpu_compute_capability < 0:
        problems.add("cluster.gpu_compute_capability", c.gpu_compute_capability,
                     "must be >= 0 (0 = unknown)", "e.g. 9.0 for H100, 8.0 for A100")
    for key in TIME_MODEL_KEYS:
        if getattr(c, key) < 0:
            problems.add(f"cluster.{key}", getattr(c, key), "must be >= 0 (0 = calibrated or "
                         "the device catalogue)", "give a positive value, or 0")
    if c.matmul_efficiency > 1:
        problems.add("cluster.matmul_efficiency", c.matmul_efficiency,
                     "is a fraction of the peak, at most 1", "e.g. 0.5")
    if procs <= 0:
        problems.add("cluster.procs_per_node", procs, "must be positive, or -1 for auto",
                     "give a value >= 1")
    elif device is DeviceKind.cuda and 0 < host.gpu_count < procs:  # no GPU at all: reported as device
        problems.add("cluster.procs_per_node", procs,
                     f"exceeds the {host.gpu_count} GPU(s) of this machine",
                     f"use cluster.procs_per_node<={host.gpu_count}")


SIGNALS = ("USR1", "USR2", "TERM", "INT", "HUP", "URG")


def check_launch(c: ClusterConfig, problems: ProblemList) -> None:
    """Scheduler and rendezvous settings of slurm and nodes launches."""
    if c.kind is ClusterKind.nodes and not c.rdzv_host:
        problems.add("cluster.rdzv_host", "''", "cluster=nodes needs the rendezvous host",
                     "set cluster.rdzv_host=<address of node 0 that every node can reach>")
    if not 0 <= c.rdzv_port < 65536:
        problems.add("cluster.rdzv_port", c.rdzv_port, "must be a TCP port (0 = derived)",
                     "give 1024..65535, or 0")
    _check_single_line(c, problems)
    if c.kind is not ClusterKind.slurm:
        return
    if c.time_limit_min <= 0:
        problems.add("cluster.time_limit_min", c.time_limit_min, "must be positive",
                     "give the job's time limit in minutes")
    _check_signal(c, problems)
    if c.max_requeues < 0:
        problems.add("cluster.max_requeues", c.max_requeues, "must be >= 0", "e.g. 3")
    for option in c.extra_sbatch:
        if not option.startswith("--") or len(option) < 3:
            problems.add("cluster.extra_sbatch", option, "each entry must be a long sbatch option",
                         "write it as --name=value, e.g. --reservation=big")
    if c.cpus_per_task < -1:
        problems.add("cluster.cpus_per_task", c.cpus_per_task,
                     "must be >= 0 (0 = Slurm's default), or -1 for auto",
                     "give CPUs per rank, e.g. 8, or -1")
    if c.mem_gb < -1:
        problems.add("cluster.mem_gb", c.mem_gb,
                     "must be >= 0 (0 = all of the node's memory), or -1 = the partition's default",
                     "give GB per node, 0 or -1")


GPU_NODE_CPUS_PER_RANK = 8


def slurm_resources(c: ClusterConfig, *, gpus_per_node: int) -> dict:
    """cluster.cpus_per_task and cluster.exclusive with their autos filled (see the schema)."""
    cpus = c.cpus_per_task
    if cpus == -1:
        cpus = GPU_NODE_CPUS_PER_RANK if gpus_per_node > 0 else 0
    exclusive = c.exclusive if c.exclusive is not None else gpus_per_node >= 2
    return {"cpus_per_task": cpus, "exclusive": exclusive}


SINGLE_LINE_KEYS = ("partition", "account", "qos", "constraint", "container_image",
                    "container_mounts", "gpu_name", "rdzv_host", "python")


def _check_single_line(c: ClusterConfig, problems: ProblemList) -> None:
    """Values that end up on #SBATCH or srun lines cannot hold line breaks."""
    values = [(f"cluster.{k}", getattr(c, k)) for k in SINGLE_LINE_KEYS]
    values += [("cluster.extra_sbatch", v) for v in c.extra_sbatch]
    values += [("cluster.setup", v) for v in c.setup]
    for key, value in values:
        if "\n" in value or "\r" in value:
            problems.add(key, repr(value), "must be a single line",
                         "remove the line break (give several setup lines as a list)")


def _check_signal(c: ClusterConfig, problems: ProblemList) -> None:
    name, _, delay = c.warning_signal.partition("@")
    if name not in SIGNALS or not delay.isdigit():
        problems.add("cluster.warning_signal", c.warning_signal,
                     f"must be SIGNAL@SECONDS with SIGNAL one of {', '.join(SIGNALS)}",
                     "e.g. USR1@120")
    elif int(delay) >= c.time_limit_min * 60 > 0:
        problems.add("cluster.warning_signal", c.warning_signal,
                     f"fires {delay} s before the end of a {c.time_limit_min}-minute job, "
                     "i.e. at once", "use a delay shorter than the time limit")


def check_precision(name: Precision, device: DeviceKind, host: HostSpec,
                    problems: ProblemList) -> None:
    cuda = device is DeviceKind.cuda
    if name is Precision.fp8 and (not cuda or host.compute_capability < FP8_MIN_CC):
        if not cuda or host.gpu_count == 0:
            where = "CPU" if not cuda else "a machine with no CUDA GPU"
        else:
            where = f"{host.gpu_name} (cc {host.compute_capability})"
        problems.add("precision", "fp8",
                     f"needs a CUDA GPU of compute capability >= {FP8_MIN_CC}; this run is on {where}",
                     "use precision=bf16 (or fp32 on CPU)")
    if name is Precision.bf16 and cuda and host.compute_capability < BF16_MIN_CC:
        problems.add("precision", "bf16",
                     f"needs compute capability >= {BF16_MIN_CC}; {host.gpu_name} has "
                     f"{host.compute_capability}", "use precision=fp16 or fp32")


def check_checkpoint(c: CheckpointConfig, problems: ProblemList, *, check_paths: bool) -> None:
    if c.every_steps < 0:
        problems.add("checkpoint.every_steps", c.every_steps, "must be >= 0 (0 = only at the end)",
                     "give a value >= 0")
    if c.keep_last < 1:
        problems.add("checkpoint.keep_last", c.keep_last, "must be >= 1", "keep at least 1")
    if c.resume_from and check_paths:
        run_dir = Path(c.resume_from).expanduser()
        if not RunDir(run_dir).is_run_dir:
            problems.add("checkpoint.resume_from", c.resume_from,
                         "is not a meshrun run dir (no spec.json there)",
                         "pass a folder made by `meshrun run`, e.g. runs/<name>-<timestamp>")
    if c.load_from and check_paths and is_hf_model_dir(c.load_from):
        return  # a Hugging Face model folder: weights only, checked against the model in resolve
    if c.load_from and check_paths and find_checkpoint(Path(c.load_from).expanduser()) is None:
        problems.add("checkpoint.load_from", c.load_from,
                     f"{_why_not_a_checkpoint(Path(c.load_from).expanduser())}; a checkpoint "
                     f"is a step_N folder with {META_FILENAME} and DCP's "
                     f"{DCP_METADATA_FILENAME}, or a run dir with {CHECKPOINTS_DIR}/step_N",
                     "pass a run dir or one of its complete step_N folders")
    elif c.load_from and check_paths:
        damaged = prelaunch_problem(Path(c.load_from).expanduser())
        if damaged:
            problems.add("checkpoint.load_from", c.load_from, damaged,
                         "pass an intact checkpoint (or a run dir holding one)")


def _why_not_a_checkpoint(path: Path) -> str:
    if not path.exists():
        return "does not exist"
    if not path.is_dir():
        return "is a file, not a folder"
    if checkpoint_step(path) is not None:
        missing = [n for n in (META_FILENAME, DCP_METADATA_FILENAME) if not (path / n).is_file()]
        return f"is a step_N folder without {' and '.join(missing)} (an interrupted save?)"
    if (path / CHECKPOINTS_DIR).is_dir():
        return f"holds no complete checkpoint under {CHECKPOINTS_DIR}/"
    return f"is neither a step_N folder nor a run dir with {CHECKPOINTS_DIR}/"


def data_files(d: DataConfig, problems: ProblemList, *, check_paths: bool,
               expand: Callable[[str], list[str]]) -> tuple[list[str], list[str]]:
    """Expand data.train_files/val_files (kind=files); other kinds are filled by the launcher."""
    if d.val_every_nth_file < 2:
        problems.add("data.val_every_nth_file", d.val_every_nth_file, "must be >= 2",
                     "e.g. 50 puts every 50th file in validation")
    if d.kind is not DataKind.files:
        return [], []
    if d.dtype not in TOKEN_DTYPES:
        problems.add("data.dtype", d.dtype, "unknown token dtype", f"use one of {', '.join(TOKEN_DTYPES)}")
    found: list[list[str]] = []
    for key, pattern in (("data.train_files", d.train_files), ("data.val_files", d.val_files)):
        files = expand(pattern) if pattern else []
        if not pattern:
            problems.add(key, "''", "is required with data=files", f"set {key}=/path/or/glob")
        elif check_paths and not files:
            problems.add(key, pattern, "matches no file", "check the path or glob")
        found.append(files)
    return found[0], found[1]
