"""One mixture-of-experts feed-forward (`layers.{i}.moe`): router, grouped experts, shared
experts, the router losses and the routing statistics.

Forward: route (scores of every expert, the top-k per token, under a capacity the copies
that fit) -> sort the token copies by expert (all N*k of them; under a capacity the dropped
ones last, masked to zero) -> `experts(x_sorted, counts)` -> unsort -> the k outputs weighted
by their scores and summed -> + the shared experts. No shape depends on the routing, so no
step reads the device from the host (tests/unit/test_moe_host_sync.py). The balancing
loss and z-loss of the last forward stay on the module (`router_losses`) for the model to
add to the training loss (under context parallel over the whole sequences:
`sequence_group`); the loads since the last read accumulate in buffers (no host sync,
training forwards only; a block re-run by activation recompute counts twice, except on a
pipeline stage, which counts only its real forwards: `counts_loads`) for the metrics and
the sigmoid router's bias update.

Under tensor parallelism with sequence parallel the layer takes one tp rank's share of each
sequence (`shard_tokens`): it routes those tokens only, and its router losses and statistics
come from sums over the tp ranks (one all-reduce per forward), so that the losses summed
over the ranks and the statistics on each equal one process's over the whole sequence.
"""
from __future__ import annotations

from typing import NamedTuple

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
        self.sequence_group = None
        """The ranks holding the other tokens of the same sequences (context parallel sets
        it): the router statistics the losses are made of are summed over them."""
        self.counts_loads = True
        """False: forwards are not counted (a pipeline stage's outside its real forwards)."""
        self.token_group = None
        """The ranks holding the other shares of each sequence (`shard_tokens`), or None."""

    def shard_tokens(self, group) -> None:
        """From now on each forward sees this rank's share of every sequence, the other
        shares on the ranks of `group` (sequence parallel, parallel/tensor_parallel.py)."""
        self.token_group = group

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
        load = tokens_per_expert(chosen, num_experts=self.num_experts)
        order, counts = sort_by_expert(chosen, load=load,
                                       capacity=self.capacity(tokens.shape[0]))
        routed = tokens[order // self.top_k]
        if self.moe.capacity_factor is not None:  # the dropped copies trail: masked out
            kept = (torch.arange(order.numel(), device=x.device) < counts.sum()).unsqueeze(1)
            routed = torch.where(kept, routed, 0)  # (so are their gradients)
            out_sorted = torch.where(kept, self.experts(routed, counts), 0)
        else:
            out_sorted = self.experts(routed, counts)
        copies = out_sorted.new_zeros(order.numel(), dim).index_copy(0, order, out_sorted)
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
        moe = self.moe
        terms = router_loss_terms(logits, probs, chosen, num_experts=self.num_experts,
                                  groups=batch if moe.seq_aux_loss else 1,
                                  group=self.sequence_group, share_group=self.token_group,
                                  dropped=(chosen.numel() - counts.sum()).float())
        self.router_losses = moe.aux_loss_coef * terms.balance + moe.z_loss_coef * terms.z
        if not (self.training and self.counts_loads):
            return  # evaluation, pipeline metadata forward: no loads counted
        with torch.no_grad():
            self.load_since_read += terms.load
            self.load_since_step += terms.load
            self.stats_since_read += torch.stack([terms.dropped, terms.whole_balance,
                                                  terms.whole_z, torch.ones_like(terms.z)])


def expert_capacity(factor: float, *, tokens: int, top_k: int, num_experts: int) -> int:
    """ceil(factor x tokens x top_k / num_experts): the copies one expert keeps."""
    import math

    return math.ceil(factor * tokens * top_k / num_experts)


def tokens_per_expert(chosen: torch.Tensor, *, num_experts: int) -> torch.Tensor:
    """chosen [N, k] -> the copies routed to each expert [E] (int64). A scatter-add, not
    bincount: bincount's output size depends on the data (a host sync on CUDA)."""
    flat = chosen.reshape(-1)
    return torch.zeros(num_experts, dtype=torch.int64, device=flat.device).scatter_add_(
        0, flat, torch.ones_like(flat))


def sort_by_expert(chosen: torch.Tensor, *, load: torch.Tensor, capacity: int | None
                   ) -> tuple[torch.Tensor, torch.Tensor]:
    """chosen [N, k], `load` its tokens_per_expert -> (all N*k copy indices (token * k +
    slot) ordered by expert, the kept copies first and the dropped ones after them; kept
    copies per expert [E]). Under a capacity an expert keeps its first `capacity` copies in
    token order (then slot order). Shapes never depend on the data: no host sync."""
    flat = chosen.reshape(-1)
    order = torch.argsort(flat, stable=True)
    if capacity is None:
        return order, load
    starts = torch.cumsum(load, 0) - load
    expert_sorted = flat[order]
    rank_in_expert = torch.arange(flat.numel(), device=flat.device) - starts[expert_sorted]
    dropped_last = torch.where(rank_in_expert < capacity, expert_sorted, load.numel())
    return order[torch.argsort(dropped_last, stable=True)], load.clamp(max=capacity)


class RouterTerms(NamedTuple):
    balance: torch.Tensor
    """The balancing loss (this rank's share of it under a share_group)."""
    z: torch.Tensor
    """The z-loss (likewise)."""
    whole_balance: torch.Tensor
    whole_z: torch.Tensor
    """Their values over the whole sequences (no gradient), for the metrics."""
    load: torch.Tensor
    """Copies routed to each expert [E] from this rank's tokens and its share_group's."""
    dropped: torch.Tensor
    """Copies a capacity dropped, likewise."""


def router_loss_terms(logits: torch.Tensor, probs: torch.Tensor, chosen: torch.Tensor, *,
                      num_experts: int, groups: int, group=None, share_group=None,
                      dropped: torch.Tensor | None = None) -> RouterTerms:
    """Balancing loss and z-loss of tokens in `groups` equal runs (1: the whole batch; the
    batch size: per sequence, DeepSeek-V3's sequence-wise loss). Balancing loss:
    E x sum_i f_i P_i per run, averaged over the runs (f_i: share of the run's tokens routed
    to expert i, P_i: its mean probability). z-loss: the mean over tokens of
    logsumexp(logits)^2. Both are made of sums over tokens:
    - summed over the ranks of `group` differentiably (context parallel's shares of each
      sequence), so every rank of it gets the loss of the whole sequences;
    - then over `share_group` without gradient (tensor parallel's sequence shares): the
      token counts are the whole's, the probability and z sums stay this rank's, so each rank's
      losses are its share and the ranks' add up to the whole's (their gradients are summed
      over tp: parallel/tp_replicated.py)."""
    run_probs = probs.view(groups, -1, num_experts)
    run_chosen = chosen.view(groups, -1)
    load = torch.zeros(groups, num_experts, device=probs.device).scatter_add_(
        1, run_chosen, torch.ones_like(run_chosen, dtype=torch.float32))
    local = torch.cat([load.sum(0), (dropped if dropped is not None
                                     else load.new_zeros(())).view(1)])
    sums = torch.cat([load.flatten(), run_probs.sum(1).flatten(),
                      torch.logsumexp(logits, dim=-1).pow(2).sum().view(1),
                      load.new_tensor([run_probs.shape[1]])])
    if group is not None:
        from torch.distributed.nn.functional import all_reduce

        sums = all_reduce(sums, group=group)
    whole = sums
    if share_group is not None:
        shared = torch.cat([sums.detach(), local])
        dist.all_reduce(shared, group=share_group)
        whole, local = shared[:sums.numel()], shared[sums.numel():]
    cells = groups * num_experts
    counts = whole.detach()  # token counts: no gradient
    run_tokens = counts[2 * cells + 1]
    # f_i / run_tokens, made before the product so that backward keeps it alone ([groups, E])
    load_share = counts[:cells].view(groups, -1) / run_tokens ** 2
    z_tokens = run_tokens * groups

    def losses(prob_z: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        prob_sum = prob_z[cells:2 * cells].view(groups, -1)
        balance = num_experts * (load_share * prob_sum).sum(-1).mean()
        return balance, prob_z[2 * cells] / z_tokens

    balance, z = losses(sums)
    whole_balance, whole_z = losses(whole.detach())
    return RouterTerms(balance=balance, z=z, whole_balance=whole_balance, whole_z=whole_z,
                       load=local[:num_experts].detach(), dropped=local[num_experts].detach())
