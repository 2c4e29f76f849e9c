"""The device mesh holds only the axes of size > 1 (parallel/mesh.py): every gloo process group
has a TCP loop thread that wakes every 10 ms, used or not, and four idle ones (the size-1
axes of ZeRO-3 on two ranks) doubled the compute threads' context switches. Counted here on
real gloo ranks: the loop threads a rank has after `build_mesh`, and which axes have a group.
That the layouts still compute what one process does is tests/distributed/test_layout_parity.py.
"""
from __future__ import annotations

import os

import pytest
import torch

from conf.run_dir.spec_io import spec_from_dict, spec_to_dict
from conf.spec import RunSpec
from tests.support.spawn import run_on_ranks
from tests.support.specs import cpu_spec

pytestmark = pytest.mark.distributed

AXES = ("pp", "dp_replicate", "dp_shard", "cp", "tp", "dp", "dp_shard_cp", "dp_cp")


def _loop_threads() -> int:
    names = []
    for task in os.listdir("/proc/self/task"):
        try:
            with open(f"/proc/self/task/{task}/comm") as comm:
                names.append(comm.read().strip())
        except OSError:  # a thread that ended meanwhile
            pass
    return names.count("gloo_tcp_loop")


def mesh_rank(*, rank: int, world_size: int, spec_dicts: list[dict]) -> list[dict]:
    from parallel.dims import ParallelDims
    from parallel.mesh import build_mesh

    rows = []
    for spec_dict in spec_dicts:
        spec = spec_from_dict(RunSpec, spec_dict)
        before = _loop_threads()
        meshes = build_mesh(ParallelDims.from_spec(spec.parallel), device=torch.device("cpu"))
        sizes = {axis: (group.size() if (group := meshes.group(axis)) else 1) for axis in AXES}
        rows.append({"name": spec.parallel.name, "new_loops": _loop_threads() - before,
                     "group_sizes": sizes})
    return rows


LAYOUTS = {  # name: (overrides, new loop threads per rank, group sizes > 1)
    "zero3": (["parallel=zero3"], 0, {"dp_shard": 2, "dp": 2, "dp_shard_cp": 2, "dp_cp": 2}),
    "ddp": (["parallel=ddp"], 0, {"dp_replicate": 2, "dp": 2, "dp_cp": 2}),
    "cp": (["parallel=cp"], 0, {"cp": 2, "dp_shard_cp": 2, "dp_cp": 2}),
    "tp": (["parallel=tp"], 0, {"tp": 2}),
    "pp": (["parallel=pp"], 0, {"pp": 2}),
}


def test_only_axes_of_size_above_one_make_process_groups(tmp_path):
    specs = [cpu_spec("model=tiny", "data=synthetic", "cluster.procs_per_node=2",
                      f"parallel.name={name}", *overrides)
             for name, (overrides, _, _) in LAYOUTS.items()]
    results = run_on_ranks(mesh_rank, world_size=2, workdir=tmp_path, timeout_s=300,
                           kwargs={"spec_dicts": [spec_to_dict(s) for s in specs]})
    for rows in results:
        for row in rows:
            _, loops, sizes = LAYOUTS[row["name"]]
            assert row["new_loops"] == loops, row  # one 2-rank axis: the default group's
            assert {a: s for a, s in row["group_sizes"].items() if s > 1} == sizes, row
