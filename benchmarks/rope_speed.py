"""RoPE cost in the model's forward+backward, before and after issue 14's change, side by side.

"before": the previous `Attention.forward` (RoPE after the head transpose as Hugging Face
writes it, x * cos + cat(-x2, x1) * sin). "after": this tree's (before the transpose, one
multiply, a swap and a fused multiply-add on the precomputed cos and sign-folded sin
tables). "after + document mask": the same with data.document_mask's per-token positions and
block-diagonal mask (4 documents per window). Same weights and tokens; the variants alternate
in every round (the machine's load changes between rounds); medians over rounds.

    .venv/bin/python benchmarks/rope_speed.py [--rounds 5] [--seq 2048] [--batch 2] [--threads N]

Shape: torchtitan's llama3 debugmodel (dim 256, 6 layers, 16 heads, ffn 768, vocab 2048),
fp32, CPU, eager, no recompute. Also checks that before and after give the same loss.
"""
from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

import torch  # noqa: E402

from conf.spec import ModelSpec  # noqa: E402
from parallel.document_masking import document_ids_and_positions  # noqa: E402
from training.model_builder import build_model  # noqa: E402
from training.models.llama.model import Attention, apply_rope, rope_rows  # noqa: E402

EOS = 1


def debug_model_spec(seq: int) -> ModelSpec:
    return ModelSpec(name="tt_debug", n_layers=6, dim=256, n_heads=16, n_kv_heads=16,
                     ffn_dim=768, vocab_size=2048, max_seq_len=seq, rope_theta=10000.0,
                     tie_embeddings=False, norm_eps=1e-5, init_std=0.02)


def _hf_rotate_half(x: torch.Tensor) -> torch.Tensor:
    first, second = x.chunk(2, dim=-1)
    return torch.cat((-second, first), dim=-1)


class BeforeAttention(Attention):
    """The attention forward as it was before issue 14 (plain causal only)."""

    def forward(self, x, *, cos, sin, mask=None):
        batch, seq, _ = x.shape
        q = self.wq(x).view(batch, seq, -1, self.head_dim).transpose(1, 2)
        k = self.wk(x).view(batch, seq, -1, self.head_dim).transpose(1, 2)
        v = self.wv(x).view(batch, seq, -1, self.head_dim).transpose(1, 2)
        cos, sin = cos[:seq], sin[:seq]
        q = q * cos + _hf_rotate_half(q) * sin
        k = k * cos + _hf_rotate_half(k) * sin
        return self.wo(self.core_attention(q, k, v).transpose(1, 2).reshape(batch, seq, -1))


def _use(model, *, before: bool) -> None:
    """Swap every attention's class; "before" also takes the unsigned sin table."""
    for block in model.layers.values():
        block.attention.__class__ = BeforeAttention if before else Attention
    model.rope_tables = ((lambda positions=None: (model.rope_cos, model.rope_sin)) if before
                         else type(model).rope_tables.__get__(model))


def _step(model, tokens, documents) -> float:
    logits = model(tokens[:, :-1], **documents)
    loss = torch.nn.functional.cross_entropy(logits.flatten(0, 1), tokens[:, 1:].flatten())
    loss.backward()
    model.zero_grad(set_to_none=True)
    return float(loss.detach())


def rope_alone(model, *, batch: int, seq: int, rounds: int) -> dict[str, list[float]]:
    """Forward+backward of RoPE alone on one layer's queries [batch, seq, heads, head_dim]
    (from a linear layer's output, as in the model), before vs after, alternating."""
    spec = model.spec
    x = torch.randn(batch, seq, spec.n_heads * spec.head_dim, requires_grad=True)
    grad = torch.randn(batch, spec.n_heads, seq, spec.head_dim)
    cos_old, sin_old = model.rope_cos[:seq], model.rope_sin[:seq]
    cos, sin = (rope_rows(t, seq=seq) for t in (model.rope_cos, model.rope_sin_signed))

    def before():
        q = x.view(batch, seq, -1, spec.head_dim).transpose(1, 2)
        return q * cos_old + _hf_rotate_half(q) * sin_old

    def after():
        return apply_rope(x.view(batch, seq, -1, spec.head_dim), cos=cos, sin=sin).transpose(1, 2)

    torch.testing.assert_close(before(), after())
    times = {"before": [], "after": []}
    for _ in range(rounds):
        for name, fn in (("before", before), ("after", after)):
            start = time.perf_counter()
            for _ in range(5):
                fn().backward(grad)
            times[name].append((time.perf_counter() - start) / 5)
    return times


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--steps", type=int, default=2, help="timed steps per variant per round")
    parser.add_argument("--seq", type=int, default=2048)
    parser.add_argument("--batch", type=int, default=2)
    parser.add_argument("--threads", type=int, default=0, help="torch threads (0: torch's)")
    args = parser.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    model = build_model(debug_model_spec(args.seq + 1), device=torch.device("cpu"), seed=0)
    gen = torch.Generator().manual_seed(0)
    tokens = torch.randint(2, 2048, (args.batch, args.seq + 1), generator=gen)
    tokens[:, torch.arange(1, 5) * (args.seq // 4) - 1] = EOS  # 4 documents per window
    ids, positions = document_ids_and_positions(tokens[:, :-1], eos_id=EOS)
    variants = {"before": (True, {}), "after": (False, {}),
                "after + document mask": (False, {"doc_ids": ids, "doc_positions": positions})}
    times = {name: [] for name in variants}
    losses = {}
    for _ in range(args.rounds):
        for name, (before, documents) in variants.items():
            _use(model, before=before)
            losses[name] = _step(model, tokens, documents)  # warm-up
            start = time.perf_counter()
            for _ in range(args.steps):
                _step(model, tokens, documents)
            times[name].append((time.perf_counter() - start) / args.steps)
    print(f"debug-model shape, batch {args.batch} x seq {args.seq}, fp32, "
          f"{torch.get_num_threads()} threads, {args.rounds} rounds x {args.steps} steps")
    base = statistics.median(times["before"])
    for name, values in times.items():
        median = statistics.median(values)
        print(f"  {name:24s} median {median * 1e3:8.1f} ms/step  ({base / median:.3f}x before)"
              f"  loss {losses[name]:.6f}  rounds {[round(v * 1e3) for v in values]}")
    assert abs(losses["before"] - losses["after"]) < 1e-5, losses
    alone = rope_alone(model, batch=args.batch, seq=args.seq, rounds=4 * args.rounds)
    print("  RoPE alone (one layer's q, forward+backward), median / min over rounds:")
    for name, values in alone.items():
        print(f"    {name:8s} median {statistics.median(values) * 1e3:7.2f} ms  "
              f"min {min(values) * 1e3:7.2f} ms")


if __name__ == "__main__":
    main()
