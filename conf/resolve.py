"""resolve(): RunConfig (mutable, may hold "auto") -> RunSpec (frozen, complete, checked).

resolve() fills every auto and calls every cross-field rule; the rules themselves live in
conf/rules/, one file per concern (its __init__ lists them), except those that read a file
format, which live beside that format's reader (conf/hf_model_config.py, conf/data_contract/prepared_corpus.py,
conf/data_contract/token_files.py). Problems are collected, never raised one by one, so a user
sees all of them at once; `ProblemList.raise_if_any` raises a single ConfigError at the end.
"""
from __future__ import annotations

import glob
import math
import os
from collections.abc import Collection
from dataclasses import replace
from pathlib import Path

from conf.degrees import DEGREES
from conf.errors import ProblemList
from conf.gpu_generations import known_compute_capability
from conf.rules.family_rules import check_model_family
from conf.hf_model_config import (apply_explicit, check_hf_load_from, check_start_weights,
                                  is_hf_model_dir, read_hf_model_config)
from conf.rules import logging_rules, name_rules
from conf.rules.checkpoint_rules import check_checkpoint
from conf.rules.checkpoint_shape import check_checkpoint_shape
from conf.rules.cluster_rules import (check_cluster, check_launch,
                                      slurm_resources)
from conf.rules.compile_rules import check_compile
from conf.rules.eval_rules import resolve_eval
from conf.rules.expert_rules import check_expert_parallel
from conf.rules.data_rules import data_files
from conf.rules.document_rules import resolve_document_eos
from conf.rules.field_rules import finite_floats, int64_ints, typed_lists
from conf.rules.model_rules import BF16_MIN_CC, check_model, check_precision
from conf.rules.moe_rules import check_moe, moe_config, moe_spec
from conf.rules.parallel_rules import resolve_parallel
from conf.rules.profile_rules import check_profile, profile_start_step
from conf.rules.split_rules import check_model_split, check_recompute
from conf.rules.training_rules import (check_optim, check_schedule, check_training,
                                       resolve_batch, warmup_steps)
from conf.data_contract.prepared_corpus import check_tokenizer, resolve_prepared, resolve_sources
from conf.data_contract.token_files import check_token_files
from conf.data_contract.vocab_inference import with_data_vocab
from conf.schema import (
    ClusterConfig, ClusterKind, DataKind, DeviceKind, DType, Precision, RopeScaling, RunConfig,
)
from conf.spec import (
    CheckpointSpec, ClusterSpec, DataSpec, HostSpec, LoggingSpec, ModelSpec, OptimSpec,
    PrecisionSpec, RecomputeSpec, RunSpec, ScheduleSpec, TrainingSpec, spec_from_config,
)

BYTE_VOCAB = 256
CPU_DEFAULT_PROCS = 2
HF_MODEL_OPTION = "hf"
"""The model group option whose shape comes from model.path (conf/model/hf.yaml)."""


def resolve(cfg: RunConfig, *, host: HostSpec, check_paths: bool = True,
            explicit: Collection[str] = ()) -> RunSpec:
    """Fill every auto value and check every rule; raise one ConfigError listing all problems.
    `explicit`: the keys the user's overrides set (conf.hf_model_config.explicit_model_keys);
    with model.path, an explicit shape knob must agree with that folder's config.json."""
    problems = ProblemList()
    cfg = typed_lists(int64_ints(finite_floats(cfg, problems), problems), problems)
    host = target_host(cfg.cluster, local=host)
    device = _resolve_device(cfg, host, problems)
    model = _resolve_model(cfg, problems, explicit)
    procs = _resolve_procs_per_node(cfg, host, device, problems)
    parallel = resolve_parallel(cfg.parallel, world_size=cfg.cluster.nodes * procs,
                                nodes=cfg.cluster.nodes, problems=problems)
    model = with_data_vocab(model, cfg.data, explicit=explicit, tp=parallel.tp)
    training = _resolve_training(cfg, device, parallel.dp, problems)
    check_model(model, problems)
    check_model_family(model, cfg.recompute, problems)
    check_moe(model, parallel=parallel, checkpoint=cfg.checkpoint, problems=problems)
    check_expert_parallel(parallel, model=model, problems=problems)
    check_training(training, model, problems)
    check_profile(cfg.training, world_size=cfg.cluster.nodes * procs, device=device,
                  problems=problems)
    check_schedule(cfg.schedule, training.steps, problems)
    check_optim(cfg.optim, problems)
    check_cluster(cfg.cluster, procs, host, device, problems)
    check_launch(cfg.cluster, problems)
    check_checkpoint(cfg.checkpoint, problems, check_paths=check_paths)
    if check_paths and cfg.checkpoint.load_from and is_hf_model_dir(cfg.checkpoint.load_from):
        check_hf_load_from(cfg.checkpoint.load_from, model, problems)
    if check_paths:
        check_start_weights(cfg.checkpoint.load_from, model, problems)
    if check_paths and cfg.checkpoint.load_from:
        check_checkpoint_shape(cfg.checkpoint.load_from, model, problems)
    name_rules.check_wandb(cfg.logging, problems)
    logging_rules.check_logging(cfg.logging, problems)
    name_rules.check_paths(cfg, problems, check_paths=check_paths)
    data = _resolve_data(cfg, model, problems, check_paths=check_paths)
    precision = _resolve_precision(cfg, host, device, problems)
    check_model_split(parallel, model=model, training=training, problems=problems)
    check_recompute(cfg.recompute, problems)
    check_compile(compile_=cfg.training.compile, parallel=parallel, recompute=cfg.recompute,
                  problems=problems)
    evals = resolve_eval(cfg.eval, parallel=parallel, data=cfg.data,
                         vocab_size=model.vocab_size, problems=problems, check_paths=check_paths)
    problems.raise_if_any()
    return RunSpec(
        name=cfg.name, runs_dir=_absolute(cfg.runs_dir), model=model, precision=precision,
        parallel=parallel, recompute=spec_from_config(RecomputeSpec, cfg.recompute),
        schedule=spec_from_config(ScheduleSpec, cfg.schedule,
                                  warmup_steps=warmup_steps(cfg.schedule, training.steps)),
        optim=spec_from_config(OptimSpec, cfg.optim), data=data, training=training,
        checkpoint=spec_from_config(
            CheckpointSpec, cfg.checkpoint,
            resume_from=_absolute_or_empty(cfg.checkpoint.resume_from),
            load_from=_absolute_or_empty(cfg.checkpoint.load_from)),
        cluster=spec_from_config(ClusterSpec, cfg.cluster, procs_per_node=procs,
                                 gpus_per_node=host.gpu_count,
                                 **slurm_resources(cfg.cluster, gpus_per_node=host.gpu_count)),
        logging=spec_from_config(LoggingSpec, cfg.logging), host=host, eval=evals,
    )


def target_host(cluster: ClusterConfig, *, local: HostSpec) -> HostSpec:
    """The machine the ranks run on: this one (local), or what the cluster config describes."""
    if cluster.kind == ClusterKind.local or cluster.gpus_per_node == -1:
        return local
    capability = cluster.gpu_compute_capability or known_compute_capability(cluster.gpu_name)
    return HostSpec(gpu_name=cluster.gpu_name, gpu_count=cluster.gpus_per_node,
                    compute_capability=capability, cpu_count=max(cluster.cpus_per_task, 1))


def _resolve_device(cfg: RunConfig, host: HostSpec, problems: ProblemList) -> DeviceKind:
    wanted = cfg.training.device
    if wanted == DeviceKind.cuda and host.gpu_count == 0:
        problems.add("training.device", "cuda", "needs a CUDA GPU, and this machine has none",
                     "use training.device=auto or cpu")
    if wanted is DeviceKind.auto:
        return DeviceKind.cuda if host.gpu_count > 0 else DeviceKind.cpu
    return wanted


def _resolve_model(cfg: RunConfig, problems: ProblemList, explicit: Collection[str]) -> ModelSpec:
    """The model knobs; with model.path, the shape comes from that folder's config.json."""
    m = cfg.model
    if m.name == HF_MODEL_OPTION and not m.path:
        problems.add("model.path", "''", "model=hf reads its shape and weights from a folder",
                     "set model.path=<a Hugging Face model folder (config.json + safetensors)>")
    if m.path:
        knobs = read_hf_model_config(m.path, key="model.path", problems=problems) or {}
        knobs = apply_explicit(knobs, model=m, explicit=explicit, path=m.path, problems=problems)
        if "rope_scaling" in knobs:
            knobs["rope_scaling"] = RopeScaling(knobs["rope_scaling"])
        if isinstance(knobs.get("moe"), dict):
            knobs["moe"] = moe_config(m.moe, knobs["moe"], explicit=explicit, path=m.path,
                                      problems=problems)
        m = replace(m, **knobs, path=_absolute(m.path))
    kv_heads = m.n_heads if m.n_kv_heads == -1 else m.n_kv_heads
    return spec_from_config(ModelSpec, m, n_kv_heads=kv_heads, moe=moe_spec(m.moe))


def _resolve_procs_per_node(cfg: RunConfig, host: HostSpec, device: DeviceKind,
                            problems: ProblemList) -> int:
    c, p = cfg.cluster, cfg.parallel
    if c.procs_per_node != -1:
        return c.procs_per_node
    degrees = [getattr(p, name) for name in DEGREES]
    if -1 not in degrees and c.nodes > 0:
        product = math.prod(degrees)
        if product % c.nodes == 0 and product > 0:
            return product // c.nodes
    if device is DeviceKind.cuda:
        return max(host.gpu_count, 1)
    return CPU_DEFAULT_PROCS


def _resolve_training(cfg: RunConfig, device: DeviceKind, dp: int,
                      problems: ProblemList) -> TrainingSpec:
    accum, global_bs = resolve_batch(cfg.training, dp, problems)
    return spec_from_config(TrainingSpec, cfg.training, grad_accum_steps=accum,
                            global_batch_size=global_bs, device=device,
                            profile_start_step=profile_start_step(cfg.training))


def _resolve_precision(cfg: RunConfig, host: HostSpec, device: DeviceKind,
                       problems: ProblemList) -> PrecisionSpec:
    p = cfg.precision
    name = p.name
    if name == Precision.auto:
        bf16_ok = device is DeviceKind.cuda and host.compute_capability >= BF16_MIN_CC
        name = Precision.bf16 if bf16_ok else (
            Precision.fp32 if device is DeviceKind.cpu else Precision.fp16)
    check_precision(name, device, host, problems)
    compute = {Precision.fp32: DType.fp32, Precision.fp16: DType.fp16}.get(name, DType.bf16)
    if p.loss_scale_init <= 0:
        problems.add("precision.loss_scale_init", p.loss_scale_init, "must be positive",
                     "e.g. 65536 (2**16)")
    if p.optimizer_state_dtype is DType.fp16:
        problems.add("precision.optimizer_state_dtype", "fp16",
                     "fp16 moments underflow (AdamW's second moment is a squared gradient)",
                     "use fp32 or bf16")
    return spec_from_config(PrecisionSpec, p, name=name, compute_dtype=compute)


def _resolve_data(cfg: RunConfig, model: ModelSpec, problems: ProblemList, *,
                  check_paths: bool) -> DataSpec:
    d = cfg.data
    check_tokenizer(d, vocab_size=model.vocab_size, problems=problems)
    before = len(problems.items)
    if d.prepared:
        train, val, dtype = resolve_prepared(d, vocab_size=model.vocab_size, problems=problems,
                                             check_paths=check_paths,
                                             seq_len=cfg.training.seq_len)
        d = replace(d, dtype=dtype, prepared=_absolute(d.prepared))
    elif d.sources:
        train, val, dtype = resolve_sources(d, vocab_size=model.vocab_size, problems=problems,
                                            check_paths=check_paths,
                                            seq_len=cfg.training.seq_len)
        d = replace(d, dtype=dtype, sources=[_absolute(s) for s in d.sources])
    else:
        train, val = data_files(d, problems, check_paths=check_paths, expand=_expand)
    vocab = BYTE_VOCAB if d.kind is DataKind.stdlib else model.vocab_size
    if d.kind is DataKind.files and check_paths and not ((d.prepared or d.sources)
                                                         and len(problems.items) > before):
        for key, files in (("data.train_files", train), ("data.val_files", val)):
            check_token_files(key, files, dtype=d.dtype, seq_len=cfg.training.seq_len,
                              vocab_size=model.vocab_size, problems=problems)
    if d.kind is DataKind.stdlib and model.vocab_size < BYTE_VOCAB:
        problems.add("model.vocab_size", model.vocab_size,
                     f"byte-level data (data=stdlib) has {BYTE_VOCAB} token ids",
                     f"use model.vocab_size>={BYTE_VOCAB}")
    return spec_from_config(DataSpec, d, train_files=tuple(train), val_files=tuple(val),
                            cache_dir=_absolute(d.cache_dir), vocab_size=vocab,
                            tokenizer=_absolute_or_empty(d.tokenizer),
                            eos_id=resolve_document_eos(d, problems))


def _absolute(path: str) -> str:
    """`path` with ~ expanded, made absolute (empty = the working directory)."""
    return str(Path(path).expanduser().resolve())


def _absolute_or_empty(path: str) -> str:
    return _absolute(path) if path else ""


def _expand(pattern: str) -> list[str]:
    path = os.path.expanduser(pattern)
    return sorted(str(Path(p).resolve()) for p in glob.glob(path, recursive=True)
                  if Path(p).is_file())
