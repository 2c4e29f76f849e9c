"""Does a run fit its devices? One verdict for `meshrun plan`, the dry run, the sweep preview
and the launch gate (launcher/launch_gate.py). Torch-free.

On a GPU the fullest rank's peak (parallel.cost.memory: static + weight copies + activations)
is compared with USABLE_FRACTION of the device's memory (devices.py, or what the caller
measured). On CPU the ranks of a node share the host's RAM: the SUM over this node's ranks of
each rank's peak, plus CPU_RANK_RUNTIME_BYTES per rank (the interpreter, torch and gloo), is
compared with USABLE_FRACTION of the memory the host has available (HostSpec.
mem_available_bytes: MemAvailable, probed by launcher/host_memory.py). That is known only for
ranks on this machine (cluster=local); elsewhere there is no CPU verdict.
"""
from __future__ import annotations

from collections import Counter
from dataclasses import dataclass

from conf.spec import RunSpec
from parallel.cost.devices import GIB, gpu_memory_bytes
from parallel.cost.memory import layout_memory
from parallel.cost.memory_views import rank_place

USABLE_FRACTION = 0.92
"""Of a GPU's memory, what tensors may use: the rest is the CUDA context, allocator slack and
NCCL buffers. Of a host's available memory, what the ranks may use: the same 8% is left for
the allocator's slack (glibc arenas keep freed blocks), the page cache the data loader reads
through, and the launcher and torchrun agent."""
CPU_RANK_RUNTIME_BYTES = 256 * 1024**2
"""Per CPU rank, memory that holds no tensor of the plan: the interpreter, torch's libraries
and gloo's state. Measured here: 225 MB resident (146 MB anonymous) right after
init_process_group on torch 2.13, rounded up to 256 MiB."""


@dataclass(frozen=True, slots=True, kw_only=True)
class Verdict:
    fits: bool | None
    """None: no verdict (a GPU whose memory is unknown, CPU ranks on another machine)."""
    need_bytes: int
    """What must fit: the fullest rank's peak on a GPU; on CPU the sum over the node's ranks
    of their peaks and runtime."""
    device_bytes: float | None
    """One GPU's memory, or the host's available memory on CPU."""
    usable_bytes: float | None
    """USABLE_FRACTION of device_bytes."""
    basis: str
    """What was compared, in words."""
    ranks: int = 1
    """Ranks that share device_bytes: 1 on a GPU, the node's ranks on CPU."""
    rank_overhead_bytes: int = 0
    """Per rank, bytes outside the plan's tensors (CPU_RANK_RUNTIME_BYTES on CPU)."""

    @property
    def margin_bytes(self) -> float | None:
        """usable - need: negative when it does not fit."""
        return None if self.usable_bytes is None else self.usable_bytes - self.need_bytes

    @property
    def rank_budget_bytes(self) -> float | None:
        """The most one rank's plan may need when every rank of the node needs as much: what a
        search compares each layout's fullest rank with."""
        if self.usable_bytes is None:
            return None
        return self.usable_bytes / self.ranks - self.rank_overhead_bytes

    @property
    def line(self) -> str:
        if self.fits is None:
            return f"no verdict: {self.basis}"
        margin = self.margin_bytes / GIB
        if self.fits:
            return (f"fits: {self.need_bytes / GIB:.2f} GiB of {self.usable_bytes / GIB:.2f} "
                    f"GiB usable, margin {margin:.2f} GiB ({self.basis})")
        return (f"DOES NOT FIT: needs {self.need_bytes / GIB:.2f} GiB, "
                f"{self.usable_bytes / GIB:.2f} GiB usable, over by {-margin:.2f} GiB "
                f"({self.basis})")


def device_bytes_of(spec: RunSpec) -> float | None:
    """Bytes of one device of the run from the catalogue; None on CPU or when unknown."""
    if spec.training.device != "cuda":
        return None
    return gpu_memory_bytes(spec.host.gpu_name)


def memory_verdict(spec: RunSpec, need_bytes: int, *, device_bytes: float | None = None,
                   node_bytes: int | None = None) -> Verdict:
    """The verdict for a rank that needs `need_bytes` (its peak); `device_bytes` overrides the
    catalogue (e.g. nvidia-smi's answer on this machine). On CPU, `node_bytes` is the sum of
    the node's ranks' peaks (node_peak_bytes); without it every rank counts `need_bytes`."""
    if spec.training.device != "cuda":
        return cpu_verdict(spec, need_bytes, node_bytes=node_bytes)
    device = device_bytes if device_bytes is not None else device_bytes_of(spec)
    if device is None:
        return Verdict(fits=None, need_bytes=need_bytes, device_bytes=None, usable_bytes=None,
                       basis=f"memory of {spec.host.gpu_name or 'the GPU'} unknown")
    usable = USABLE_FRACTION * device
    return Verdict(fits=need_bytes <= usable, need_bytes=need_bytes, device_bytes=device,
                   usable_bytes=usable,
                   basis=f"{spec.host.gpu_name}: {device / GIB:.0f} GiB x "
                         f"{USABLE_FRACTION:.0%} usable")


def cpu_verdict(spec: RunSpec, need_bytes: int, *, node_bytes: int | None = None) -> Verdict:
    """The node's ranks together against USABLE_FRACTION of the host's available memory."""
    ranks = spec.cluster.procs_per_node
    available = spec.host.mem_available_bytes
    if spec.cluster.kind.value != "local" or available <= 0:
        where = ("host memory unknown" if spec.cluster.kind.value == "local"
                 else f"CPU ranks on cluster={spec.cluster.kind.value} nodes, whose memory "
                      "meshrun does not know")
        return Verdict(fits=None, need_bytes=need_bytes, device_bytes=None, usable_bytes=None,
                       basis=where, ranks=ranks)
    tensors = node_bytes if node_bytes is not None else need_bytes * ranks
    need = tensors + ranks * CPU_RANK_RUNTIME_BYTES
    usable = USABLE_FRACTION * available
    return Verdict(fits=need <= usable, need_bytes=need, device_bytes=float(available),
                   usable_bytes=usable, ranks=ranks, rank_overhead_bytes=CPU_RANK_RUNTIME_BYTES,
                   basis=f"CPU: {ranks} rank(s) of this host together, each its peak + "
                         f"{CPU_RANK_RUNTIME_BYTES // 1024**2} MiB runtime, against "
                         f"{USABLE_FRACTION:.0%} of {available / GIB:.1f} GiB available")


def node_peak_bytes(spec: RunSpec) -> int:
    """The sum over node 0's ranks (ranks 0 .. procs_per_node-1) of each rank's peak; ranks
    the memory model cannot tell apart are evaluated once."""
    layout = layout_memory(spec)
    places = Counter(rank_place(spec, rank) for rank in range(spec.cluster.procs_per_node))
    return sum(layout.at(place).total * count for place, count in places.items())
