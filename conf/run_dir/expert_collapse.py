"""A mixture-of-experts run whose routing has collapsed, read from metrics.jsonl for
`meshrun status`: in some MoE block one expert took most tokens (moe_l{i}_max_expert_share,
training/routing_metrics.py) in each of the last logged steps. Torch-free."""
from __future__ import annotations

import re

COLLAPSE_SHARE = 0.9
"""A block has collapsed when its busiest expert takes this share of the tokens or more."""
COLLAPSE_ROWS = 10
"""... in each of this many consecutive logged train steps (the latest ones)."""
_SHARE_KEY = re.compile(r"moe_l(\d+)_max_expert_share")


def collapsed_blocks(rows: list[dict], *, share: float = COLLAPSE_SHARE,
                     window: int = COLLAPSE_ROWS) -> dict[int, tuple[int, int]]:
    """Block index -> (first, last step) of the window in which it stayed collapsed."""
    train = [r for r in rows if r.get("kind") == "train"
             and any(_SHARE_KEY.fullmatch(k) for k in r)][-window:]
    if len(train) < window:
        return {}
    blocks = {int(m.group(1)) for k in train[-1] if (m := _SHARE_KEY.fullmatch(k))}
    return {block: (train[0]["step"], train[-1]["step"]) for block in sorted(blocks)
            if all(r.get(f"moe_l{block}_max_expert_share", 0.0) >= share for r in train)}


def collapse_lines(rows: list[dict]) -> list[str]:
    """One line per collapsed block, with what to change."""
    return [f"expert collapse: block {block}: one expert took >= {COLLAPSE_SHARE:.0%} of the "
            f"tokens at every logged step from {first} to {last}; raise "
            f"model.moe.aux_loss_coef, or balance with model.moe.score=sigmoid"
            for block, (first, last) in collapsed_blocks(rows).items()]


def routing_summary(rows: list[dict]) -> str:
    """The latest logged routing over all MoE blocks, for the end-of-run table ('' if none)."""
    last = next((r for r in reversed(rows) if r.get("kind") == "train"
                 and "moe_load_max_mean" in r), None)
    if last is None:
        return ""
    return (f"step {last['step']}: busiest expert {last['moe_load_max_mean']:.2f}x the mean "
            f"({last['moe_max_expert_share']:.0%} of tokens), dropped "
            f"{last['moe_dropped_frac']:.1%}, balancing loss {last['moe_aux_loss']:.4f}, "
            f"z-loss {last['moe_z_loss']:.4f}")
