"""Tokens/s of meshrun's training step against a minimal hand-written PyTorch loop.

Same model (built by training.model), same batch shape, same optimizer settings, one process,
measured alternately in blocks within one run so machine noise hits both sides alike.

    .venv/bin/python benchmarks/core_vs_plain_loop.py [overrides...]   # default: model=debug
"""
from __future__ import annotations

import statistics
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

BLOCKS, STEPS_PER_BLOCK, WARMUP_STEPS = 6, 10, 5


def build_core(overrides: list[str]):
    import torch.distributed as dist

    from conf.compose import compose_config
    from conf.resolve import resolve
    from launcher.hardware import probe_host
    from launcher.commands import with_prepared_data
    from training.dist import init_distributed
    from training.train_state import build_train_state

    cfg = compose_config(["parallel=single", "logging=disabled", *overrides])
    spec = with_prepared_data(resolve(cfg, host=probe_host()))
    run_dir = Path(tempfile.mkdtemp())
    (run_dir / "wandb_id.txt").write_text("bench\n")
    store = dist.FileStore(str(run_dir / "store"), 1)
    dist.init_process_group("gloo", store=store, rank=0, world_size=1)
    return spec, build_train_state(spec, run_dir, init_distributed(spec.training.device))


def plain_loop(spec, batch):
    """What a person writes by hand: forward, loss, backward, clip, step."""
    import torch
    import torch.nn.functional as F

    from training.model import build_model

    model = build_model(spec.model, device=torch.device(spec.training.device),
                        seed=spec.training.seed)
    opt = torch.optim.AdamW(model.parameters(), lr=spec.optim.lr,
                            betas=(spec.optim.beta1, spec.optim.beta2))
    inputs, targets = batch

    def step() -> None:
        logits = model(inputs)
        loss = F.cross_entropy(logits.flatten(0, 1), targets.flatten())
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), spec.optim.grad_clip)
        opt.step()
        opt.zero_grad(set_to_none=True)

    return step


def tokens_per_s(step, tokens_per_step: int, steps: int) -> float:
    start = time.perf_counter()
    for _ in range(steps):
        step()
    return tokens_per_step * steps / (time.perf_counter() - start)


def main() -> None:
    import torch

    from training.loop import train_step

    spec, trainer = build_core(sys.argv[1:] or ["model=debug"])
    (batch,) = trainer.train_batches.next_step()[:1]
    plain = plain_loop(spec, batch)
    tokens = spec.training.tokens_per_step

    def core() -> None:
        train_step(trainer)

    for warm in (core, plain):
        tokens_per_s(warm, tokens, WARMUP_STEPS)
    results = {"core": [], "plain": []}
    for _ in range(BLOCKS):
        results["core"].append(tokens_per_s(core, tokens, STEPS_PER_BLOCK))
        results["plain"].append(tokens_per_s(plain, tokens, STEPS_PER_BLOCK))
    core_tps, plain_tps = (statistics.median(results[k]) for k in ("core", "plain"))
    print(f"model={spec.model.name} tokens/step={tokens} threads={torch.get_num_threads()} "
          f"blocks={BLOCKS}x{STEPS_PER_BLOCK} steps, alternating")
    print(f"  meshrun train_step: {core_tps:,.0f} tokens/s (median)")
    print(f"  plain PyTorch loop: {plain_tps:,.0f} tokens/s (median)")
    print(f"  ratio core/plain:   {core_tps / plain_tps:.3f}")


if __name__ == "__main__":
    main()
