"""The cluster section of the Hydra-facing schema (conf/schema.py says how the schema works):
where ranks run, the hardware, the Slurm job, and the step-time model's calibration."""
from __future__ import annotations

from dataclasses import dataclass, field

from conf.choices import ClusterKind


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
    reserved_ratio: float = 0.0
    """The CUDA caching allocator's reserved peak over the allocated peak the plan counts (what a
    GPU shows over what the tensors hold: parallel/cost/allocator_reserve.py): 0 = calibrated
    from runs that logged both (`meshrun plan --calibrate`), else the public record's 1.20;
    else >= 1. Only the plan's reserved figure uses it; the fit verdict stays on the
    allocated peak."""
    calibration: str = "auto"
    """Calibration file written by `meshrun plan --calibrate`: auto = ~/.meshrun/calibration.json
    when it exists ($MESHRUN_HOME instead of ~/.meshrun when set), none = do not use one, or a
    path. The entry for this run's device is used (values set above win over it)."""
