"""Step time and per-rank static memory of every layout on one small model (CPU, gloo).

For each layout: build it (training.parallel_model.build_parallel_model), take WARMUP steps, then time STEPS
steps (a step's time is the slowest rank's); report the median, the fastest step, the median
CPU time of the busiest rank, the load average when the layout finished, and the largest
per-rank bytes of parameters + gradients + optimizer state actually held next to the plan's
estimate. All layouts run in this one invocation (world sizes 1, 2, 4, 8 on this machine's
cores), so the ratios between them are comparable; absolute times on a 2-core machine are not.
Other processes on a shared machine stretch wall times; the model is compared with each
layout's fastest step, the one such load stretched least. A layout of 2 or more ranks also
waits, at every collective, for a peer the load has descheduled: at load 14, ddp's fastest
step took 29.9 ms while its busiest rank used 16.0 ms of CPU (single: 25.4 vs 23.7), and the
model, which predicts an otherwise idle machine, gave ddp 18 ms. Read `cpu ms` beside it.

Then the step-time model (parallel/cost/step_time.py) is calibrated on this machine
(parallel/cost/calibrate.py: the link from an all-reduce bandwidth table over 2 ranks, as
preflight measures it; matmul efficiency and per-block overhead from the measured runs) and
predicts every layout: predicted vs measured, the Spearman rank correlation and the median
absolute error, twice: calibrated on CALIBRATION_SET only (the rest are held out), and on
every layout. Targets (issue 10): Spearman >= 0.9, median error <= 20%; reported, not asserted.

    .venv/bin/python benchmarks/layout_step_time.py [model=debug ...]   # default: tiny, 4 layers
    .venv/bin/python benchmarks/layout_step_time.py --report FILE   # re-fit a saved run
    .venv/bin/python benchmarks/layout_step_time.py --layouts single,ddp,zero1 --rounds 3

--layouts measures only the named layouts (comma-separated LAYOUTS keys); --rounds N measures
them N times, round-robin (so a change of load hits every layout alike), and keeps each
layout's fastest round. A full run saves its measurements to /tmp/layout_step_time.json
(LAST_RUN) for --report; a --layouts run to /tmp/layout_step_time.subset.json.
"""
from __future__ import annotations

import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

WARMUP, STEPS = 2, 8
LAST_RUN = Path(tempfile.gettempdir()) / "layout_step_time.json"
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
    from conf.run_dir.spec_io import spec_from_dict
    from tests.support.layout_parity import held_bytes, local_bytes, named_params
    from training.data.build import build_train_batches
    from training.parallel_model import build_parallel_model
    from training.optim import build_optimizers
    from training.step import clip_and_step, forward_backward

    spec = spec_from_dict(RunSpec, spec_dict)
    cpu = torch.device("cpu")
    layout = build_parallel_model(spec, rank=rank, device=cpu)
    optimizers = build_optimizers(layout, optim=spec.optim, state_dtype="fp32")
    batches = build_train_batches(spec.data, spec.training, dp_rank=layout.dims.dp_rank(rank),
                                  dp_size=layout.dims.dp)
    times, cpu_times, update_cpu, grads_bytes = [], [], [], 0
    for step in range(WARMUP + STEPS):
        dist.barrier()
        start, cpu_start = time.perf_counter(), time.process_time()
        forward_backward(layout, batches.next_step(), device=cpu,
                         autocast=torch.autocast("cpu", enabled=False))
        grads_bytes = local_bytes(p.grad for p in named_params(layout).values())
        update_start = time.process_time()
        clip_and_step(layout, optimizers, grad_clip=1.0)
        now = time.process_time()
        elapsed = torch.tensor([time.perf_counter() - start, now - cpu_start, now - update_start])
        dist.all_reduce(elapsed, op=dist.ReduceOp.MAX)
        if step >= WARMUP:
            times.append(float(elapsed[0]))
            cpu_times.append(float(elapsed[1]))
            update_cpu.append(float(elapsed[2]))
    return {"step_s": statistics.median(times), "fastest_s": min(times),
            "cpu_s": statistics.median(cpu_times), "update_cpu_s": statistics.median(update_cpu),
            "held": sum(held_bytes(layout, optimizers, grads_bytes=grads_bytes).values())}


def measure_single(spec) -> dict:
    """World size 1 without a process group: the reference."""
    import torch

    from tests.support.layout_parity import held_bytes, local_bytes
    from training.data.build import build_train_batches
    from training.parallel_model import ParallelModel
    from training.model_builder import build_model
    from training.optim import build_optimizer
    from training.step import clip_and_step, forward_backward

    torch.set_num_threads(1)
    cpu = torch.device("cpu")
    layout = ParallelModel.single(build_model(spec.model, device=cpu, seed=0))
    optimizers = [build_optimizer(layout.parts[0], optim=spec.optim)]
    batches = build_train_batches(spec.data, spec.training, dp_rank=0, dp_size=1)
    times, cpu_times, update_cpu = [], [], []
    for step in range(WARMUP + STEPS):
        start, cpu_start = time.perf_counter(), time.process_time()
        forward_backward(layout, batches.next_step(), device=cpu,
                         autocast=torch.autocast("cpu", enabled=False))
        grads = local_bytes(p.grad for p in layout.parameters())
        update_start = time.process_time()
        clip_and_step(layout, optimizers, grad_clip=1.0)
        if step >= WARMUP:
            times.append(time.perf_counter() - start)
            cpu_times.append(time.process_time() - cpu_start)
            update_cpu.append(time.process_time() - update_start)
    return {"step_s": statistics.median(times), "fastest_s": min(times),
            "cpu_s": statistics.median(cpu_times), "update_cpu_s": statistics.median(update_cpu),
            "held": sum(held_bytes(layout, optimizers, grads_bytes=grads).values())}


CALIBRATION_SET = ("single", "ddp", "tp (SP)", "pp2 x dp2")
"""Layouts the held-out calibration fits on (1, 2 and 4 ranks: the core sharing is the
model's; one tp layout for the tensor-parallel overhead)."""


def measure_link(*, rank: int, world_size: int) -> dict:
    """The preflight bandwidth table (all-reduce, gloo) over `world_size` ranks."""
    import torch

    from training.preflight import bandwidth_table

    rows = bandwidth_table(device=torch.device("cpu"), max_bytes=4 << 20, iters=10)
    return {"world_size": world_size, "bandwidth": rows, "ranks_by_host": {"localhost": [0, 1]}}


def spearman(xs: list[float], ys: list[float]) -> float:
    """Spearman rank correlation (average ranks for ties)."""
    def ranks(values):
        order = sorted(range(len(values)), key=values.__getitem__)
        out = [0.0] * len(values)
        i = 0
        while i < len(order):
            j = i
            while j + 1 < len(order) and values[order[j + 1]] == values[order[i]]:
                j += 1
            for k in range(i, j + 1):
                out[order[k]] = (i + j) / 2
            i = j + 1
        return out
    rx, ry = ranks(xs), ranks(ys)
    mx, my = statistics.fmean(rx), statistics.fmean(ry)
    cov = sum((a - mx) * (b - my) for a, b in zip(rx, ry))
    return cov / (sum((a - mx) ** 2 for a in rx) * sum((b - my) ** 2 for b in ry)) ** 0.5


def report_model(specs: dict, measured: dict, link_report: dict, *, what: str) -> None:
    """Calibrate, predict every layout, print predicted vs measured (`what`: which step time
    of each layout `measured` holds)."""
    from parallel.cost.calibrate import Sample, calibrate, predict

    samples = {name: Sample(name=name, spec=specs[name], measured_s=measured[name])
               for name in specs}
    fits = [("calibrated on every layout", tuple(specs))]
    if set(CALIBRATION_SET) <= set(specs) and len(specs) > len(CALIBRATION_SET):
        fits.insert(0, ("held out: calibrated on " + ", ".join(CALIBRATION_SET),
                        CALIBRATION_SET))
    for label, names in fits:
        fit = calibrate([samples[n] for n in names], preflights=[link_report])
        print(f"\nstep-time model vs the {what}, {label}:")
        print("  " + ", ".join(f"{k}={v:.4g}" for k, v in sorted(fit.constants.items())))
        print(f"  {'layout':18} {'measured ms':>11} {'predicted ms':>12} {'error':>7}")
        predicted = {n: predict(specs[n], fit.constants) for n in specs}
        for n in specs:
            print(f"  {n:18} {measured[n] * 1e3:>11.1f} {predicted[n] * 1e3:>12.1f} "
                  f"{predicted[n] / measured[n] - 1:>+7.1%}")
        errors = [abs(predicted[n] / measured[n] - 1) for n in specs]
        rho = spearman([measured[n] for n in specs], [predicted[n] for n in specs])
        print(f"  Spearman {rho:.3f} (target >= 0.9); median |error| "
              f"{statistics.median(errors):.1%} (target <= 20%)")


def main() -> None:
    from conf.run_dir.spec_io import spec_to_dict
    from tests.support.spawn import run_on_ranks
    from tests.support.specs import cpu_spec
    from parallel.cost.memory import estimate_memory

    import dataclasses
    import os

    extra = sys.argv[1:]
    if extra[:1] == ["--report"]:
        return report_saved(Path(extra[1]))
    names, rounds, extra = _options(extra)
    load = os.getloadavg()[0]
    print(f"machine: {os.cpu_count()} cores, load average {load:.1f} at start")
    specs, measured, fastest, cpu, update, loads = {}, {}, {}, {}, {}, {}
    print(f"{'layout':18} {'ranks':>5} {'step ms':>9} {'min ms':>7} {'cpu ms':>7} "
          f"{'upd ms':>6} {'load':>5} {'held MiB':>9} {'plan MiB':>9}")
    with tempfile.TemporaryDirectory() as tmp:
        for name, (world, overrides) in [(n, LAYOUTS[n]) for _ in range(rounds) for n in names]:
            spec = cpu_spec(*COMMON, *overrides, *extra, f"cluster.procs_per_node={world}")
            spec = dataclasses.replace(spec, host=dataclasses.replace(
                spec.host, cpu_count=os.cpu_count() or 1))
            if world == 1:
                results = [measure_single(spec)]
            else:
                results = run_on_ranks(measure_rank, world_size=world, workdir=Path(tmp),
                                       kwargs={"spec_dict": spec_to_dict(spec)}, timeout_s=600)
            planned = max(m.params + m.grads + m.optimizer
                          for m in (estimate_memory(spec, rank=r) for r in range(world)))
            held = max(r["held"] for r in results)
            r = results[0]
            print(f"{name:18} {world:>5} {r['step_s'] * 1e3:>9.1f} {r['fastest_s'] * 1e3:>7.1f} "
                  f"{r['cpu_s'] * 1e3:>7.1f} {r['update_cpu_s'] * 1e3:>6.1f} "
                  f"{os.getloadavg()[0]:>5.1f} {held / 2**20:>9.3f} {planned / 2**20:>9.3f}",
                  flush=True)
            if name in fastest and fastest[name] <= r["fastest_s"]:
                continue  # an earlier round of this layout was faster: keep that one
            specs[name], measured[name], fastest[name] = spec, r["step_s"], r["fastest_s"]
            cpu[name], update[name], loads[name] = r["cpu_s"], r["update_cpu_s"], \
                os.getloadavg()[0]
        link = run_on_ranks(measure_link, world_size=2, workdir=Path(tmp), kwargs={},
                            timeout_s=600)[0]
    print(f"load average {os.getloadavg()[0]:.1f} at the end")
    saved = LAST_RUN if list(names) == list(LAYOUTS) else LAST_RUN.with_suffix(".subset.json")
    saved.write_text(json.dumps({"extra": extra, "measured": measured, "link": link,
                                 "fastest": fastest, "cpu": cpu, "update_cpu": update,
                                 "load": loads}))
    report_model(specs, fastest, link, what="fastest step")


def _options(args: list[str]) -> tuple[list[str], int, list[str]]:
    """(--layouts names, --rounds N, the remaining overrides); exits 2 naming an unknown
    layout."""
    names, rounds, rest = list(LAYOUTS), 1, []
    it = iter(args)
    for arg in it:
        if arg == "--layouts":
            names = [n.strip() for n in next(it, "").split(",") if n.strip()]
            unknown = [n for n in names if n not in LAYOUTS]
            if unknown or not names:
                sys.exit(f"--layouts={','.join(unknown) or '(empty)'}: not a layout of this "
                         f"benchmark (fix: choose from {', '.join(LAYOUTS)})")
        elif arg == "--rounds":
            rounds = max(1, int(next(it, "1")))
        else:
            rest.append(arg)
    return names, rounds, rest


def report_saved(path: Path) -> None:
    """The model's report on measurements a previous run saved."""
    import dataclasses
    import os

    from tests.support.specs import cpu_spec

    saved = json.loads(path.read_text())
    specs = {}
    for name, (world, overrides) in LAYOUTS.items():
        if name not in saved["measured"]:
            continue  # a --layouts run
        spec = cpu_spec(*COMMON, *overrides, *saved["extra"], f"cluster.procs_per_node={world}")
        specs[name] = dataclasses.replace(spec, host=dataclasses.replace(
            spec.host, cpu_count=os.cpu_count() or 1))
    if "fastest" in saved:
        report_model(specs, saved["fastest"], saved["link"], what="fastest step")
    else:  # saved before the fastest step was kept
        report_model(specs, saved["measured"], saved["link"], what="median step")


if __name__ == "__main__":
    main()
