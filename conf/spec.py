"""The frozen, fully resolved run spec: what the ranks read from spec.json.

Every "auto" is filled in, every cross-field rule has been checked (conf/resolve.py). Each
section is derived from its schema dataclass by `frozen_from`: the knobs are declared and
documented once, in conf/schema.py. A section's class body declares only what resolution adds
or changes (with a docstring saying what), plus properties.
"""
from __future__ import annotations

import dataclasses
import math
import typing
from typing import Callable

from conf.degrees import DEGREES
from conf.schema import (
    CheckpointConfig, ClusterConfig, DataConfig, DeviceKind, DType, EvalConfig, EvalTaskConfig,
    LoggingConfig, ModelConfig, MoeConfig, OptimConfig, ParallelConfig, Precision,
    PrecisionConfig, RecomputeConfig,
    RecomputeMode, RopeScaling, ScheduleConfig, TrainingConfig,
)

FROZEN = dict(frozen=True, slots=True, kw_only=True)

TOKEN_DTYPES = {"uint8": 1, "uint16": 2, "uint32": 4, "int32": 4, "int64": 8}
"""Element types of raw token files (data.dtype): name (numpy's name too) -> bytes per token.
resolve() accepts exactly these and training/data/token_windows.py reads exactly these."""


FIRST_SPEC_JSON_KNOBS = {
    ModelConfig: "name n_layers dim n_heads n_kv_heads ffn_dim vocab_size max_seq_len rope_theta "
                 "tie_embeddings norm_eps init_std",
    PrecisionConfig: "name reduce_dtype loss_scale_init optimizer_state_dtype",
    ParallelConfig: "name dp_replicate dp_shard tp pp cp zero sequence_parallel loss_parallel "
                    "pp_schedule pp_microbatches pp_virtual_stages pp_layer_split cp_balanced",
    RecomputeConfig: "mode",
    ScheduleConfig: "kind warmup_steps min_lr_ratio decay_fraction decay_shape",
    OptimConfig: "name lr beta1 beta2 eps weight_decay grad_clip",
    DataConfig: "kind train_files val_files dtype cache_dir val_every_nth_file",
    TrainingConfig: "steps seq_len micro_batch_size grad_accum_steps global_batch_size seed "
                    "eval_every eval_batches log_every device compile stop_at_step cpu_peak_flops",
    CheckpointConfig: "every_steps keep_last export_safetensors resume_from load_from",
    ClusterConfig: "kind nodes procs_per_node gpus_per_node gpu_name gpu_compute_capability "
                   "partition account qos cpus_per_task mem_gb time_limit_min constraint "
                   "exclusive extra_sbatch setup env container_image container_mounts rdzv_host "
                   "rdzv_port warning_signal max_requeues preflight preflight_timeout_s "
                   "preflight_max_mib python peak_tflops hbm_gbps host_link_gbps "
                   "intra_node_gbps inter_node_gbps intra_node_latency_us "
                   "inter_node_latency_us matmul_efficiency layer_overhead_us tp_overhead_us "
                   "update_overhead_us collective_overhead_us calibration",
    LoggingConfig: "wandb_mode wandb_project wandb_entity wandb_group wandb_tags progress",
}
"""Per schema section, the knobs the frozen spec requires: those it required when this table
replaced the per-knob lists of defaults. Every spec.json holds them (one that lacks one is
broken, not old). The table never grows: a knob added later needs no entry anywhere but its
schema field, and takes its schema default when an older spec.json lacks it."""


def frozen_from(schema: type, *, after: dict[str, str] | None = None) -> Callable[[type], type]:
    """Class decorator: a frozen `slots`, `kw_only` dataclass with every field of `schema`.

    Field types are the schema's, with lists as tuples (Enums stay Enums, dicts stay dicts).
    Fields the class body annotates replace the schema's (same place) or are added (at the
    end, or right after the field `after[name]` names). The knobs of FIRST_SPEC_JSON_KNOBS
    must be given, as resolve() does; every later schema knob keeps its schema default, so a
    spec.json written before the knob existed still reads (conf/run_dir/spec_io.py).
    """
    def build(body: type) -> type:
        hints = typing.get_type_hints(schema)
        own = dict(body.__dict__.get("__annotations__", {}))
        names = list(hints)
        for name in [n for n in own if n not in hints]:
            place = (after or {}).get(name)
            names.insert(names.index(place) + 1 if place else len(names), name)
        body.__annotations__ = {n: own.get(n, _frozen_type(hints.get(n))) for n in names}
        required = FIRST_SPEC_JSON_KNOBS.get(schema, "").split()
        for f in dataclasses.fields(schema):
            if f.name not in required and f.name not in body.__dict__:
                setattr(body, f.name, _frozen_default(f))
        body.__doc__ = ((body.__doc__ or "").rstrip() + "\n\n" if body.__doc__ else "") + (
            f"Fields: {', '.join(names)}; each documented in conf.schema.{schema.__name__}"
            " unless the class body declares it.")
        return dataclasses.dataclass(**FROZEN)(body)
    return build


def _frozen_type(kind: object) -> object:
    if typing.get_origin(kind) is list:
        return tuple[(*typing.get_args(kind), ...)]
    return kind


def _frozen_value(value: object) -> object:
    if isinstance(value, list):
        return tuple(value)
    if isinstance(value, dict):
        return dict(value)
    return value


def _default(f: dataclasses.Field) -> object:
    return f.default_factory() if f.default_factory is not dataclasses.MISSING else f.default


def _frozen_default(f: dataclasses.Field) -> object:
    """The schema default of `f` as a frozen field's default (a dict through a factory)."""
    value = _frozen_value(_default(f))
    if isinstance(value, dict):
        return dataclasses.field(default_factory=lambda: dict(value))
    return value


def spec_from_config(cls: type, config: object, **resolved: object) -> object:
    """The spec section `cls` from its config section: every field the config has (lists as
    tuples), overridden by, and completed with, the `resolved` values."""
    values = {f.name: _frozen_value(getattr(config, f.name)) for f in dataclasses.fields(cls)
              if f.name not in resolved and hasattr(config, f.name)}
    return cls(**values, **resolved)


@dataclasses.dataclass(**FROZEN)
class Llama3RopeScaling:
    """RoPE scaling of Llama 3.1/3.2 (model.rope_scaling=llama3), as the model computes it."""

    factor: float
    low_freq_factor: float
    high_freq_factor: float
    original_max_seq_len: int


@frozen_from(MoeConfig)
class MoeSpec:
    @property
    def enabled(self) -> bool:
        return self.num_experts > 0


@frozen_from(ModelConfig)
class ModelSpec:
    n_kv_heads: int
    """Resolved: never -1 (n_heads when the config said -1)."""
    head_dim: int = 0
    """Resolved: never 0 (dim // n_heads when the config said 0, or spec.json lacks it)."""
    moe: MoeSpec = dataclasses.field(default_factory=MoeSpec)
    path: str
    """Resolved: absolute (or empty); the shape knobs are its config.json's."""

    def __post_init__(self) -> None:
        if self.head_dim == 0 and self.n_heads > 0:
            object.__setattr__(self, "head_dim", self.dim // self.n_heads)

    @property
    def expert_ffn_dim(self) -> int:
        """Inner size of each expert (moe.expert_ffn_dim, or ffn_dim when that is 0)."""
        return self.moe.expert_ffn_dim or self.ffn_dim

    def is_moe_block(self, index: int) -> bool:
        """Whether block `index` has a mixture-of-experts feed-forward."""
        return self.moe.enabled and index >= self.moe.first_dense_layers

    @property
    def llama3_rope(self) -> Llama3RopeScaling | None:
        """The llama3 RoPE scaling settings; None when the frequencies are not scaled."""
        if self.rope_scaling is not RopeScaling.llama3:
            return None
        return Llama3RopeScaling(factor=self.rope_scaling_factor,
                                 low_freq_factor=self.rope_low_freq_factor,
                                 high_freq_factor=self.rope_high_freq_factor,
                                 original_max_seq_len=self.rope_original_max_seq_len)


@frozen_from(PrecisionConfig, after={"compute_dtype": "name"})
class PrecisionSpec:
    name: Precision
    """Resolved: fp32, bf16, fp16 or fp8 (never auto)."""
    compute_dtype: DType
    """Dtype matmuls run in (autocast); fp8 matmuls keep bf16 for everything else."""

    @property
    def uses_loss_scaling(self) -> bool:
        return self.name is Precision.fp16


@frozen_from(ParallelConfig)
class ParallelSpec:
    """Resolved degrees (none is -1); world_size == product of all of them (conf/degrees.py
    says what each degree splits and where its mesh axis goes)."""

    pp_microbatches: int
    """Resolved: never -1 (the number of stages when the config said -1)."""

    @property
    def dp(self) -> int:
        """Ranks that read different data (the batch is split over them)."""
        return self.dp_replicate * self.dp_shard

    @property
    def dp_cp(self) -> int:
        """Ranks that hold different tokens of a step: gradients are averaged over them."""
        return self.dp * self.cp

    @property
    def world_size(self) -> int:
        return math.prod(getattr(self, degree) for degree in DEGREES)

    @property
    def n_stages(self) -> int:
        """Pipeline stages of the whole model: pp x pp_virtual_stages."""
        return self.pp * self.pp_virtual_stages

    @property
    def fsdp_shards(self) -> int:
        """Ranks FSDP (zero 2/3) splits parameters over: dp_shard x cp, whose ranks hold the
        same weights (the mesh's dp_shard_cp axis)."""
        return self.dp_shard * self.cp

    @property
    def expert_fsdp_shards(self) -> int:
        """Ranks the routed experts' FSDP splits them over: the dp x cp ranks that hold the
        same experts (dp_cp / ep; the mesh's efsdp axis)."""
        return self.dp_cp // self.ep

    def cp_share(self, tokens: int) -> int:
        """Tokens of `tokens` (a micro-batch's, a sequence's) that one context-parallel rank
        holds: tokens // cp."""
        return tokens // self.cp

    @property
    def uses_fsdp(self) -> bool:
        return self.zero in (2, 3) and self.dp_cp > 1

    @property
    def uses_ddp(self) -> bool:
        return self.zero in (0, 1) and self.dp_cp > 1


@frozen_from(RecomputeConfig)
class RecomputeSpec:
    def applies_to(self, layer: int) -> bool:
        """The policy covers block `layer` (its index in the whole model, also inside a
        pipeline stage) when layer % every_n_layers == 0: blocks 0, N, 2N, ... torchtitan's
        layer-SAC counts from 1 instead (blocks N-1, 2N-1, ...)."""
        return self.mode is not RecomputeMode.none and layer % self.every_n_layers == 0


@frozen_from(ScheduleConfig)
class ScheduleSpec:
    """Resolved: warmup_steps is never -1 (auto)."""


@frozen_from(OptimConfig)
class OptimSpec:
    pass


@frozen_from(DataConfig)
class DataSpec:
    train_files: tuple[str, ...]
    """Absolute paths, expanded from the glob (files) or the prepared cache (stdlib)."""
    val_files: tuple[str, ...]
    """Absolute paths, as train_files. (cache_dir is resolved to an absolute folder.)"""
    vocab_size: int
    """Token ids are below this (256 for byte-level data)."""
    eos_id: int | None = None
    """Resolved: the token id that ends a document when document_mask is on; else None."""


@frozen_from(TrainingConfig)
class TrainingSpec:
    grad_accum_steps: int
    """Resolved: never -1."""
    global_batch_size: int
    """Resolved: micro_batch_size x grad_accum_steps x dp."""
    device: DeviceKind
    """Resolved: cpu or cuda (never auto)."""
    profile_start_step: int
    """Resolved: never -1 (conf/rules/profile_rules.py fills auto)."""

    @property
    def tokens_per_step(self) -> int:
        return self.global_batch_size * self.seq_len


@frozen_from(CheckpointConfig)
class CheckpointSpec:
    """resume_from and load_from are absolute paths (or empty)."""


@frozen_from(ClusterConfig)
class ClusterSpec:
    """Resolved: procs_per_node, gpus_per_node and cpus_per_task are never -1 (gpus_per_node:
    what the target host has), exclusive is never null."""

    exclusive: bool


@frozen_from(LoggingConfig)
class LoggingSpec:
    pass


@frozen_from(EvalTaskConfig)
class EvalTaskSpec:
    """Resolved: name is never empty, path is absolute."""


@frozen_from(EvalConfig)
class EvalSpec:
    tasks: tuple[EvalTaskSpec, ...] = ()
    """Resolved: each task checked (conf/rules/eval_rules.py)."""


@dataclasses.dataclass(**FROZEN)
class HostSpec:
    """What the launching machine has, probed without torch (launcher/hardware.py)."""

    gpu_name: str
    """Empty when there is no CUDA GPU."""
    gpu_count: int
    compute_capability: float
    """0.0 when there is no CUDA GPU."""
    cpu_count: int
    mem_available_bytes: int = 0
    """Host memory the ranks may take (MemAvailable, or less under a cgroup limit) when the
    ranks run on this machine; 0 = unknown (another machine's, e.g. a Slurm node's)."""


@dataclasses.dataclass(**FROZEN)
class RunSpec:
    name: str
    runs_dir: str
    model: ModelSpec
    precision: PrecisionSpec
    parallel: ParallelSpec
    recompute: RecomputeSpec
    schedule: ScheduleSpec
    optim: OptimSpec
    data: DataSpec
    training: TrainingSpec
    checkpoint: CheckpointSpec
    cluster: ClusterSpec
    logging: LoggingSpec
    host: HostSpec
    eval: EvalSpec = dataclasses.field(default_factory=EvalSpec)

    @property
    def world_size(self) -> int:
        return self.cluster.nodes * self.cluster.procs_per_node
