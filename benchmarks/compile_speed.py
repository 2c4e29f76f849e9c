"""Tokens/s with training.compile=true against eager, side by side, on CPU (gloo).

Shape: torchtitan's llama3 debugmodel (dim 256, 6 layers, 16 heads, ffn 768, vocab 2048), seq
2048, global batch 8, fp32, no recompute. Layouts: one process, and 2-process FSDP (zero 3).
Each layout is built by the trainer's `build_parallel_model`, eager then compiled (inductor by
default), in the same spawned processes, so the ratio compares like with like; the compiled
run's first step (Dynamo capture + inductor build; the TORCHINDUCTOR_CACHE_DIR is a fresh
folder, so nothing is reused) is reported apart from its steady steps, which alternate with
the eager ones. A step's time is the
slowest rank's; tokens/s = global tokens per step / median step time.

The machine is shared: the 1-minute load average is printed before and after each layout.
Absolute numbers on a 2-core machine mean little; the ratio is the result.

    python benchmarks/compile_speed.py [--steps 3] [--backend inductor] [--seq-len 2048]
"""
from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

DEBUG_SHAPE = ["model=debug", "model.dim=256", "model.n_layers=6", "model.n_heads=16",
               "model.n_kv_heads=16", "model.ffn_dim=768", "model.vocab_size=2048"]
LAYOUTS = {"1 process": (1, ["parallel=single"]), "2-process FSDP": (2, ["parallel=zero3"])}


class Runner:
    """One layout built by the trainer's `build_parallel_model`, its optimizer and data."""

    def __init__(self, spec, rank: int):
        import torch

        from training.data.build import build_train_batches
        from training.optim import build_optimizers
        from training.parallel_model import build_parallel_model

        self.cpu = torch.device("cpu")
        self.layout = build_parallel_model(spec, rank=rank, device=self.cpu)
        self.optimizers = build_optimizers(self.layout, optim=spec.optim, state_dtype="fp32")
        self.batches = build_train_batches(spec.data, spec.training,
                                           dp_rank=self.layout.dims.dp_rank(rank),
                                           dp_size=self.layout.dims.dp)

    def step_s(self) -> float:
        """One training step's time (s), the slowest rank's."""
        import torch
        import torch.distributed as dist

        from training.step import clip_and_step, forward_backward

        dist.barrier()
        start = time.perf_counter()
        forward_backward(self.layout, self.batches.next_step(), device=self.cpu,
                         autocast=torch.autocast("cpu", enabled=False))
        clip_and_step(self.layout, self.optimizers, grad_clip=1.0)
        elapsed = torch.tensor([time.perf_counter() - start])
        dist.all_reduce(elapsed, op=dist.ReduceOp.MAX)
        return float(elapsed)


def measure_rank(*, rank: int, world_size: int, spec_dict: dict, steps: int,
                 cache_dir: str) -> dict:
    """First step of each (eager, then compiled: capture + build), then `steps` steps of
    each, alternating, so a change in the machine's load hits both alike."""
    import dataclasses

    import torch._inductor.config

    from conf.spec import RunSpec
    from conf.run_dir.spec_io import spec_from_dict

    os.environ["TORCHINDUCTOR_CACHE_DIR"] = os.path.join(cache_dir, f"rank{rank}")
    torch._inductor.config.compile_threads = 1
    spec = spec_from_dict(RunSpec, spec_dict)
    eager_spec = dataclasses.replace(
        spec, training=dataclasses.replace(spec.training, compile=False))
    runners = {"eager": Runner(eager_spec, rank), "compiled": Runner(spec, rank)}
    times = {name: [runner.step_s()] for name, runner in runners.items()}
    for _ in range(steps):
        for name, runner in runners.items():
            times[name].append(runner.step_s())
    return times


def load_average() -> float:
    return os.getloadavg()[0]


def run_layout(name: str, world: int, overrides: list[str], args) -> dict:
    from conf.run_dir.spec_io import spec_to_dict
    from tests.support.spawn import run_on_ranks
    from tests.support.specs import cpu_spec

    spec = cpu_spec(*DEBUG_SHAPE, f"model.max_seq_len={args.seq_len}", "data=synthetic",
                    f"training.seq_len={args.seq_len}", f"training.global_batch_size={args.batch}",
                    f"training.micro_batch_size={args.batch // world}", "training.grad_accum_steps=1",
                    f"cluster.procs_per_node={world}", *overrides, "training.compile=true",
                    f"training.compile_backend={args.backend}")
    load_before = load_average()
    with tempfile.TemporaryDirectory(prefix="compile_speed_") as work:
        times = run_on_ranks(measure_rank, world_size=world, workdir=Path(work), timeout_s=3600,
                             kwargs={"spec_dict": spec_to_dict(spec), "steps": args.steps,
                                     "cache_dir": str(Path(work) / "inductor")})[0]
    tokens = args.batch * args.seq_len
    eager_s, compiled_s = (statistics.median(times[k][1:]) for k in ("eager", "compiled"))
    return {"layout": name, "eager_tok_s": tokens / eager_s, "compiled_tok_s": tokens / compiled_s,
            "ratio": eager_s / compiled_s, "warmup_eager_s": times["eager"][0],
            "warmup_compiled_s": times["compiled"][0], "load": (load_before, load_average())}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--steps", type=int, default=3, help="timed steps after one warm-up step")
    p.add_argument("--backend", default="inductor", choices=("inductor", "aot_eager", "eager"))
    p.add_argument("--seq-len", type=int, default=2048)
    p.add_argument("--batch", type=int, default=8, help="global batch (samples per step)")
    p.add_argument("--only", choices=tuple(LAYOUTS), default=None)
    args = p.parse_args()
    print(f"debugmodel shape, seq {args.seq_len}, global batch {args.batch}, fp32, "
          f"backend {args.backend}, {args.steps} timed steps; {os.cpu_count()} CPUs")
    print("| layout | eager tok/s | compiled tok/s | compiled/eager | first step eager s "
          "| first step compiled s (capture + build) | load avg before/after |")
    print("|---|---:|---:|---:|---:|---:|---|")
    for name, (world, overrides) in LAYOUTS.items():
        if args.only and name != args.only:
            continue
        r = run_layout(name, world, overrides, args)
        print(f"| {name} | {r['eager_tok_s']:.0f} | {r['compiled_tok_s']:.0f} | "
              f"{r['ratio']:.2f}x | {r['warmup_eager_s']:.1f} | {r['warmup_compiled_s']:.1f} | "
              f"{r['load'][0]:.1f} / {r['load'][1]:.1f} |", flush=True)


if __name__ == "__main__":
    main()
