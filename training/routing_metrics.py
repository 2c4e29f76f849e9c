"""What the routers did since the last logged step, as metrics row fields (metrics.jsonl,
W&B `train/moe_*`, the console): per MoE block and over all of them.

Per block i: `moe_l{i}_load_max_mean` (the busiest expert's token copies / the mean's),
`moe_l{i}_max_expert_share` (the share of tokens the busiest expert took: 1 = every token),
`moe_l{i}_dropped_frac` (copies over the capacity, of all copies), `moe_l{i}_aux_loss` and
`moe_l{i}_z_loss` (unweighted, averaged over the forwards). Without the `l{i}`: the worst
block's load and share, the dropped share of all blocks, the mean of the losses. The loads
are summed over the ranks of `group` (those that saw different tokens), and gathered from
every pipeline stage (each holds its own blocks). One host read per logged step; the buffers
restart from zero.
"""
from __future__ import annotations

import torch
import torch.distributed as dist
from torch import nn

from training.router_losses import moe_layers


@torch.no_grad()
def routing_fields(parts: list[nn.Module], *, group=None, pp_group=None) -> dict[str, float]:
    """The routing metrics of the blocks these parts hold, and with `pp_group` those of every
    pipeline stage's (all ranks of `group` and `pp_group` call it)."""
    layers = moe_layers(parts)
    rows = {}
    if layers:
        indices = sorted(layers)
        loads = torch.stack([layers[i].load_since_read for i in indices])
        stats = torch.stack([layers[i].stats_since_read for i in indices])
        both = torch.cat([loads, stats], dim=1)
        if group is not None:
            dist.all_reduce(both, group=group)
        for i in indices:
            layers[i].load_since_read.zero_()
            layers[i].stats_since_read.zero_()
        top_k = layers[indices[0]].top_k
        rows = {i: (top_k, row) for i, row in zip(indices, both.cpu().double().tolist())}
    if pp_group is not None:
        stages = [None] * dist.get_world_size(pp_group)
        dist.all_gather_object(stages, rows, group=pp_group)
        rows = {i: row for stage in stages for i, row in stage.items()}
    if not rows:
        return {}
    indices = sorted(rows)
    top_k, first = rows[indices[0]]
    return block_fields(indices, [rows[i][1] for i in indices], top_k=top_k,
                        num_experts=len(first) - 4)


def block_fields(indices: list[int], rows: list[list[float]], *, top_k: int,
                 num_experts: int) -> dict[str, float]:
    """rows: per block, the loads of its experts then (dropped, aux, z, forwards) sums."""
    out: dict[str, float] = {}
    worst_load = worst_share = dropped = copies = aux = z = 0.0
    for index, row in zip(indices, rows):
        load, (drop, aux_sum, z_sum, forwards) = row[:num_experts], row[num_experts:]
        total = sum(load)
        if total == 0 or forwards == 0:
            continue
        ratio = max(load) / (total / num_experts)
        share = max(load) / (total / top_k)
        fields = {"load_max_mean": ratio, "max_expert_share": share,
                  "dropped_frac": drop / total, "aux_loss": aux_sum / forwards,
                  "z_loss": z_sum / forwards}
        out.update({f"moe_l{index}_{name}": value for name, value in fields.items()})
        worst_load, worst_share = max(worst_load, ratio), max(worst_share, share)
        dropped, copies = dropped + drop, copies + total
        aux, z = aux + fields["aux_loss"] / len(indices), z + fields["z_loss"] / len(indices)
    if copies:
        out.update(moe_load_max_mean=worst_load, moe_max_expert_share=worst_share,
                   moe_dropped_frac=dropped / copies, moe_aux_loss=aux, moe_z_loss=z)
    return out
