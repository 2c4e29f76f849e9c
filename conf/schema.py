"""Hydra-facing schema: the mutable dataclasses that YAML and overrides compose against.

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


@dataclass
class MoeConfig:
    """Mixture-of-experts feed-forward (model.family=moe or mixtral; 0 experts = dense)."""

    num_experts: int = 0
    """Routed experts per MoE block; 0 = no MoE (every block dense)."""
    top_k: int = 2
    """Experts each token is sent to (experts per token)."""
    num_shared_experts: int = 0
    """Experts every token goes through besides its routed ones (DeepSeek); one SwiGLU of
    num_shared_experts x expert_ffn_dim."""
    expert_ffn_dim: int = 0
    """Inner size of each expert's SwiGLU (moe_intermediate_size); 0 = model.ffn_dim."""
    first_dense_layers: int = 0
    """Blocks 0 .. first_dense_layers-1 keep a dense SwiGLU of model.ffn_dim; MoE after."""
    score: RouterScore = RouterScore.softmax
    """Router scores: softmax over all experts (Mixtral, Qwen3-MoE), or sigmoid per expert
    with a bias that balances the load without a loss (DeepSeek-V3, bias_update_rate)."""
    renormalize: bool = True
    """Divide each token's top-k scores by their sum (Mixtral; Qwen3 norm_topk_prob)."""
    route_scale: float = 1.0
    """Factor on the routed experts' weighted sum (DeepSeek-V3 routed_scaling_factor 2.5)."""
    bias_update_rate: float = 0.001
    """score=sigmoid: after each optimizer step every expert's selection bias moves by this
    toward the mean load (up if under-loaded, down if over-loaded); 0 = no balancing bias."""
    aux_loss_coef: float = 0.0
    """Load-balancing loss weight: coef x E x sum_i f_i P_i per MoE block, averaged over the
    blocks (f_i: share of tokens routed to expert i, P_i: its mean router probability; as
    transformers' Mixtral/Qwen3-MoE loss for one block). f and P are taken per forward, as in
    Megatron: a rank's micro-batch (a pipeline micro-batch under pp; whole sequences under cp)."""
    seq_aux_loss: bool = False
    """The balancing loss per sequence, averaged over the sequences (DeepSeek-V3's
    sequence-wise loss, on the batch loss's scale: top_k x DeepSeek's for one coefficient)."""
    z_loss_coef: float = 0.0
    """Router z-loss weight: coef x mean over tokens of logsumexp(router logits)^2 (ST-MoE)."""
    capacity_factor: float | None = None
    """Tokens an expert takes per batch: capacity_factor x tokens x top_k / num_experts
    (the rest are dropped: that copy adds nothing); null = dropless (no token dropped)."""


@dataclass
class ModelConfig:
    name: str = "debug"
    """Name of the model shape (the `model` group option)."""
    family: str = "llama"
    """Model family (architecture): llama (Llama 3, and Qwen2 with attention_bias), moe
    (mixture of experts, Qwen3-MoE names), mixtral (the same, Mixtral names), or the
    import path of a family module (training/models/__init__.py says what a family is)."""
    n_layers: int = 4
    """Number of transformer blocks."""
    dim: int = 128
    """Hidden size (d_model)."""
    n_heads: int = 4
    """Attention (query) heads."""
    n_kv_heads: int = 2
    """Key/value heads for grouped-query attention; -1 = n_heads (plain multi-head)."""
    ffn_dim: int = 384
    """Inner size of the SwiGLU feed-forward block."""
    vocab_size: int = 256
    """Vocabulary size (embedding rows). Byte-level data needs at least 256."""
    max_seq_len: int = 1024
    """Longest sequence the model is meant for (RoPE positions)."""
    rope_theta: float = 10000.0
    """RoPE base frequency."""
    tie_embeddings: bool = False
    """Share the token embedding with the output head."""
    norm_eps: float = 1e-5
    """RMSNorm epsilon."""
    init_std: float = 0.02
    """Standard deviation of the normal initialisation of weights."""
    attention_bias: bool = False
    """Learned biases on the q, k and v projections (Qwen2); none on the output projection."""
    rope_scaling: RopeScaling = RopeScaling.none
    """RoPE frequency scaling: none, or llama3 (Llama 3.1/3.2 long context: low frequencies
    divided by rope_scaling_factor, high ones kept, a smooth blend between)."""
    rope_scaling_factor: float = 8.0
    """rope_scaling=llama3: how much the low frequencies are slowed down (32 for Llama 3.2)."""
    rope_low_freq_factor: float = 1.0
    """rope_scaling=llama3: wavelengths above original_max / this are fully scaled."""
    rope_high_freq_factor: float = 4.0
    """rope_scaling=llama3: wavelengths below original_max / this are kept as they are."""
    rope_original_max_seq_len: int = 8192
    """rope_scaling=llama3: the context length the model was pre-trained with before scaling."""
    head_dim: int = 0
    """Width of each attention head; 0 = dim / n_heads (Qwen3 sets it apart from dim)."""
    qk_norm: bool = False
    """RMSNorm on each query and key head before RoPE (Qwen3)."""
    moe: MoeConfig = field(default_factory=MoeConfig)
    """Mixture-of-experts knobs (model.family=moe or mixtral)."""
    path: str = ""
    """A Hugging Face model folder (`model=hf`): resolve() reads the shape above from its
    config.json (Llama, Qwen2, Qwen3-MoE or Mixtral), and the run starts from its
    safetensors weights. A shape knob given on the command line must agree with config.json
    (else an error); max_seq_len, init_std and the model.moe training knobs (losses,
    capacity) given there replace config.json's."""


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
    balanced routing); scales the all-to-all volume in the step time. 0 = auto: the value
    `meshrun plan --calibrate` fitted to this device's MoE runs, else 1.0; a value set wins."""


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
class ClusterConfig:
    kind: ClusterKind = ClusterKind.local
    """Where ranks run: local (torchrun here), slurm (submitit), nodes (torchrun per host)."""
    nodes: int = 1
    """Machines; local runs use 1."""
    procs_per_node: int = -1
    """Ranks per node; -1 = gpus_per_node on a GPU cluster (or the local GPU count), else 2."""
    gpus_per_node: int = -1
    """slurm/nodes: GPUs per node (0 = a CPU cluster); -1 = what this machine has."""
    gpu_name: str = ""
    """slurm/nodes: the GPU model of the compute nodes (e.g. H100), for MFU peaks and checks."""
    gpu_compute_capability: float = 0.0
    """slurm/nodes: compute capability of those GPUs (e.g. 9.0); 0 = gpu_name's model's
    (conf/gpu_generations.py), or unknown."""
    partition: str = ""
    """slurm: partition (empty = the cluster's default)."""
    account: str = ""
    """slurm: account to charge (empty = your default)."""
    qos: str = ""
    """slurm: quality of service (empty = default)."""
    cpus_per_task: int = -1
    """slurm: CPUs per rank (--cpus-per-task). -1 = auto: 8 per rank on GPU nodes (every
    common 8-GPU node has 64 or more CPUs, so 8 each leaves room for the system; without it
    Slurm gives a rank 1 CPU, which starves data loading and the CPU side of the step),
    Slurm's default on CPU-only nodes (gpus_per_node=0). 0 = Slurm's default (no option)."""
    mem_gb: int = -1
    """slurm: memory per node in GB (--mem). -1 = let the partition decide (no option);
    0 = all of the node's memory (--mem=0, what Slurm means by 0; usual with exclusive nodes)."""
    time_limit_min: int = 60
    """slurm: time limit of one job leg in minutes."""
    constraint: str = ""
    """slurm: node feature constraint (e.g. h100)."""
    exclusive: bool | None = None
    """slurm: allocate whole nodes (--exclusive). null = auto: true on nodes with 2 or more
    GPUs (a multi-GPU job shares its nodes' NICs and PCIe switches badly), false otherwise."""
    extra_sbatch: list[str] = field(default_factory=list)
    """slurm: extra sbatch options, e.g. ['--reservation=big', '--mail-type=END']."""
    setup: list[str] = field(default_factory=list)
    """slurm: shell lines run before the ranks start (module loads, source venv)."""
    env: dict[str, str] = field(default_factory=dict)
    """Environment variables for every rank (e.g. NCCL_IB_HCA, NCCL_DEBUG)."""
    container_image: str = ""
    """slurm: run ranks in this container image (pyxis: srun --container-image)."""
    container_mounts: str = ""
    """slurm: pyxis --container-mounts value (e.g. /data:/data)."""
    rdzv_host: str = ""
    """Rendezvous host; slurm: empty = first node of the allocation; nodes: required."""
    rdzv_port: int = 0
    """Rendezvous port; 0 = derived from the job id (slurm) or 29500 (nodes)."""
    warning_signal: str = "USR1@120"
    """slurm: signal Slurm sends this many seconds before the time limit (SIG@SECONDS)."""
    max_requeues: int = 3
    """slurm: on the warning signal or preemption, checkpoint and requeue up to this often."""
    preflight: bool = True
    """Check that every rank joined and collectives work, and measure bandwidth, before training."""
    preflight_timeout_s: int = 300
    """How long rank 0 waits for every rank to join before naming the missing ones."""
    preflight_max_mib: int = 64
    """Largest all-reduce message of the bandwidth table (4 KiB up to this). Before training
    the table ends sooner, at the first bandwidth-bound size (5 ms and 10x the 4 KiB time:
    training/preflight.py ENOUGH_MS); `meshrun preflight` measures every size."""
    python: str = ""
    """slurm/nodes: Python executable on the compute nodes; empty = this one."""
    # The step-time model (parallel/cost/step_time.py). Each value: 0 = from the calibration
    # (`cluster.calibration`), else the device catalogue (parallel/cost/devices.py).
    peak_tflops: float = 0.0
    """Dense peak TFLOP/s of one device in the compute dtype (on CPU: of one core)."""
    hbm_gbps: float = 0.0
    """Device memory bandwidth, GB/s (the optimizer step's time)."""
    host_link_gbps: float = 0.0
    """Device <-> host memory bandwidth (PCIe, NVLink-C2C), GB/s per direction per device:
    what recompute.mode=offload copies activations over (parallel/cost/offload.py)."""
    intra_node_gbps: float = 0.0
    """Collective bandwidth between ranks of one node (NVLink), GB/s per direction per rank."""
    inter_node_gbps: float = 0.0
    """Collective bandwidth between nodes (InfiniBand), GB/s per direction per rank."""
    intra_node_latency_us: float = 0.0
    """Latency (alpha) of one step of a collective inside a node, microseconds."""
    inter_node_latency_us: float = 0.0
    """Latency (alpha) of one step of a collective between nodes, microseconds."""
    matmul_efficiency: float = 0.0
    """Fraction of the dense peak a large matmul reaches (0 = calibrated, else 0.5); smaller
    ones reach less by matmul_knee_us (parallel/cost/matmul_rate.py)."""
    matmul_knee_us: float = 0.0
    """Fixed cost of one matmul call (launch, last partial wave), us: what makes small
    matmuls (tp, micro-batch 1) run below matmul_efficiency (0 = calibrated, else 3 on a
    GPU, 0 on CPU)."""
    layer_overhead_us: float = 0.0
    """Fixed cost per block per micro-batch (forward + backward: launches, Python), us."""
    tp_overhead_us: float = 0.0
    """Extra fixed cost per tensor-parallel block per micro-batch (DTensor's dispatch of its
    ops and collectives, beyond their bytes), us."""
    update_overhead_us: float = 0.0
    """Fixed cost of the optimizer step per parameter tensor the rank steps (AdamW's and the
    gradient clipping's per-tensor work), us."""
    collective_overhead_us: float = 0.0
    """Software cost of one collective call beyond its alpha-beta time (hooks, buffer copies,
    launch, waking the peers), us (parallel/cost/comm.py)."""
    calibration: str = "auto"
    """Calibration file written by `meshrun plan --calibrate`: auto = ~/.meshrun/calibration.json
    when it exists ($MESHRUN_HOME instead of ~/.meshrun when set), none = do not use one, or a
    path. The entry for this run's device is used (values set above win over it)."""


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
