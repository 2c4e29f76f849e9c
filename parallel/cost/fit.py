"""Does a run fit its devices? One verdict for `meshrun plan`, the dry run and the sweep
preview. Torch-free.

On a GPU the fullest rank's peak (parallel.cost.memory: static + weight copies + activations)
is compared with USABLE_FRACTION of the device's memory (devices.py, or what the caller
measured). On CPU there is no verdict: the ranks of a node share host RAM with everything else
on it, and meshrun does not budget that.
"""
from __future__ import annotations

from dataclasses import dataclass

from conf.spec import RunSpec
from parallel.cost.devices import GIB, gpu_memory_bytes

USABLE_FRACTION = 0.92
"""Of a GPU's memory, what tensors may use: the rest is the CUDA context, allocator slack and
NCCL buffers."""


@dataclass(frozen=True, slots=True, kw_only=True)
class Verdict:
    fits: bool | None
    """None: no verdict (CPU, or a GPU whose memory is unknown)."""
    need_bytes: int
    """The fullest rank's peak."""
    device_bytes: float | None
    usable_bytes: float | None
    """USABLE_FRACTION of device_bytes."""
    basis: str
    """What was compared, in words."""

    @property
    def margin_bytes(self) -> float | None:
        """usable - need: negative when it does not fit."""
        return None if self.usable_bytes is None else self.usable_bytes - self.need_bytes

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


def memory_verdict(spec: RunSpec, need_bytes: int, *,
                   device_bytes: float | None = None) -> Verdict:
    """The verdict for a rank that needs `need_bytes`; `device_bytes` overrides the catalogue
    (e.g. nvidia-smi's answer on this machine)."""
    if spec.training.device != "cuda":
        return Verdict(fits=None, need_bytes=need_bytes, device_bytes=None, usable_bytes=None,
                       basis="CPU run (ranks share host RAM; not budgeted)")
    device = device_bytes if device_bytes is not None else device_bytes_of(spec)
    if device is None:
        return Verdict(fits=None, need_bytes=need_bytes, device_bytes=None, usable_bytes=None,
                       basis=f"memory of {spec.host.gpu_name or 'the GPU'} unknown")
    usable = USABLE_FRACTION * device
    return Verdict(fits=need_bytes <= usable, need_bytes=need_bytes, device_bytes=device,
                   usable_bytes=usable,
                   basis=f"{spec.host.gpu_name}: {device / GIB:.0f} GiB x "
                         f"{USABLE_FRACTION:.0%} usable")
