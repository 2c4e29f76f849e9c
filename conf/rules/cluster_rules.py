"""Rules on the cluster section: nodes and processes against the host, the step-time model's
knobs, and the Slurm / multi-node launch settings (with the Slurm resources' autos)."""
from __future__ import annotations

from conf.errors import ProblemList
from conf.schema import ClusterConfig, ClusterKind, DeviceKind
from conf.spec import HostSpec


TIME_MODEL_KEYS = ("peak_tflops", "hbm_gbps", "intra_node_gbps", "inter_node_gbps",
                   "intra_node_latency_us", "inter_node_latency_us", "matmul_efficiency",
                   "layer_overhead_us", "tp_overhead_us", "collective_overhead_us",
                   "host_link_gbps", "update_overhead_us", "matmul_knee_us")
"""The step-time model's cluster knobs (parallel/cost/step_time.py): 0 or more."""


def check_cluster(c: ClusterConfig, procs: int, host: HostSpec, device: DeviceKind,
                  problems: ProblemList) -> None:
    if c.kind is ClusterKind.local and c.nodes != 1:
        problems.add("cluster.nodes", c.nodes, "cluster=local runs on exactly one node",
                     "use cluster=slurm or cluster=nodes for several nodes")
    elif c.nodes < 1:
        problems.add("cluster.nodes", c.nodes, "must be positive", "give a value >= 1")
    if c.gpus_per_node < -1:
        problems.add("cluster.gpus_per_node", c.gpus_per_node,
                     "must be >= 0 (0 = CPU-only nodes), or -1 = this machine's GPUs",
                     "give the GPUs of one node, e.g. 8")
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
    if c.reserved_ratio != 0 and c.reserved_ratio < 1:
        problems.add("cluster.reserved_ratio", c.reserved_ratio,
                     "is reserved over allocated bytes: at least 1 (0 = calibrated, else "
                     "the public record's)", "e.g. 1.2, or 0")
    if procs <= 0:
        problems.add("cluster.procs_per_node", procs, "must be positive, or -1 for auto",
                     "give a value >= 1")
    elif device is DeviceKind.cpu and procs > cpu_procs_max(host):
        problems.add("cluster.procs_per_node", procs,
                     f"is more CPU ranks than this machine's {host.cpu_count} core(s) can run "
                     f"(at most {cpu_procs_max(host)}: {CPU_RANKS_PER_CORE} per core, or "
                     f"{CPU_PROCS_FLOOR}); each rank is a whole Python and torch process",
                     f"use cluster.procs_per_node<={cpu_procs_max(host)}, or a machine with "
                     "more cores")
    elif device is DeviceKind.cuda and 0 < host.gpu_count < procs:  # no GPU at all: reported as device
        problems.add("cluster.procs_per_node", procs,
                     f"exceeds the {host.gpu_count} GPU(s) of this machine",
                     f"use cluster.procs_per_node<={host.gpu_count}")


CPU_RANKS_PER_CORE = 4
CPU_PROCS_FLOOR = 16
"""CPU (gloo) ranks per node: oversubscribing a core a few times still trains (the layout
tests run 8 ranks on 2 cores), thousands only thrash; the floor keeps small machines usable."""


def cpu_procs_max(host: HostSpec) -> int:
    return max(CPU_PROCS_FLOOR, CPU_RANKS_PER_CORE * max(host.cpu_count, 1))


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
