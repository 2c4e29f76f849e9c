"""The frozen, fully resolved run spec: what the ranks read from spec.json.

Every "auto" is filled in, every cross-field rule has been checked (conf/resolve.py). The knobs
are documented once, in conf/schema.py; fields here that have no twin there say what they are.
"""
from __future__ import annotations

from dataclasses import dataclass

from conf.schema import (
    DataKind,
    DecayShape,
    DType,
    RecomputeMode,
    ScheduleKind,
    WandbMode,
)

FROZEN = dict(frozen=True, slots=True, kw_only=True)


@dataclass(**FROZEN)
class ModelSpec:
    name: str
    n_layers: int
    dim: int
    n_heads: int
    n_kv_heads: int
    ffn_dim: int
    vocab_size: int
    max_seq_len: int
    rope_theta: float
    tie_embeddings: bool
    norm_eps: float
    init_std: float

    @property
    def head_dim(self) -> int:
        return self.dim // self.n_heads


@dataclass(**FROZEN)
class PrecisionSpec:
    name: str
    """Resolved: fp32, bf16, fp16 or fp8 (never auto)."""
    compute_dtype: DType
    """Dtype matmuls run in (autocast); fp8 matmuls keep bf16 for everything else."""
    reduce_dtype: DType
    loss_scale_init: float
    optimizer_state_dtype: DType

    @property
    def uses_loss_scaling(self) -> bool:
        return self.name == "fp16"


@dataclass(**FROZEN)
class ParallelSpec:
    """Resolved degrees; world_size == product of all of them."""

    name: str
    dp_replicate: int
    dp_shard: int
    tp: int
    pp: int
    cp: int
    zero: int
    sequence_parallel: bool
    loss_parallel: bool
    pp_schedule: str
    pp_microbatches: int
    pp_virtual_stages: int
    pp_layer_split: tuple[int, ...]
    cp_balanced: bool

    @property
    def dp(self) -> int:
        return self.dp_replicate * self.dp_shard

    @property
    def world_size(self) -> int:
        return self.dp * self.tp * self.pp * self.cp


@dataclass(**FROZEN)
class RecomputeSpec:
    mode: RecomputeMode
    every_n_layers: int = 1
    targets: tuple[str, ...] = ("ops",)

    def applies_to(self, layer: int) -> bool:
        """The policy covers block `layer` (its index in the whole model, also inside a
        pipeline stage) when layer % every_n_layers == 0: blocks 0, N, 2N, ... torchtitan's
        layer-SAC counts from 1 instead (blocks N-1, 2N-1, ...)."""
        return self.mode != RecomputeMode.none and layer % self.every_n_layers == 0


@dataclass(**FROZEN)
class ScheduleSpec:
    kind: ScheduleKind
    warmup_steps: int
    min_lr_ratio: float
    decay_fraction: float
    decay_shape: DecayShape


@dataclass(**FROZEN)
class OptimSpec:
    name: str
    lr: float
    beta1: float
    beta2: float
    eps: float
    weight_decay: float
    grad_clip: float


@dataclass(**FROZEN)
class DataSpec:
    kind: DataKind
    train_files: tuple[str, ...]
    """Absolute paths, expanded from the glob (files) or the prepared cache (stdlib)."""
    val_files: tuple[str, ...]
    dtype: str
    cache_dir: str
    """Absolute cache folder."""
    val_every_nth_file: int
    vocab_size: int
    """Token ids are below this (256 for byte-level data)."""


@dataclass(**FROZEN)
class TrainingSpec:
    steps: int
    seq_len: int
    micro_batch_size: int
    grad_accum_steps: int
    global_batch_size: int
    seed: int
    eval_every: int
    eval_batches: int
    log_every: int
    device: str
    """Resolved: cpu or cuda."""
    compile: bool
    stop_at_step: int
    cpu_peak_flops: float

    @property
    def tokens_per_step(self) -> int:
        return self.global_batch_size * self.seq_len


@dataclass(**FROZEN)
class CheckpointSpec:
    every_steps: int
    keep_last: int
    export_safetensors: bool
    resume_from: str
    load_from: str


@dataclass(**FROZEN)
class ClusterSpec:
    kind: str
    nodes: int
    procs_per_node: int
    gpus_per_node: int
    gpu_name: str
    gpu_compute_capability: float
    partition: str
    account: str
    qos: str
    cpus_per_task: int
    mem_gb: int
    time_limit_min: int
    constraint: str
    exclusive: bool
    extra_sbatch: tuple[str, ...]
    setup: tuple[str, ...]
    env: dict
    container_image: str
    container_mounts: str
    rdzv_host: str
    rdzv_port: int
    warning_signal: str
    max_requeues: int
    preflight: bool
    preflight_timeout_s: int
    preflight_max_mib: int
    python: str


@dataclass(**FROZEN)
class LoggingSpec:
    wandb_mode: WandbMode
    wandb_project: str
    wandb_entity: str
    wandb_group: str
    wandb_tags: tuple[str, ...]
    progress: bool


@dataclass(**FROZEN)
class HostSpec:
    """What the launching machine has, probed without torch (launcher/hardware.py)."""

    gpu_name: str
    """Empty when there is no CUDA GPU."""
    gpu_count: int
    compute_capability: float
    """0.0 when there is no CUDA GPU."""
    cpu_count: int


@dataclass(**FROZEN)
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

    @property
    def world_size(self) -> int:
        return self.cluster.nodes * self.cluster.procs_per_node
