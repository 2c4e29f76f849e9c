"""Tokens/s of meshrun's training step against an INDEPENDENT hand-written model and loop.

The plain side is the peer's `plain_loop.py` (see the peer's README), imported from its
path at run time, never copied: its own Llama (fused QKV, F.rms_norm, SDPA, SwiGLU, untied head)
and its own step (forward, cross-entropy, backward, clip, fused AdamW), so model-level costs in
meshrun's training.model_builder show up in the ratio. Both sides get the same shape (taken from the
resolved meshrun spec), the same batch tensors, one process, and are timed alternately in blocks
within one run so machine noise hits both alike.

    python benchmarks/core_vs_plain_loop.py [--blocks 6 --steps-per-block 10] [overrides...]
    # default overrides: model=debug data=synthetic
    # the torchtitan debugmodel shape:
    python benchmarks/core_vs_plain_loop.py model.dim=256 model.n_layers=6 model.n_heads=16 \
        model.n_kv_heads=16 model.ffn_dim=768 model.vocab_size=2048 model.max_seq_len=2048 \
        training.seq_len=2048 training.micro_batch_size=8 precision=fp32 data=synthetic

The peer folder is $MESHRUN_PEER, else shared/peer beside this repository
(benchmarks/peer_paths.py).
"""
from __future__ import annotations

import argparse
import importlib.util
import statistics
import sys
import tempfile
import time
from pathlib import Path
from types import ModuleType, SimpleNamespace

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from benchmarks.peer_paths import PEER_WHERE, PEER_ENV, peer_source  # noqa: E402

PEER_SRC = peer_source()
DEFAULT_OVERRIDES = ["model=debug", "data=synthetic"]


def load_plain_loop() -> ModuleType:
    """The peer's plain_loop.py as a module, loaded from its path (not part of this repo)."""
    path = PEER_SRC / "plain_loop.py"
    if not path.is_file():
        sys.exit(f"no plain loop at {path}: set {PEER_ENV} to the peer folder")
    spec = importlib.util.spec_from_file_location("peer_plain_loop", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def build_core(overrides: list[str]):
    import torch.distributed as dist

    from conf.compose import compose_config
    from conf.resolve import resolve
    from launcher.commands import with_prepared_data
    from launcher.hardware import probe_host
    from training.dist import init_distributed
    from training.train_state import build_train_state

    cfg = compose_config(["parallel=single", "logging=disabled", *overrides])
    spec = with_prepared_data(resolve(cfg, host=probe_host()))
    run_dir = Path(tempfile.mkdtemp(prefix="meshrun-bench-"))
    (run_dir / "wandb_id.txt").write_text("bench\n")
    store = dist.FileStore(str(run_dir / "store"), 1)
    dist.init_process_group("gloo", store=store, rank=0, world_size=1)
    ctx = init_distributed(spec.training.device, join_timeout_s=spec.cluster.preflight_timeout_s)
    return spec, build_train_state(spec, run_dir, ctx)


def plain_args(spec) -> SimpleNamespace:
    """plain_loop.py's arguments for the meshrun spec's shape (its defaults for the rest)."""
    m, t = spec.model, spec.training
    return SimpleNamespace(dim=m.dim, n_layers=m.n_layers, n_heads=m.n_heads,
                           n_kv_heads=m.n_kv_heads, ffn_hidden=m.ffn_dim, vocab=m.vocab_size,
                           seq_len=t.seq_len, batch=t.micro_batch_size, rope_theta=m.rope_theta,
                           naive_norm=False)


def plain_step(peer: ModuleType, spec, micro_batches: list):
    """The peer's model; the step its main() runs: forward, loss, backward, clip, AdamW."""
    import torch
    import torch.nn.functional as F

    args = plain_args(spec)
    torch.manual_seed(spec.training.seed)
    model = peer.Llama(args)
    o = spec.optim
    opt = torch.optim.AdamW(model.parameters(), lr=o.lr, betas=(o.beta1, o.beta2), eps=o.eps,
                            weight_decay=o.weight_decay, fused=True)

    def step() -> None:
        for inputs, targets in micro_batches:
            logits = model(inputs)
            loss = F.cross_entropy(logits.float().view(-1, args.vocab), targets.reshape(-1))
            (loss / len(micro_batches)).backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), o.grad_clip)
        opt.step()
        opt.zero_grad(set_to_none=True)

    return step, sum(p.numel() for p in model.parameters())


def tokens_per_s(step, tokens_per_step: int, steps: int) -> float:
    start = time.perf_counter()
    for _ in range(steps):
        step()
    return tokens_per_step * steps / (time.perf_counter() - start)


def shape_line(spec) -> str:
    m, t = spec.model, spec.training
    return (f"model={m.name} dim={m.dim} layers={m.n_layers} heads={m.n_heads} "
            f"kv_heads={m.n_kv_heads} ffn={m.ffn_dim} vocab={m.vocab_size} seq={t.seq_len} "
            f"micro_batch={t.micro_batch_size} grad_accum={t.grad_accum_steps} "
            f"precision={spec.precision.name} compute={spec.precision.compute_dtype} "
            f"tie_embeddings={m.tie_embeddings}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0],
                                     epilog=f"the peer's folder: {PEER_WHERE}")
    parser.add_argument("--blocks", type=int, default=6)
    parser.add_argument("--steps-per-block", type=int, default=10)
    parser.add_argument("--warmup-steps", type=int, default=5)
    args, overrides = parser.parse_known_args()
    overrides = overrides or DEFAULT_OVERRIDES

    import torch

    from training.loop import train_step

    peer = load_plain_loop()
    spec, state = build_core(overrides)
    micro_batches = list(state.train_batches.next_step())
    plain, plain_params = plain_step(peer, spec, micro_batches)
    core_params = sum(p.numel() for part in state.model.parts for p in part.parameters())
    tokens = spec.training.tokens_per_step

    def core() -> None:
        train_step(state)

    for warm in (core, plain):
        tokens_per_s(warm, tokens, args.warmup_steps)
    results = {"core": [], "plain": []}
    for _ in range(args.blocks):
        results["core"].append(tokens_per_s(core, tokens, args.steps_per_block))
        results["plain"].append(tokens_per_s(plain, tokens, args.steps_per_block))
    core_tps, plain_tps = (statistics.median(results[k]) for k in ("core", "plain"))
    print(f"overrides: {' '.join(overrides)}")
    print(f"shape: {shape_line(spec)} tokens/step={tokens}")
    print(f"params: meshrun {core_params:,}  plain {plain_params:,}  "
          f"threads={torch.get_num_threads()}"
          f"  blocks={args.blocks}x{args.steps_per_block} steps, alternating")
    print(f"plain loop: {PEER_SRC / 'plain_loop.py'} (its model, fused AdamW; meshrun: "
          f"training.model_builder + train_step)")
    print(f"  meshrun train_step: {core_tps:,.0f} tokens/s (median of {args.blocks})")
    print(f"  plain PyTorch loop: {plain_tps:,.0f} tokens/s (median of {args.blocks})")
    print(f"  ratio meshrun/plain: {core_tps / plain_tps:.3f}")


if __name__ == "__main__":
    main()
