"""The plan beside torchtitan's published Llama 3.1 8B runs, and Megatron-LM's formulas on the
same shapes. Torch-free; prints one table.

    .venv/bin/python benchmarks/published_record.py

Published numbers (PUBLISHED below): torchtitan's benchmarks/llama3_h100_202412_torchtitan.md
(github.com/pytorch/torchtitan, commit 31a17bf, "end of 2024"), Table 1 (8 GPUs) and Table 3
(128 GPUs), row "FSDP" (no torch.compile, no Float8): Llama 3.1 8B, FSDP, bf16, seq 8192
(torchtitan's llama3_8b config), local batch 2, selective (per-op) activation checkpointing,
on H100s with 96 GB HBM2e at a 500 W power limit. TPS/GPU read at step 90; memory is the max
over ranks of what torchtitan logs (the caching allocator's peak reserved memory).

Megatron-LM formulas (written from their definitions, not copied):
- FLOPs per token, `num_floating_point_operations` (megatron/training/training.py) for a
  SwiGLU GQA model: 12 L h^2 [(1 + g/a + s/h) + 1.5 f/h + V/(2 L h)] per token (forward +
  backward; the attention term full, not halved);
- memory, `theoretical_memory_usage` (megatron/training/theoretical_memory_usage.py): weights
  and optimizer at 18 bytes per parameter, 6 + 12/dp with the distributed optimizer (bf16
  weights and fp32 gradients replicated, fp32 master + Adam moments sharded); activations with
  selective recompute and sequence parallelism s b h (18 + 4 f/h) L bytes / tp (the dropout
  masks and fp16 activations of its GPT) plus the embedding input and the output layer.
"""
from __future__ import annotations

import sys
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

SOURCE = "torchtitan benchmarks/llama3_h100_202412_torchtitan.md @31a17bf"


@dataclass(frozen=True)
class Published:
    label: str
    nodes: int
    tps_per_gpu: float
    memory_gib: float
    table: str


PUBLISHED = (Published("8 x H100, FSDP", 1, 5762, 82.4, "Table 1, row FSDP"),
             Published("128 x H100, FSDP", 16, 5605, 67.0, "Table 3, row FSDP"))
SHAPE = ("model=llama3_8b", "cluster=slurm", "cluster.gpu_name=H100", "training.device=cuda",
         "parallel=fsdp", "precision=bf16", "training.seq_len=8192",
         "training.micro_batch_size=2", "training.grad_accum_steps=1", "recompute=selective")


def megatron_flops_per_token(m, seq: int) -> float:
    g_over_a = m.n_kv_heads / m.n_heads
    return 12 * m.n_layers * m.dim ** 2 * (
        (1 + g_over_a + seq / m.dim) + 1.5 * m.ffn_dim / m.dim
        + m.vocab_size / (2 * m.n_layers * m.dim))


def megatron_memory_bytes(m, *, params: int, seq: int, micro: int, dp: int, tp: int = 1) -> float:
    static = params * (6 + 12 / dp)
    per_layer = seq * micro * m.dim * (18 + 4 * m.ffn_dim / m.dim)
    embedding_input = 8 * seq * micro  # int64 ids, and the dropout mask Megatron counts
    output = 4 * seq * micro * m.dim * (1 + m.vocab_size / m.dim)
    return static + (per_layer * m.n_layers + embedding_input + output) / tp


def rows() -> list[tuple]:
    from parallel.cost.devices import GIB
    from parallel.cost.plan import make_plan
    from parallel.cost.step_time import estimate_time
    from tests.support.specs import cpu_spec

    out = []
    for pub in PUBLISHED:
        spec = cpu_spec(*SHAPE, f"cluster.nodes={pub.nodes}", "cluster.calibration=none")
        plan = make_plan(spec)
        time = estimate_time(spec, plan)
        m = spec.model
        mega_fpt = megatron_flops_per_token(m, spec.training.seq_len)
        mega_mem = megatron_memory_bytes(m, params=plan.params.total, seq=spec.training.seq_len,
                                         micro=spec.training.micro_batch_size, dp=spec.parallel.dp)
        peak = time.peak.flops
        out.append((pub, plan.memory.total / GIB, time.tokens_per_s_per_device, time.mfu,
                    mega_mem / GIB, pub.tps_per_gpu * mega_fpt / peak, plan.flops_per_token,
                    mega_fpt, time.hardware.matmul_efficiency))
    return out


def main() -> None:
    print(f"published: {SOURCE}")
    print(f"plan: meshrun {' '.join(SHAPE)} cluster.nodes=N (uncalibrated: catalogue H100 SXM, "
          "default matmul efficiency)\n")
    head = (f"{'run':18} {'what':22} {'published':>10} {'plan':>10} {'err':>7} "
            f"{'Megatron':>10} {'err':>7}")
    print(head)
    print("-" * len(head))
    for pub, mem, tps, mfu, mega_mem, mega_mfu, fpt, mega_fpt, eff in rows():
        print(f"{pub.label:18} {'memory GiB':22} {pub.memory_gib:>10.1f} {mem:>10.1f} "
              f"{mem / pub.memory_gib - 1:>+7.1%} {mega_mem:>10.1f} "
              f"{mega_mem / pub.memory_gib - 1:>+7.1%}")
        print(f"{'':18} {'tokens/s per GPU':22} {pub.tps_per_gpu:>10,.0f} {tps:>10,.0f} "
              f"{tps / pub.tps_per_gpu - 1:>+7.1%} {'-':>10} {'':>7}")
        print(f"{'':18} {'FLOPs/token (1e9)':22} {'-':>10} {fpt / 1e9:>10.2f} {'':>7} "
              f"{mega_fpt / 1e9:>10.2f} {mega_fpt / fpt - 1:>+7.1%}")
        print(f"{'':18} {'MFU of H100 SXM peak':22} {mega_mfu:>10.1%} {mfu:>10.1%} "
              f"{'':>7} (published tokens/s x Megatron FLOPs; plan at efficiency {eff:.0%})")
    print("""
Why they differ:
- tokens/s: the plan assumes the catalogue's H100 SXM peak (989 TFLOP/s bf16 at 700 W) and a
  matmul efficiency of 50% with nothing calibrated; torchtitan ran HBM2e H100s at 500 W (their
  footnote: the real peak is between SXM and NVL, unknown), eager, reaching ~34% of the SXM
  peak; their per-op SAC also re-runs every other matmul in backward (meshrun's `ops`
  policy keeps them all, so the plan counts no re-run FLOPs). Calibrating on one measured
  run (`meshrun plan --calibrate`) replaces the 50%. The
  8 -> 128 GPU drop (published -2.7%) comes from FSDP traffic moving onto InfiniBand: the
  plan's overlap rule hides all but the first/last block's share of it.
- memory: the plan counts bytes allocated at the backward's start; torchtitan reports the
  caching allocator's reserved peak (fragmentation, the all-gather/reduce-scatter streams'
  buffers), and its per-op SAC keeps every other matmul output, not all of them.
- Megatron memory: its formula is for Megatron's own layout (bf16 weights and fp32 gradients
  replicated, only the optimizer sharded, GPT activations with dropout masks), not FSDP's
  fully sharded state, so it overestimates both static and activation memory here.
- Megatron FLOPs: the same count as the plan's (6N + 12 L H Q T, head included, full
  attention term), so the implied MFU matches the plan's convention.""")


if __name__ == "__main__":
    main()
