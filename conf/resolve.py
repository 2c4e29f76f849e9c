"""resolve(): RunConfig (mutable, may hold "auto") -> RunSpec (frozen, complete, checked).

Every cross-field rule lives here. Problems are collected, never raised one by one, so a user
sees all of them at once; `ProblemList.raise_if_any` raises a single ConfigError at the end.
"""
from __future__ import annotations

import glob
import os
from pathlib import Path

from conf import rules
from conf.errors import ProblemList
from conf.layout_rules import check_layout, check_recompute
from conf.parallel_rules import resolve_parallel
from conf.schema import ClusterConfig, ClusterKind, DeviceKind, DType, Precision, RunConfig
from conf.spec import (
    CheckpointSpec, ClusterSpec, DataSpec, HostSpec, LoggingSpec, ModelSpec, OptimSpec,
    PrecisionSpec, RecomputeSpec, RunSpec, ScheduleSpec, TrainingSpec,
)

BYTE_VOCAB = 256
CPU_DEFAULT_PROCS = 2


def resolve(cfg: RunConfig, *, host: HostSpec, check_paths: bool = True) -> RunSpec:
    """Fill every auto value and check every rule; raise one ConfigError listing all problems."""
    problems = ProblemList()
    host = target_host(cfg.cluster, local=host)
    device = _resolve_device(cfg, host, problems)
    model = _resolve_model(cfg, problems)
    procs = _resolve_procs_per_node(cfg, host, device, problems)
    parallel = resolve_parallel(cfg.parallel, world_size=cfg.cluster.nodes * procs,
                                nodes=cfg.cluster.nodes, problems=problems)
    training = _resolve_training(cfg, device, parallel.dp, problems)
    rules.check_model(model, problems)
    rules.check_training(training, model, problems)
    rules.check_schedule(cfg.schedule, training.steps, problems)
    rules.check_optim(cfg.optim, problems)
    rules.check_cluster(cfg.cluster, procs, host, device, problems)
    rules.check_launch(cfg.cluster, problems)
    rules.check_checkpoint(cfg.checkpoint, problems, check_paths=check_paths)
    data = _resolve_data(cfg, model, problems, check_paths=check_paths)
    precision = _resolve_precision(cfg, host, device, problems)
    check_layout(parallel, model=model, training=training, precision=precision,
                 problems=problems)
    check_recompute(cfg.recompute, problems)
    problems.raise_if_any()
    return RunSpec(
        name=cfg.name, runs_dir=str(Path(cfg.runs_dir).expanduser().resolve()), model=model,
        precision=precision, parallel=parallel, recompute=_resolve_recompute(cfg),
        schedule=ScheduleSpec(**vars(cfg.schedule)), optim=OptimSpec(**vars(cfg.optim)),
        data=data, training=training, checkpoint=_resolve_checkpoint(cfg),
        cluster=_resolve_cluster(cfg, procs, host),
        logging=LoggingSpec(**{**vars(cfg.logging), "wandb_tags": tuple(cfg.logging.wandb_tags)}),
        host=host,
    )


def target_host(cluster: ClusterConfig, *, local: HostSpec) -> HostSpec:
    """The machine the ranks run on: this one (local), or what the cluster config describes."""
    if cluster.kind == ClusterKind.local or cluster.gpus_per_node == -1:
        return local
    return HostSpec(gpu_name=cluster.gpu_name, gpu_count=cluster.gpus_per_node,
                    compute_capability=cluster.gpu_compute_capability,
                    cpu_count=max(cluster.cpus_per_task, 1))


def _resolve_cluster(cfg: RunConfig, procs: int, host: HostSpec) -> ClusterSpec:
    c = cfg.cluster
    fields = {k: v for k, v in vars(c).items() if k not in ("kind", "procs_per_node",
                                                              "gpus_per_node")}
    fields.update(extra_sbatch=tuple(c.extra_sbatch), setup=tuple(c.setup), env=dict(c.env))
    return ClusterSpec(kind=c.kind.value, procs_per_node=procs, gpus_per_node=host.gpu_count,
                       **fields)


def _resolve_device(cfg: RunConfig, host: HostSpec, problems: ProblemList) -> str:
    wanted = cfg.training.device
    if wanted == DeviceKind.cuda and host.gpu_count == 0:
        problems.add("training.device", "cuda", "needs a CUDA GPU, and this machine has none",
                     "use training.device=auto or cpu")
    if wanted == DeviceKind.auto:
        return "cuda" if host.gpu_count > 0 else "cpu"
    return wanted.value


def _resolve_model(cfg: RunConfig, problems: ProblemList) -> ModelSpec:
    m = cfg.model
    kv = m.n_heads if m.n_kv_heads == -1 else m.n_kv_heads
    return ModelSpec(name=m.name, n_layers=m.n_layers, dim=m.dim, n_heads=m.n_heads,
                     n_kv_heads=kv, ffn_dim=m.ffn_dim, vocab_size=m.vocab_size,
                     max_seq_len=m.max_seq_len, rope_theta=m.rope_theta,
                     tie_embeddings=m.tie_embeddings, norm_eps=m.norm_eps, init_std=m.init_std)


def _resolve_procs_per_node(cfg: RunConfig, host: HostSpec, device: str,
                            problems: ProblemList) -> int:
    c, p = cfg.cluster, cfg.parallel
    if c.procs_per_node != -1:
        return c.procs_per_node
    degrees = (p.dp_replicate, p.dp_shard, p.tp, p.pp, p.cp)
    if -1 not in degrees and c.nodes > 0:
        product = p.dp_replicate * p.dp_shard * p.tp * p.pp * p.cp
        if product % c.nodes == 0 and product > 0:
            return product // c.nodes
    if device == "cuda":
        return max(host.gpu_count, 1)
    return CPU_DEFAULT_PROCS


def _resolve_training(cfg: RunConfig, device: str, dp: int,
                      problems: ProblemList) -> TrainingSpec:
    t = cfg.training
    accum, global_bs = rules.resolve_batch(t, dp, problems)
    return TrainingSpec(steps=t.steps, seq_len=t.seq_len, micro_batch_size=t.micro_batch_size,
                        grad_accum_steps=accum, global_batch_size=global_bs, seed=t.seed,
                        eval_every=t.eval_every, eval_batches=t.eval_batches,
                        log_every=t.log_every, device=device, compile=t.compile,
                        stop_at_step=t.stop_at_step,
                        cpu_peak_flops=t.cpu_peak_flops)


def _resolve_precision(cfg: RunConfig, host: HostSpec, device: str,
                       problems: ProblemList) -> PrecisionSpec:
    p = cfg.precision
    name = p.name
    if name == Precision.auto:
        bf16_ok = device == "cuda" and host.compute_capability >= 8.0
        name = Precision.bf16 if bf16_ok else (Precision.fp32 if device == "cpu" else Precision.fp16)
    rules.check_precision(name, device, host, problems)
    compute = {Precision.fp32: DType.fp32, Precision.fp16: DType.fp16}.get(name, DType.bf16)
    if p.optimizer_state_dtype is DType.fp16:
        problems.add("precision.optimizer_state_dtype", "fp16",
                     "fp16 moments underflow (AdamW's second moment is a squared gradient)",
                     "use fp32 or bf16")
    return PrecisionSpec(name=name.value, compute_dtype=compute, reduce_dtype=p.reduce_dtype,
                         loss_scale_init=p.loss_scale_init,
                         optimizer_state_dtype=p.optimizer_state_dtype)


def _resolve_recompute(cfg: RunConfig) -> RecomputeSpec:
    r = cfg.recompute
    return RecomputeSpec(mode=r.mode, every_n_layers=r.every_n_layers, targets=tuple(r.targets))


def _resolve_data(cfg: RunConfig, model: ModelSpec, problems: ProblemList, *,
                  check_paths: bool) -> DataSpec:
    d = cfg.data
    train, val = rules.data_files(d, problems, check_paths=check_paths, expand=_expand)
    vocab = BYTE_VOCAB if d.kind.value == "stdlib" else model.vocab_size
    if d.kind.value == "stdlib" and model.vocab_size < BYTE_VOCAB:
        problems.add("model.vocab_size", model.vocab_size,
                     f"byte-level data (data=stdlib) has {BYTE_VOCAB} token ids",
                     f"use model.vocab_size>={BYTE_VOCAB}")
    return DataSpec(kind=d.kind, train_files=tuple(train), val_files=tuple(val), dtype=d.dtype,
                    cache_dir=str(Path(d.cache_dir).expanduser().resolve()),
                    val_every_nth_file=d.val_every_nth_file, vocab_size=vocab)


def _resolve_checkpoint(cfg: RunConfig) -> CheckpointSpec:
    c = cfg.checkpoint
    resume = str(Path(c.resume_from).expanduser().resolve()) if c.resume_from else ""
    load = str(Path(c.load_from).expanduser().resolve()) if c.load_from else ""
    return CheckpointSpec(every_steps=c.every_steps, keep_last=c.keep_last,
                          export_safetensors=c.export_safetensors, resume_from=resume,
                          load_from=load)


def _expand(pattern: str) -> list[str]:
    path = os.path.expanduser(pattern)
    return sorted(str(Path(p).resolve()) for p in glob.glob(path, recursive=True)
                  if Path(p).is_file())
