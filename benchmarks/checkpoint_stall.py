"""How long each checkpoint save holds the training step: synchronous against
checkpoint.async_save, side by side in one run (a report, not a timed test).

  python benchmarks/checkpoint_stall.py [--ranks 2] [--mib 64] [--saves 4] [--step-s 1.0]

Each of `--ranks` gloo processes (spawned, FileStore) holds an MLP of about `--mib` MiB of
fp32 weights with AdamW state (3x that in a checkpoint), trains `--step-s` seconds of matmuls
between saves, and saves through training/checkpoint_saver.py exactly as the loop does. The
stall is the time `CheckpointSaver.save` holds the step (async: wait for the previous save if
it is still in flight -- shown apart -- then stage to host memory; the thread writes, hashes
and publishes while the next steps train); "publish" is from the save's start until its
checkpoint is complete. The first async save also creates the savers' gloo group. Same model, same saves, the two modes one after the
other into one temporary folder; the ratio is sync stall / async stall (median per save).
"""
from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from pathlib import Path

import torch
import torch.distributed as dist
import torch.multiprocessing as mp


def _model(mib: int) -> tuple[torch.nn.Module, torch.optim.Optimizer]:
    width = 1024
    layers = max(1, mib * 2**20 // (4 * width * width))
    torch.manual_seed(0)
    model = torch.nn.Sequential(*[torch.nn.Linear(width, width) for _ in range(layers)])
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4)
    return model, optimizer


def _train_for(model, optimizer, seconds: float) -> None:
    deadline = time.perf_counter() + seconds
    while time.perf_counter() < deadline:
        model(torch.randn(16, 1024)).square().mean().backward()
        optimizer.step()
        optimizer.zero_grad()


def _rank(rank: int, world: int, store: str, root: str, args: dict, out: str) -> None:
    from training.checkpoint_saver import CheckpointSaver

    torch.set_num_threads(1)
    dist.init_process_group("gloo", store=dist.FileStore(store, world), rank=rank,
                            world_size=world)
    model, optimizer = _model(args["mib"])
    _train_for(model, optimizer, 0.1)
    results = {}
    for mode in ("sync", "async"):
        saver = CheckpointSaver(async_save=mode == "async")
        for n in range(args["saves"]):
            saver.save(Path(root) / mode, step=n + 1, model=model, optimizer=optimizer,
                       extra={}, metadata={}, keep_last=2)
            _train_for(model, optimizer, args["step_s"])
        saver.wait()  # as the end of a run does
        results[mode] = {"stall": saver.stall_s, "publish": saver.publish_s,
                         "waited": saver.waited_s}
    if rank == 0:
        torch.save(results, out)
    dist.barrier()
    dist.destroy_process_group()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--ranks", type=int, default=2)
    parser.add_argument("--mib", type=int, default=64)
    parser.add_argument("--saves", type=int, default=4)
    parser.add_argument("--step-s", type=float, default=1.0)
    args = vars(parser.parse_args())
    with tempfile.TemporaryDirectory() as tmp:
        out = str(Path(tmp) / "results.pt")
        mp.start_processes(_rank, args=(args["ranks"], str(Path(tmp) / "store"), tmp, args, out),
                           nprocs=args["ranks"], start_method="spawn")
        results = torch.load(out)
    print(f"{args['ranks']} ranks, ~{args['mib']} MiB of fp32 weights each (+AdamW state), "
          f"{args['saves']} saves, {args['step_s']} s of training between saves")
    print(f"{'mode':6} {'stall per save (s)':>36} {'median':>8} {'of it waiting':>14} "
          f"{'publish (s)':>12}")
    for mode, r in results.items():
        stalls = " ".join(f"{s:.3f}" for s in r["stall"])
        print(f"{mode:6} {stalls:>36} {statistics.median(r['stall']):8.3f} "
              f"{statistics.median(r['waited']):14.3f} {statistics.median(r['publish']):12.3f}")
    ratio = statistics.median(results["sync"]["stall"]) / statistics.median(results["async"]["stall"])
    print(f"stall ratio sync/async (median per save): {ratio:.1f}x")


if __name__ == "__main__":
    main()
