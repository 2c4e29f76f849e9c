"""Tokens/s of an MoE model against a dense Llama of the same active parameters, side by side.

Forward + backward + AdamW step of each model on the same token batch in one process, timed
alternately round after round (the machine is shared: the order rotates, medians over the
rounds after a warm-up, ratios within this run only). The MoE is meshrun's `moe` family
(tiny_moe with --moe overrides; default: dim 256, 4 layers, 8 experts top-2, every block
MoE, no q/k norms); the dense model has its dim, layers, heads and vocabulary and the SwiGLU
width whose parameter count equals the MoE's active count (parallel/cost/params.param_counts: what a
token uses, embedding and head included); both counts are printed. Rows:

  dense fp32, moe fp32 (experts looped: torch's grouped GEMM is bf16 only);
  with --bf16 (autocast with fp32 master weights, as precision=bf16 trains): dense bf16,
  moe bf16 grouped (torch._grouped_mm, where this torch has it on CPU), moe bf16 looped
  (GroupedExperts.allow_grouped_mm off)

Each row also shows the AdamW step's own time (it scales with all parameters, the MoE's
inactive experts included). With --torchtitan, torchtitan's
Qwen3-MoE at the same shape (its registry's layer builder; the peer: $MESHRUN_PEER, else
shared/peer beside the repository; its venv from setup.sh in $PEER_DIR, else setup.sh's
default, see benchmarks/peer_paths.py) is timed the same way under the peer's Python, in a
subprocess, beside a meshrun MoE row with Qwen3's q/k norms on ("moe fp32 qk-norm"); when
the peer cannot build it the reason is printed instead.

    python benchmarks/moe_vs_dense.py [--threads 1] [--batch 4] [--seq-len 256] [--rounds 7]
        [--moe model.moe.num_experts=16 ...] [--bf16] [--torchtitan]
"""
from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from benchmarks.peer_paths import PEER_DIR_WHERE, PEER_WHERE, peer_python, peer_source  # noqa: E402

MOE_SHAPE = ("model.dim=256", "model.n_layers=4", "model.n_heads=8", "model.n_kv_heads=4",
             "model.vocab_size=2048", "model.max_seq_len=2048", "model.moe.num_experts=8",
             "model.moe.top_k=2", "model.moe.expert_ffn_dim=256",
             "model.moe.first_dense_layers=0", "model.qk_norm=false")
"""q/k norms off: the dense Llama family has none (Mixtral's attention, Qwen3-MoE's router)."""
SHARED = ("data=synthetic", "logging=disabled", "checkpoint.export_safetensors=false")


def model_spec(*overrides: str):
    from conf.compose import compose_config
    from conf.resolve import resolve
    from conf.spec import HostSpec

    host = HostSpec(gpu_name="", gpu_count=0, compute_capability=0.0, cpu_count=2)
    return resolve(compose_config([*SHARED, *overrides]), host=host, check_paths=False).model


def dense_like(moe, moe_overrides: list[str]):
    """The dense Llama with the MoE's shape and the SwiGLU width whose parameter count equals
    the MoE's active count (the count is linear in the width: solved from two widths)."""
    from parallel.cost.params import param_counts

    shape = [o for o in moe_overrides if not o.startswith("model.moe.")]
    dense = ["model=tiny", "model.family=llama", *shape]
    low, high = (param_counts(model_spec(*dense, f"model.ffn_dim={w}")).total for w in (8, 16))
    target = param_counts(moe).active
    width = max(8, round((8 + (target - low) * 8 / (high - low)) / 8) * 8)
    return model_spec(*dense, f"model.ffn_dim={width}")


def build(spec, *, grouped: bool):
    import torch

    from training.model_builder import build_model

    model = build_model(spec, device=torch.device("cpu"), seed=0)
    for module in model.modules():
        if hasattr(module, "allow_grouped_mm"):
            module.allow_grouped_mm = grouped
    return model, torch.optim.AdamW(model.parameters(), lr=1e-4)


def train_step(model, optimizer, tokens, dtype) -> float:
    """One forward + backward + AdamW step; the seconds of the AdamW step alone."""
    import torch
    import torch.nn.functional as F

    optimizer.zero_grad(set_to_none=True)
    with torch.autocast("cpu", dtype=dtype, enabled=dtype != torch.float32):
        logits = model(tokens[:, :-1])
    loss = F.cross_entropy(logits.flatten(0, 1).float(), tokens[:, 1:].flatten())
    extra = model.router_losses() if hasattr(model, "router_losses") else None
    (loss if extra is None else loss + extra).backward()
    start = time.perf_counter()
    optimizer.step()
    return time.perf_counter() - start


def time_rounds(rows: dict, tokens, rounds: int) -> dict[str, list[tuple[float, float]]]:
    """{row: (step seconds, AdamW seconds) of each round after the first}, the order rotated
    each round."""
    times: dict[str, list[tuple[float, float]]] = {name: [] for name in rows}
    names = list(rows)
    for r in range(rounds):
        for name in names[r % len(names):] + names[:r % len(names)]:
            model, optimizer, dtype = rows[name]
            start = time.perf_counter()
            adamw = train_step(model, optimizer, tokens, dtype)
            if r:
                times[name].append((time.perf_counter() - start, adamw))
    return times


def peer_shape(moe) -> dict:
    """The MoE model's shape as moe_torchtitan_peer.py --shape takes it."""
    return {"dim": moe.dim, "n_layers": moe.n_layers, "n_heads": moe.n_heads,
            "n_kv_heads": moe.n_kv_heads, "head_dim": moe.head_dim,
            "vocab_size": moe.vocab_size, "moe_hidden_dim": moe.expert_ffn_dim,
            "num_experts": moe.moe.num_experts, "top_k": moe.moe.top_k}


def torchtitan_row(a, shape: dict) -> dict:
    """torchtitan's Qwen3-MoE of `shape` under the peer's Python ({'error': why} when it
    cannot run)."""
    if not (peer_source() / "README.md").is_file():
        return {"error": f"no peer folder at {peer_source()} ({PEER_WHERE})"}
    python = peer_python()
    if not python.exists():
        return {"error": f"no peer venv at {python.parent.parent} (run "
                         f"{peer_source() / 'setup.sh'}, or set PEER_DIR)"}
    command = [str(python), str(Path(__file__).with_name("moe_torchtitan_peer.py")),
               "--threads", str(a.threads), "--batch", str(a.batch), "--seq-len",
               str(a.seq_len), "--rounds", str(a.rounds), "--shape", json.dumps(shape)]
    done = subprocess.run(command, capture_output=True, text=True)
    lines = [line for line in done.stdout.splitlines() if line.startswith("{")]
    if done.returncode or not lines:
        return {"error": (done.stderr.strip().splitlines() or ["no output"])[-1]}
    return json.loads(lines[-1])


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                epilog=f"the peer's folder: {PEER_WHERE}; its venv: in "
                                       f"{PEER_DIR_WHERE}")
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--batch", type=int, default=4)
    p.add_argument("--seq-len", type=int, default=256)
    p.add_argument("--rounds", type=int, default=7)
    p.add_argument("--moe", nargs="*", default=[], help="more overrides of the MoE model")
    p.add_argument("--bf16", action="store_true",
                   help="add the bf16 autocast rows (slow on a CPU without bf16 matmuls)")
    p.add_argument("--torchtitan", action="store_true")
    a = p.parse_args()
    import torch

    from parallel.cost.params import param_counts
    from training.models.moe.model.grouped_experts import grouped_mm_on_cpu

    torch.set_num_threads(a.threads)
    overrides = [*MOE_SHAPE, *a.moe]
    moe = model_spec("model=tiny_moe", *overrides)
    dense = dense_like(moe, overrides)
    counts = {"moe": param_counts(moe), "dense": param_counts(dense)}
    print(f"moe: {counts['moe'].total:,} params, {counts['moe'].active:,} active "
          f"({moe.moe.num_experts} experts top-{moe.moe.top_k}, expert ffn "
          f"{moe.expert_ffn_dim}); dense: {counts['dense'].total:,} params (ffn {dense.ffn_dim})")
    bf16, fp32 = torch.bfloat16, torch.float32
    plan = {"dense fp32": (dense, fp32, False), "moe fp32 looped": (moe, fp32, False)}
    if a.torchtitan:  # Qwen3's attention has q/k norms: the like-for-like row for torchtitan
        plan["moe fp32 qk-norm"] = (model_spec("model=tiny_moe", *overrides,
                                               "model.qk_norm=true"), fp32, False)
    if a.bf16:
        plan |= {"dense bf16": (dense, bf16, False), "moe bf16 looped": (moe, bf16, False)}
        if grouped_mm_on_cpu():
            plan["moe bf16 grouped"] = (moe, bf16, True)
        else:
            print("torch._grouped_mm does not run on this CPU: no grouped row")
    rows = {name: (*build(spec, grouped=grouped), dtype)
            for name, (spec, dtype, grouped) in plan.items()}
    tokens = torch.randint(0, moe.vocab_size, (a.batch, a.seq_len + 1),
                           generator=torch.Generator().manual_seed(0))
    times = time_rounds(rows, tokens, a.rounds)
    step_tokens = a.batch * a.seq_len
    print(f"forward+backward+AdamW, batch {a.batch} x seq {a.seq_len}, {a.threads} thread(s), "
          f"torch {torch.__version__}, median of {a.rounds - 1} rounds after a warm-up:")
    speeds = {name: step_tokens / statistics.median(t for t, _ in values)
              for name, values in times.items()}
    for name, values in times.items():
        reference = speeds["dense " + name.split()[1]]
        adamw = statistics.median(o for _, o in values)
        print(f"  {name:17s} {speeds[name]:9,.0f} tok/s  x{speeds[name] / reference:.2f} of "
              f"dense  (AdamW {adamw:.3f} s of each; rounds "
              f"{' '.join(f'{t:.3f}' for t, _ in values)} s)")
    if "moe bf16 grouped" in speeds:
        ratio = speeds["moe bf16 grouped"] / speeds["moe bf16 looped"]
        print(f"  grouped / looped (bf16): x{ratio:.2f}")
    if a.torchtitan:
        row = torchtitan_row(a, peer_shape(moe))
        if "error" in row:
            print(f"  torchtitan MoE: not run: {row['error']}")
        else:
            ours = speeds["moe fp32 qk-norm"]
            print(f"  torchtitan MoE ({row['model']}, {row['params']:,} params, fp32): "
                  f"{row['tokens_per_s']:9,.0f} tok/s; meshrun's moe fp32 qk-norm is "
                  f"x{ours / row['tokens_per_s']:.2f} of it (torchtitan in a separate "
                  f"process after these rounds)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
