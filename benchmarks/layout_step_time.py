"""Step time and per-rank static memory of every layout on one small model (CPU, gloo).

For each layout: build it (training.parallel_model.build_parallel_model), take WARMUP steps, then time STEPS
steps (a step's time is the slowest rank's); report the median, and the largest per-rank
bytes of parameters + gradients + optimizer state actually held next to the plan's estimate.
All layouts run in this one invocation (world sizes 1, 2, 4, 8 on this machine's cores), so
the ratios between them are comparable; absolute times on a 2-core machine are not.

    .venv/bin/python benchmarks/layout_step_time.py [model=debug ...]   # default: tiny, 4 layers
"""
from __future__ import annotations

import statistics
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

WARMUP, STEPS = 2, 6
COMMON = ["model=tiny", "model.n_layers=4", "data=synthetic", "training.seq_len=64",
          "training.global_batch_size=8", "training.micro_batch_size=2",
          "training.grad_accum_steps=-1"]
LAYOUTS = {  # name: (world size, overrides)
    "single": (1, ["parallel=single"]),
    "ddp": (2, ["parallel=ddp"]), "zero1": (2, ["parallel=zero1"]),
    "zero2": (2, ["parallel=zero2"]), "zero3": (2, ["parallel=zero3"]),
    "tp (SP)": (2, ["parallel=tp"]), "cp": (2, ["parallel=cp"]),
    "pp gpipe": (2, ["parallel=pp", "parallel.pp_schedule=gpipe"]),
    "pp 1f1b": (2, ["parallel=pp"]),
    "pp interleaved": (2, ["parallel=pp", "parallel.pp_schedule=interleaved_1f1b",
                           "parallel.pp_virtual_stages=2", "parallel.pp_microbatches=2"]),
    "hsdp 2x2": (4, ["parallel=hsdp"]), "dp2 x tp2": (4, ["parallel=fsdp_tp"]),
    "pp2 x dp2": (4, ["parallel=pp", "parallel.pp=2", "parallel.dp_shard=-1", "parallel.zero=3"]),
    "pp2 x tp2": (4, ["parallel=pp", "parallel.pp=2", "parallel.tp=2"]),
    "cp2 x tp2": (4, ["parallel=cp", "parallel.cp=2", "parallel.tp=2", "parallel.zero=3"]),
    "pp2 x dp2 x tp2": (8, ["parallel=3d"]),
}


def measure_rank(*, rank: int, world_size: int, spec_dict: dict) -> dict:
    import torch
    import torch.distributed as dist

    from conf.spec import RunSpec
    from conf.spec_io import spec_from_dict
    from tests.distributed.layout_parity import held_bytes, local_bytes, named_params
    from training.data import build_train_batches
    from training.parallel_model import build_parallel_model
    from training.optim import build_optimizers
    from training.step import clip_and_step, forward_backward

    spec = spec_from_dict(RunSpec, spec_dict)
    cpu = torch.device("cpu")
    layout = build_parallel_model(spec, rank=rank, device=cpu)
    optimizers = build_optimizers(layout, optim=spec.optim, state_dtype="fp32")
    batches = build_train_batches(spec.data, spec.training, dp_rank=layout.dims.dp_rank(rank),
                                  dp_size=layout.dims.dp)
    times, grads_bytes = [], 0
    for step in range(WARMUP + STEPS):
        dist.barrier()
        start = time.perf_counter()
        forward_backward(layout, batches.next_step(), device=cpu,
                         autocast=torch.autocast("cpu", enabled=False))
        grads_bytes = local_bytes(p.grad for p in named_params(layout).values())
        clip_and_step(layout, optimizers, grad_clip=1.0)
        elapsed = torch.tensor([time.perf_counter() - start])
        dist.all_reduce(elapsed, op=dist.ReduceOp.MAX)
        if step >= WARMUP:
            times.append(float(elapsed))
    return {"step_s": statistics.median(times),
            "held": sum(held_bytes(layout, optimizers, grads_bytes=grads_bytes).values())}


def measure_single(spec) -> dict:
    """World size 1 without a process group: the reference."""
    import torch

    from tests.distributed.layout_parity import held_bytes, local_bytes
    from training.data import build_train_batches
    from training.parallel_model import ParallelModel
    from training.model import build_model
    from training.optim import build_optimizer
    from training.step import clip_and_step, forward_backward

    torch.set_num_threads(1)
    cpu = torch.device("cpu")
    layout = ParallelModel.single(build_model(spec.model, device=cpu, seed=0))
    optimizers = [build_optimizer(layout.parts[0], optim=spec.optim)]
    batches = build_train_batches(spec.data, spec.training, dp_rank=0, dp_size=1)
    times = []
    for step in range(WARMUP + STEPS):
        start = time.perf_counter()
        forward_backward(layout, batches.next_step(), device=cpu,
                         autocast=torch.autocast("cpu", enabled=False))
        grads = local_bytes(p.grad for p in layout.parameters())
        clip_and_step(layout, optimizers, grad_clip=1.0)
        if step >= WARMUP:
            times.append(time.perf_counter() - start)
    return {"step_s": statistics.median(times),
            "held": sum(held_bytes(layout, optimizers, grads_bytes=grads).values())}


def main() -> None:
    from conf.spec_io import spec_to_dict
    from tests.distributed.spawn import run_on_ranks
    from tests.support.specs import cpu_spec
    from parallel.cost.memory import estimate_memory

    extra = sys.argv[1:]
    print(f"{'layout':18} {'ranks':>5} {'step ms':>9} {'held MiB':>9} {'plan MiB':>9}")
    with tempfile.TemporaryDirectory() as tmp:
        for name, (world, overrides) in LAYOUTS.items():
            spec = cpu_spec(*COMMON, *overrides, *extra, f"cluster.procs_per_node={world}")
            if world == 1:
                results = [measure_single(spec)]
            else:
                results = run_on_ranks(measure_rank, world_size=world, workdir=Path(tmp),
                                       kwargs={"spec_dict": spec_to_dict(spec)}, timeout_s=600)
            planned = max(m.params + m.grads + m.optimizer
                          for m in (estimate_memory(spec, rank=r) for r in range(world)))
            held = max(r["held"] for r in results)
            print(f"{name:18} {world:>5} {results[0]['step_s'] * 1e3:>9.1f} "
                  f"{held / 2**20:>9.3f} {planned / 2**20:>9.3f}", flush=True)


if __name__ == "__main__":
    main()
