"""Hydra-facing schema: the mutable dataclasses that YAML and overrides compose against (the
model and cluster sections in conf/schema_model.py and conf/schema_cluster.py).

Each knob is documented once, by the docstring under its field; the frozen spec sections
(conf/spec.py) are derived from these classes, not declared again. Choices are the
`StrEnum`s of conf/choices.py.
`-1` means "auto": `resolve()` fills it in.
Schema defaults equal the default group options (conf/config.yaml), so Hydra's `~group`
(delete) falls back to the same values as the default option. Nothing here is
validated across fields; that is `resolve()`'s job (conf/resolve.py).
"""
from __future__ import annotations

from dataclasses import dataclass, field

from conf.choices import (  # noqa: F401 -- re-exported: the schema's field types
    ClusterKind, CompileBackend, CpuPeakMode, DataKind, DecayShape, DeviceKind, DType,
    MuonLrScale, NonFinite, OpsMatmuls, Precision, RecomputeMode, RecomputeTarget, RopeScaling,
    RouterScore, ScheduleKind, WandbMode,
)
from conf.schema_cluster import ClusterConfig  # noqa: F401 -- re-exported: a section
from conf.schema_model import ModelConfig, MoeConfig  # noqa: F401 -- re-exported: sections


@dataclass
class PrecisionConfig:
    name: Precision = Precision.auto
    """Compute precision: auto (bf16 on CUDA, fp32 on CPU), fp32, bf16, fp16, fp8 (CUDA cc>=8.9)."""
    reduce_dtype: DType = DType.fp32
    """Dtype of the data-parallel gradient reduction (fp32 is the safe choice)."""
    loss_scale_init: float = 65536.0
    """fp16 only: initial dynamic loss scale."""
    optimizer_state_dtype: DType = DType.fp32
    """Dtype of AdamW's moment estimates: fp32, or bf16 to halve optimizer memory."""


@dataclass
class ParallelConfig:
    name: str = "ddp"
    """Name of the layout (the `parallel` group option)."""
    dp_replicate: int = -1
    """Data-parallel replicas (DDP, or the replicate axis of HSDP); -1 = world / (the rest)."""
    dp_shard: int = 1
    """Data-parallel ranks that shard state (ZeRO/FSDP axis); -1 = world / (the rest)."""
    tp: int = 1
    """Tensor-parallel degree (Megatron column/row pairs over attention and MLP)."""
    pp: int = 1
    """Pipeline-parallel degree (stages on different ranks)."""
    cp: int = 1
    """Context-parallel degree (the sequence sharded over ranks, exact causal attention)."""
    zero: int = 0
    """ZeRO stage over the dp ranks: 0 replicated (DDP), 1 + optimizer state sharded,
    2 + gradients sharded (FSDP2, parameters kept unsharded from forward to backward),
    3 + parameters sharded (FSDP2, parameters re-sharded after forward)."""
    sequence_parallel: bool = True
    """tp > 1: shard norms and residuals over the sequence between the TP regions (SP)."""
    loss_parallel: bool = False
    """tp > 1: compute cross entropy on vocabulary-sharded logits (no logits all-gather)."""
    pp_schedule: str = "1f1b"
    """Pipeline schedule: gpipe, 1f1b, interleaved_1f1b, looped_bfs, interleaved_zero_bubble."""
    pp_microbatches: int = -1
    """Pipeline micro-batches per training micro-batch; -1 = number of stages (pp x virtual)."""
    pp_virtual_stages: int = 1
    """Stages per pipeline rank (interleaved schedules need 2 or more)."""
    pp_layer_split: list[int] = field(default_factory=list)
    """Blocks per stage, in stage order (sums to model.n_layers); empty = as even as possible."""
    cp_balanced: bool = True
    """cp > 1: give each rank one early and one late chunk so causal work is balanced."""
    ep: int = 1
    """Expert-parallel degree (MoE models): each rank holds E/ep routed experts, tokens go to
    them by all-to-all. Borrows its ranks from dp_shard x cp (must divide it; adds none to the
    world size); the experts' FSDP shards over the other dp x cp / ep ranks. Needs zero 2/3."""
    ep_imbalance: float = 0.0
    """ep > 1, for the plan: tokens the busiest ep rank receives over the mean (1.0 = perfectly
    balanced routing); scales the all-to-all volume and the busiest rank's expert compute in
    the step time, and its experts' activations in the memory plan. 0 = auto: for the step
    time, the value `meshrun plan --calibrate` fitted to this device's MoE runs, else 1.0;
    for memory, 1.0 (set it to plan the busiest rank's memory); a value set wins."""


@dataclass
class RecomputeConfig:
    mode: RecomputeMode = RecomputeMode.none
    """Activation recompute: none; full (re-run whole blocks); selective (re-run the parts
    named in `targets`); offload (keep activations, but in CPU memory)."""
    every_n_layers: int = 1
    """full / selective / offload: apply to every N-th block only (1 = every block)."""
    targets: list[str] = field(default_factory=lambda: ["ops"])
    """selective: what to re-compute in backward. ops (keep matmul and attention outputs,
    re-compute element-wise work), swiglu, norm, attention (the softmax(QK^T)V core), ffn
    (the whole MLP), block (the whole block)."""
    ops_matmuls: OpsMatmuls = OpsMatmuls.all
    """selective ops: which matmul outputs to keep. all (none re-run); alternate (the 1st,
    3rd, 5th ... of each block in call order, re-running the others: torchtitan's op SAC,
    dense families only)."""


@dataclass
class ScheduleConfig:
    kind: ScheduleKind = ScheduleKind.cosine
    """LR schedule after warmup: constant, linear, cosine, wsd (warmup-stable-decay)."""
    warmup_steps: int = -1
    """Linear warmup steps from 0 to the peak LR. -1 = auto: min(10, training.steps // 10),
    so a 1-step smoke test has no warmup and runs of 100 steps or more warm up for 10."""
    min_lr_ratio: float = 0.1
    """Final LR as a fraction of the peak LR (linear, cosine, wsd)."""
    decay_fraction: float = 0.2
    """wsd only: fraction of all steps spent in the final decay (cooldown)."""
    decay_shape: DecayShape = DecayShape.linear
    """wsd only: cooldown shape: linear, cosine or one_minus_sqrt (1-sqrt)."""


@dataclass
class OptimConfig:
    name: str = "adamw"
    """Optimizer: adamw, or muon (Muon for the 2-D weights inside the blocks, AdamW with
    beta1/beta2/eps for embeddings, head, norms and biases; both take lr and weight_decay)."""
    lr: float = 3e-3
    """Peak learning rate."""
    beta1: float = 0.9
    """AdamW beta1."""
    beta2: float = 0.95
    """AdamW beta2."""
    eps: float = 1e-8
    """AdamW epsilon."""
    weight_decay: float = 0.1
    """Decoupled weight decay, applied only to weights with 2 or more dims."""
    grad_clip: float = 1.0
    """Clip the global gradient norm to this; 0 disables clipping."""
    momentum: float = 0.95
    """muon only: momentum of Muon's one buffer per matrix."""
    nesterov: bool = True
    """muon only: Nesterov momentum (the update orthogonalised is grad.lerp(buffer, momentum))."""
    ns_steps: int = 5
    """muon only: Newton-Schulz iterations orthogonalising each update (torch.optim.Muon's)."""
    muon_lr_scale: MuonLrScale = MuonLrScale.match_rms_adamw
    """muon only: Muon's lr for an A x B matrix: match_rms_adamw = lr x 0.2 sqrt(max(A, B))
    (Moonlight: one lr and weight decay serve both optimizers), original = lr x
    sqrt(max(1, A/B)) (Keller Jordan's; wants a Muon-sized lr, ~0.02)."""


@dataclass
class DataConfig:
    kind: DataKind = DataKind.stdlib
    """stdlib: this Python's standard library sources, byte-level; files: token files; synthetic."""
    train_files: str = ""
    """files only: path or glob of training token files (.npy, or .bin raw with `dtype`)."""
    val_files: str = ""
    """files only: path or glob of validation token files."""
    dtype: str = "uint16"
    """files only: element type of raw .bin token files (uint8, uint16, uint32, int32, int64)."""
    cache_dir: str = "~/.cache/meshrun"
    """Where prepared corpora are cached."""
    val_every_nth_file: int = 50
    """stdlib only: every n-th source file (sorted by path) goes to validation."""
    prepared: str = ""
    """files only: a folder made by `meshrun data prepare`; trains on its train shards,
    evaluates on its val shards, dtype from its manifest (leave train_files/val_files empty)."""
    tokenizer: str = ""
    """A Hugging Face tokenizer.json, a tiktoken rank file (*.tiktoken, Llama 3's
    tokenizer.model), or a folder holding one; empty = byte-level. Checked
    against model.vocab_size, and against the tokenizer data.prepared was made with."""
    sources: list[str] = field(default_factory=list)
    """files only, instead of data.prepared: several prepared dirs (`meshrun data prepare`,
    one tokenizer) to mix; each training sample comes from one source, drawn by data.weights
    from the seed, so a resume continues the same mixture. Validation: all their val shards."""
    weights: list[float] = field(default_factory=list)
    """One positive weight per data.sources entry (normalised); empty = equal weights."""
    document_mask: bool = False
    """Attention stays inside each document of a training window and RoPE positions restart
    at each document (block-diagonal causal attention; flex attention on CUDA, an exact SDPA
    mask elsewhere), under every layout. Documents end at the tokenizer's EOS token (it
    belongs to the document it ends; an SFT dir: at the conversation separator its manifest
    records), so this needs tokenized data: data=files with data.prepared or data.tokenizer.
    A target in the next document (the token after the end) is not learned. false = one
    causal sequence per window."""


@dataclass
class TrainingConfig:
    steps: int = 120
    """Optimizer steps to run."""
    seq_len: int = 128
    """Tokens per sample."""
    micro_batch_size: int = 16
    """Samples per rank per forward/backward."""
    grad_accum_steps: int = -1
    """Micro-batches accumulated per step; -1 = derived from global_batch_size (else 1)."""
    global_batch_size: int = -1
    """Samples per optimizer step over all ranks; -1 = micro x accumulation x dp."""
    seed: int = 1234
    """Seed for initialisation and data order."""
    eval_every: int = 30
    """Evaluate every N steps (and before the first and after the last); 0 = only at the ends."""
    eval_batches: int = 4
    """Micro-batches per rank in one evaluation."""
    log_every: int = 1
    """Write metrics every N steps."""
    device: DeviceKind = DeviceKind.auto
    """auto (CUDA when present), cpu or cuda."""
    compile: bool = False
    """torch.compile each transformer block separately (after TP/SP, context parallel and
    recompute, before FSDP), under every layout; embeddings, final norm and output stay eager."""
    compile_backend: CompileBackend = CompileBackend.inductor
    """With training.compile: inductor (generated kernels; on CPU it needs a C++ compiler),
    aot_eager (Dynamo + AOTAutograd graph capture run by eager kernels: checks that the
    blocks compile, fast to build) or eager (Dynamo capture only)."""
    stop_at_step: int = 0
    """Stop with a checkpoint after this step, leaving the schedule unfinished (continue with
    `meshrun resume`); 0 = run to training.steps."""
    loss_chunks: int = 1
    """Run the output head and cross entropy this many row blocks at a time (1 = the whole
    micro-batch's [tokens, vocab] logits at once): only one block's logits and their gradient
    are alive, the head's gradient is summed over the blocks in fp32, the loss agrees to fp32
    rounding. Needs parallel.tp=1 and pp=1 (under tp, loss_parallel splits the logits)."""
    profile_steps: int = 0
    """Steps traced with torch.profiler (CPU, and CUDA kernels on CUDA) into
    <run_dir>/profile/rank<R>.*.pt.trace.json (Chrome/Perfetto trace; TensorBoard's profiler
    plugin reads the folder); 0 = no profiling (no profiler object, nothing in the step)."""
    profile_start_step: int = -1
    """First traced step (steps count from 1). -1 = auto: profile_warmup_steps + 2 (step 1
    holds one-off work), earlier when the run is too short for the window to end by its last
    step."""
    profile_warmup_steps: int = 1
    """Steps run under the profiler just before the window and thrown away (torch.profiler's
    schedule warmup: its start-up cost stays out of the traced steps); 0 = none."""
    profile_ranks: list[int] = field(default_factory=lambda: [0])
    """Global ranks that trace (training.profile_*) and take memory snapshots
    (training.memory_snapshot_*); empty = every rank."""
    memory_snapshot_step: int = 0
    """CUDA only: record the allocator's history from the start and dump it after this step
    to <run_dir>/memory_snapshot/rank<R>_step<N>.pickle (torch.cuda.memory._dump_snapshot;
    drag it onto https://pytorch.org/memory_viz); 0 = none."""
    memory_snapshot_on_oom: bool = False
    """CUDA only: record the allocator's history and, on a CUDA out-of-memory error, dump it
    to <run_dir>/memory_snapshot/rank<R>_oom.pickle before the rank fails."""
    cpu_peak_flops: float = 0.0
    """Peak FLOP/s per rank used for MFU on CPU; 0 = measure a matmul at start (labelled measured)."""
    cpu_peak: CpuPeakMode = CpuPeakMode.host
    """Where the measured CPU peak comes from (with cpu_peak_flops=0): host = measured once per
    host and stored (training/cpu_peak_cache.py; $MESHRUN_CPU_PEAK_CACHE moves the folder), so
    the MFU of every run there is comparable; remeasure = measure now and replace the stored
    peak; run = measure for this run only, store nothing."""
    nonfinite: NonFinite = NonFinite.stop
    """A step whose loss (or, without a loss scaler, gradient norm) is nan or inf: stop (the
    run fails at once, saving and exporting nothing; the last checkpoint is the last finite
    state) or skip_step (drop that step's update, log it, train on)."""
    max_restarts: int = 0
    """After a rank fails (exits non-zero, is killed) or the run hangs, restart it from its
    newest complete checkpoint by itself, up to this many times (0 = never: the run fails, as
    before). Each restart is a leg in resumes.jsonl and continues the same W&B run; the same
    failure at the same step twice stops restarting (a bug, not a fault). Local runs restart
    in the launcher, Slurm jobs are requeued by a surviving rank (counted apart from
    cluster.max_requeues); not available with cluster=nodes. A restart needs a complete
    checkpoint."""
    hang_timeout_s: float = -1
    """Seconds a rank may go without progress (its heartbeat: each step, collective and phase)
    before the watchdog names it, dumps every rank's Python stack, stops the run and marks it
    hung. -1 = auto: max(60 s, 10 x median step time) in steps and evals, max(300 s, 50 x
    median step time) in the one-off phases (init, first collective, build, checkpoint save and
    load, export); a value > 0 is used for every phase. The process group's collectives time
    out behind it: init after cluster.preflight_timeout_s + that, train after twice that + 30 s
    (conf/run_dir/heartbeats.py holds the rule)."""


@dataclass
class CheckpointConfig:
    every_steps: int = 60
    """Save a checkpoint every N steps (and at the end); 0 = only at the end."""
    keep_last: int = 2
    """Keep this many newest checkpoints; older ones are deleted after a save completes."""
    async_save: bool = False
    """Save in the background: the step waits only for the copy to host memory (pinned with
    CUDA); the write, SHA-256 hashes and meta.json follow in a thread, one save in flight at a
    time; the end of the run, a stop or a failure waits for it. (`async` is a Python keyword,
    so the knob is `checkpoint.async_save`.)"""
    export_safetensors: bool = True
    """At the end, export a Hugging Face folder (Llama, or Qwen2 with q/k/v biases): safetensors,
    config.json and, when the run has a tokenizer, its files and special-token ids."""
    resume_from: str = ""
    """Run dir to continue (set by `meshrun resume`); empty = a new run."""
    load_from: str = ""
    """A new run starts from this checkpoint (a step_N folder, or a run dir = its newest):
    weights, optimizer state and data position, resharded by DCP to this run's layout. Or a
    Hugging Face model folder of the run's shape: its weights only, each rank reading its part."""


@dataclass
class LoggingConfig:
    wandb_mode: WandbMode = WandbMode.offline
    """W&B: offline (default, needs no key), online, disabled."""
    wandb_project: str = "meshrun"
    """W&B project."""
    wandb_entity: str = ""
    """W&B entity (team); empty = your default."""
    wandb_group: str = ""
    """W&B group (a sweep sets it to the sweep's name, so its runs compare side by side)."""
    wandb_tags: list[str] = field(default_factory=list)
    """W&B tags (a sweep adds the varied keys' values)."""
    wandb_system_metrics: bool = True
    """W&B System panels: CPU, memory, disk, network and, on GPUs, utilisation, memory, power
    and temperature, sampled by W&B on rank 0's node, plus the machine metadata.
    false = no sampler and no metadata probe."""
    wandb_system_metrics_interval_s: float = 15.0
    """Seconds between W&B system-metric samples (W&B's default 15; a few seconds suits short
    runs, which may otherwise end before the first sample)."""
    wandb_console: bool = True
    """W&B Logs tab: rank 0's stdout/stderr also go to the run (files/output.log); false = not
    captured (the launcher's own log still has them)."""
    tensorboard: bool = False
    """TensorBoard event files in <run_dir>/tensorboard (rank 0): every metric W&B gets (per-rank
    series too), the config as hparams and text, events and the summary as text; a resumed leg
    continues the same folder. View: `tensorboard --logdir <runs_dir>`."""
    mlflow: bool = False
    """MLflow run (rank 0): the metrics W&B gets, the config as params, events as tags, the
    summary; a resumed leg continues the same run (its id is kept in <run_dir>/mlflow_run.json).
    Needs the mlflow package (pip install 'meshrun[mlflow]')."""
    mlflow_tracking_uri: str = ""
    """MLflow store: empty = a SQLite file in the run dir (<run_dir>/mlflow/mlflow.db), else a
    tracking server (http://host:5000) or a database URI (sqlite:////abs/path.db, postgresql://...).
    A store that fails is named once in the log; training goes on."""
    mlflow_experiment: str = "meshrun"
    """MLflow experiment the run is filed under (created if missing)."""
    progress: bool = True
    """Show a live progress bar in the launching terminal."""


@dataclass
class EvalTaskConfig:
    path: str = ""
    """A JSONL file of multiple-choice documents (conf/eval_tasks.py: context, choices, gold)."""
    name: str = ""
    """The task's name in metrics (`eval/<name>/acc`); empty = the file's stem."""
    limit: int = 0
    """Score only the first N documents of this task; 0 = eval.limit."""


@dataclass
class EvalConfig:
    tasks: list[EvalTaskConfig] = field(default_factory=list)
    """Multiple-choice tasks scored by log-likelihood (acc, acc_norm), e.g.
    `eval.tasks=[{name:piqa,path:data/piqa.jsonl}]`; empty = none."""
    every_steps: int = 0
    """Score the tasks every N steps and after the last; 0 = after the last step only."""
    limit: int = 0
    """Documents per task (the first N); 0 = all."""
    batch_size: int = 8
    """Choices (sequences) per forward pass of the scorer on each rank."""


@dataclass
class RunConfig:
    name: str = "run"
    """Run name; the run dir is runs_dir/<name>-<timestamp>."""
    runs_dir: str = "runs"
    """Folder that holds run dirs."""
    model: ModelConfig = field(default_factory=ModelConfig)
    precision: PrecisionConfig = field(default_factory=PrecisionConfig)
    parallel: ParallelConfig = field(default_factory=ParallelConfig)
    recompute: RecomputeConfig = field(default_factory=RecomputeConfig)
    schedule: ScheduleConfig = field(default_factory=ScheduleConfig)
    optim: OptimConfig = field(default_factory=OptimConfig)
    data: DataConfig = field(default_factory=DataConfig)
    training: TrainingConfig = field(default_factory=TrainingConfig)
    checkpoint: CheckpointConfig = field(default_factory=CheckpointConfig)
    cluster: ClusterConfig = field(default_factory=ClusterConfig)
    logging: LoggingConfig = field(default_factory=LoggingConfig)
    eval: EvalConfig = field(default_factory=EvalConfig)
