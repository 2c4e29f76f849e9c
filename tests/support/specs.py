"""Build real RunSpecs for tests through the same compose + resolve path users take."""
from __future__ import annotations

from conf.compose import compose_config
from conf.resolve import resolve
from conf.spec import HostSpec, RunSpec

CPU_HOST = HostSpec(gpu_name="", gpu_count=0, compute_capability=0.0, cpu_count=2)


def cpu_spec(*overrides: str) -> RunSpec:
    """A resolved spec on a CPU host, W&B disabled, from `overrides`."""
    cfg = compose_config(["logging=disabled", *overrides])
    return resolve(cfg, host=CPU_HOST, check_paths=False)
