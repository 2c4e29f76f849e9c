"""One mixture-of-experts feed-forward (`layers.{i}.moe`): router, grouped experts, shared
experts, the router losses and the routing statistics.

Forward: route (scores of every expert, the top-k per token, under a capacity the copies
that fit) -> sort the token copies by expert -> `experts(x_sorted, counts)` -> unsort ->
the k outputs weighted by their scores and summed -> + the shared experts. The balancing
loss and z-loss of the last forward stay on the module (`router_losses`) for the model to
add to the training loss; the loads since the last read accumulate in buffers (no host
sync, training forwards only; a block re-run by activation recompute counts twice) for the
metrics and the sigmoid router's bias update.

Under tensor parallelism with sequence parallel the layer takes one tp rank's share of each
sequence (`shard_tokens`): it routes those tokens only, and its router losses and statistics
come from sums over the tp ranks (one all-reduce per forward), so that the losses summed
over the ranks and the statistics on each equal one process's over the whole sequence.
"""
from __future__ import annotations

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn

from conf.choices import RouterScore
from conf.spec import ModelSpec
from training.models.llama.model import FeedForward
from training.models.moe.model.grouped_experts import GroupedExperts


class SharedExperts(FeedForward):
    """The always-on experts: one SwiGLU of num_shared_experts x expert_ffn_dim."""

    def __init__(self, *, dim: int, ffn_dim: int):
        nn.Module.__init__(self)
        self.w1 = nn.Linear(dim, ffn_dim, bias=False)
        self.w3 = nn.Linear(dim, ffn_dim, bias=False)
        self.w2 = nn.Linear(ffn_dim, dim, bias=False)


class MoE(nn.Module):
    def __init__(self, model: ModelSpec):
        super().__init__()
        moe = model.moe
        self.moe = moe
        self.num_experts, self.top_k = moe.num_experts, moe.top_k
        self.router = nn.Linear(model.dim, moe.num_experts, bias=False)
        self.experts = GroupedExperts(num_experts=moe.num_experts, dim=model.dim,
                                      ffn_dim=model.expert_ffn_dim)
        self.shared_experts = (SharedExperts(dim=model.dim,
                                             ffn_dim=moe.num_shared_experts * model.expert_ffn_dim)
                               if moe.num_shared_experts else None)
        if moe.score is RouterScore.sigmoid:
            self.register_buffer("expert_bias", torch.zeros(moe.num_experts))
        else:
            self.expert_bias = None
        for name in ("load_since_read", "load_since_step"):
            self.register_buffer(name, torch.zeros(moe.num_experts), persistent=False)
        # dropped copies, balancing loss, z-loss, forwards: summed since the last read
        self.register_buffer("stats_since_read", torch.zeros(4), persistent=False)
        self.router_losses: torch.Tensor | None = None
        """aux_loss_coef x balancing loss + z_loss_coef x z-loss of the last forward (this
        rank's share of them under `shard_tokens`)."""
        self.token_group = None
        """The ranks holding the other shares of each sequence (`shard_tokens`), or None."""
        self.token_shards = 1

    def shard_tokens(self, group) -> None:
        """From now on each forward sees this rank's share of every sequence, the other
        shares on the ranks of `group` (sequence parallel, parallel/tensor_parallel.py)."""
        self.token_group, self.token_shards = group, dist.get_world_size(group)

    @torch.no_grad()
    def reset_stats(self) -> None:
        """Zero the statistics buffers (after materialising; they are not checkpointed)."""
        self.load_since_read.zero_()
        self.load_since_step.zero_()
        self.stats_since_read.zero_()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        batch, seq, dim = x.shape
        tokens = x.reshape(-1, dim)
        logits = self.router(tokens).float()
        probs, weights, chosen = self.route(logits)
        order, counts, kept = sort_by_expert(chosen, num_experts=self.num_experts,
                                             capacity=self.capacity(tokens.shape[0]))
        rows = order[:kept] // self.top_k
        out_sorted = self.experts(tokens[rows], counts)
        copies = out_sorted.new_zeros(tokens.shape[0] * self.top_k, dim)
        copies = copies.index_copy(0, order[:kept], out_sorted)
        out = (copies.view(-1, self.top_k, dim) * weights.unsqueeze(-1).to(copies.dtype)).sum(1)
        if self.shared_experts is not None:
            out = out + self.shared_experts(tokens)
        self._losses_and_stats(logits, probs, chosen, counts, batch=batch)
        return out.view(batch, seq, dim)

    def route(self, logits: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """logits [N, E] (fp32) -> (per-expert probabilities [N, E] for the balancing loss,
        the top-k weights [N, k], the top-k experts [N, k])."""
        moe = self.moe
        if moe.score is RouterScore.sigmoid:
            scores = torch.sigmoid(logits)
            biased = scores + self.expert_bias if moe.bias_update_rate > 0 else scores
            chosen = torch.topk(biased, self.top_k, dim=-1).indices
            weights = scores.gather(-1, chosen)
            probs = scores / scores.sum(-1, keepdim=True)
        else:
            probs = torch.softmax(logits, dim=-1)
            weights, chosen = torch.topk(probs, self.top_k, dim=-1)
        if moe.renormalize:
            weights = weights / weights.sum(-1, keepdim=True)
        return probs, weights * moe.route_scale, chosen

    def capacity(self, tokens: int) -> int | None:
        """Token copies one expert takes from this forward's `tokens`; None = dropless."""
        factor = self.moe.capacity_factor
        if factor is None:
            return None
        return expert_capacity(factor, tokens=tokens, top_k=self.top_k,
                               num_experts=self.num_experts)

    def _losses_and_stats(self, logits, probs, chosen, counts, *, batch: int) -> None:
        moe, experts = self.moe, self.num_experts
        load = torch.bincount(chosen.reshape(-1), minlength=experts).float()
        rows = batch if moe.seq_aux_loss else 1  # the balancing loss per sequence, or per batch
        row_load = (sequence_loads(chosen.view(batch, -1), num_experts=experts)
                    if moe.seq_aux_loss else load.unsqueeze(0))
        row_probs = probs.view(rows, -1, experts).sum(1)
        squared_lse = torch.logsumexp(logits, dim=-1).pow(2).sum()
        dropped = load.sum() - counts.sum()
        load, row_load, all_probs, all_lse, dropped = self._summed(
            load, row_load, row_probs.detach(), squared_lse.detach(), dropped)
        per_row = probs.shape[0] // rows * self.token_shards  # tokens of a row, all shares
        tokens = probs.shape[0] * self.token_shards
        balance = balancing_loss(row_load, row_probs, tokens_per_row=per_row,
                                 num_experts=experts)
        z = squared_lse / tokens
        self.router_losses = moe.aux_loss_coef * balance + moe.z_loss_coef * z
        if not self.training:
            return  # evaluation: no loads counted (metrics, balancing bias)
        with torch.no_grad():
            self.load_since_read += load
            self.load_since_step += load
            whole = balancing_loss(row_load, all_probs, tokens_per_row=per_row,
                                   num_experts=experts)
            self.stats_since_read += torch.stack([dropped, whole, all_lse / tokens,
                                                  torch.ones_like(whole)])

    @torch.no_grad()
    def _summed(self, *tensors: torch.Tensor) -> list[torch.Tensor]:
        """`tensors` summed over `token_group` (one all-reduce; as they are without one)."""
        if self.token_group is None:
            return list(tensors)
        flat = torch.cat([t.reshape(-1).float() for t in tensors])
        dist.all_reduce(flat, group=self.token_group)
        sizes = [t.numel() for t in tensors]
        return [part.view(t.shape) for part, t in zip(flat.split(sizes), tensors)]


def expert_capacity(factor: float, *, tokens: int, top_k: int, num_experts: int) -> int:
    """ceil(factor x tokens x top_k / num_experts): the copies one expert keeps."""
    import math

    return math.ceil(factor * tokens * top_k / num_experts)


def sort_by_expert(chosen: torch.Tensor, *, num_experts: int, capacity: int | None
                   ) -> tuple[torch.Tensor, torch.Tensor, int]:
    """chosen [N, k] -> (copy indices (token * k + slot) ordered by expert, the kept copies
    first; kept copies per expert [E]; the number kept). Under a capacity an expert keeps its
    first `capacity` copies in token order (then slot order); dropless keeps all N*k (known
    without a host sync)."""
    flat = chosen.reshape(-1)
    order = torch.argsort(flat, stable=True)
    counts = torch.bincount(flat, minlength=num_experts)
    if capacity is None:
        return order, counts, flat.numel()
    starts = torch.cumsum(counts, 0) - counts
    rank_in_expert = torch.arange(flat.numel(), device=flat.device) - starts[flat[order]]
    fits = rank_in_expert < capacity
    order = torch.cat([order[fits], order[~fits]])
    kept_counts = counts.clamp(max=capacity)
    return order, kept_counts, int(kept_counts.sum())


def sequence_loads(chosen: torch.Tensor, *, num_experts: int) -> torch.Tensor:
    """chosen [B, copies of a sequence] -> the copies each expert takes, per sequence [B, E]."""
    ones = torch.ones_like(chosen, dtype=torch.float32)
    return chosen.new_zeros(chosen.shape[0], num_experts, dtype=torch.float32).scatter_add_(
        1, chosen, ones)


def balancing_loss(row_load: torch.Tensor, row_probs: torch.Tensor, *, tokens_per_row: int,
                   num_experts: int) -> torch.Tensor:
    """E x sum_i f_i P_i averaged over the rows (each sequence, or the whole batch as one
    row): f_i the row's token copies routed to expert i over its tokens (`row_load` [R, E],
    all shares summed) and P_i the mean probability of expert i (`row_probs`
    [R, E]: the probabilities summed over this rank's tokens, or over all shares' for the
    value); `tokens_per_row` counts the row's tokens over all shares. Under `shard_tokens`
    each rank's value is its share: the ranks' values add up to one process's."""
    f = row_load / tokens_per_row
    return num_experts * (f * row_probs / tokens_per_row).sum(-1).mean()
