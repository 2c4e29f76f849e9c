"""Context parallelism (cp): each rank of a cp group holds a slice of the sequence.

Sharding: `shard_positions` picks the global token positions a rank holds (contiguous, or
load-balanced for causal attention) and `shard_sequence` selects them from a tensor.

Attention: `context_parallel_attention` all-gathers K and V (and their global positions)
over the cp group. Without document masking, on CUDA, the keys are put in global order and
each contiguous run of this rank's queries (one run contiguous, two load-balanced but on the
middle rank) attends the keys up to its last position under torch's `causal_lower_right`
bias, which dispatches to the flash (or memory-efficient) kernel: no mask in memory, the
masked half skipped. On CPU (no kernel there skips masked scores at these lengths) one SDPA
call takes every local query with a boolean causal mask built from global positions; the same
by-runs path can be asked for (`by_runs=True`) and is tested against it. With document
masking, SDPA runs on the local queries with the mask of `context_document_mask` (causal by
global position AND same document, the document ids all-gathered the same way). It is exact,
not a ring: each rank holds K/V for the whole sequence (memory O(T) per rank). torch's
`torch.distributed.tensor.experimental.context_parallel` (ring attention) only handles the
CUDA SDPA kernels on torch 2.13 and fails on CPU, so this all-gather form is used on every
device for now.

`all_gather_sequence` is a small autograd Function rather than
`torch.distributed.nn.functional.all_gather`, which gives wrong gradients on gloo when the
incoming gradient is non-contiguous (SDPA's dK/dV are).
"""
from __future__ import annotations

import functools

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch.nn.attention.bias import causal_lower_right

from parallel.document_masking import document_mask, masked_attention
from training.models import family_of
from training.models.family import BLOCKS


def shard_positions(*, seq_len: int, cp: int, cp_rank: int, balanced: bool) -> list[int]:
    """Global token positions held by `cp_rank` of `cp` ranks, in local order.

    Unbalanced: the contiguous chunk `[r*T/cp, (r+1)*T/cp)`. Balanced: the sequence is cut
    into 2*cp equal chunks and rank r holds chunk r then chunk 2*cp-1-r, so every rank gets
    the same amount of causal attention work (as in torchtitan / Megatron-LM).
    """
    assert cp >= 1 and 0 <= cp_rank < cp, f"cp_rank {cp_rank} out of range for cp={cp}"
    if not balanced:
        assert seq_len % cp == 0, f"seq_len {seq_len} not divisible by cp={cp}"
        chunk = seq_len // cp
        return list(range(cp_rank * chunk, (cp_rank + 1) * chunk))
    assert seq_len % (2 * cp) == 0, f"seq_len {seq_len} not divisible by 2*cp={2 * cp}"
    chunk = seq_len // (2 * cp)
    mirror = 2 * cp - 1 - cp_rank
    return (list(range(cp_rank * chunk, (cp_rank + 1) * chunk))
            + list(range(mirror * chunk, (mirror + 1) * chunk)))


def shard_sequence(tensor: torch.Tensor, *, positions: torch.Tensor | list[int],
                   dim: int = 1) -> torch.Tensor:
    """Select `positions` along `dim` (a new contiguous tensor; differentiable)."""
    index = torch.as_tensor(positions, dtype=torch.long, device=tensor.device)
    return tensor.index_select(dim, index).contiguous()


def _group_rank_and_size(group) -> tuple[int, int]:
    """This process's rank inside `group` (None: the default group) and the group's size."""
    return dist.get_rank(group), dist.get_world_size(group)


def _gather_cat(x: torch.Tensor, *, dim: int, group) -> torch.Tensor:
    """All-gather same-shaped `x` from every rank of `group`, concatenated along `dim`."""
    _, size = _group_rank_and_size(group)
    x = x.contiguous()
    parts = [torch.empty_like(x) for _ in range(size)]
    dist.all_gather(parts, x, group=group)
    return torch.cat(parts, dim=dim)


class _AllGatherSeq(torch.autograd.Function):
    """Forward: all-gather along `dim` in rank order. Backward: reduce-scatter (sum) of the
    incoming gradient, returning this rank's slice; done on contiguous tensors."""

    @staticmethod
    def forward(ctx, x: torch.Tensor, dim: int, group) -> torch.Tensor:
        ctx.dim, ctx.group = dim, group
        return _gather_cat(x, dim=dim, group=group)

    @staticmethod
    def backward(ctx, grad: torch.Tensor):
        rank, size = _group_rank_and_size(ctx.group)
        chunks = [c.contiguous() for c in grad.contiguous().chunk(size, dim=ctx.dim)]
        out = torch.empty_like(chunks[rank])
        dist.reduce_scatter(out, chunks, op=dist.ReduceOp.SUM, group=ctx.group)
        return out, None, None


def all_gather_sequence(x: torch.Tensor, *, dim: int, group) -> torch.Tensor:
    """Differentiable all-gather of `x` along `dim` over `group` (None: default group).

    Every rank must pass the same shape. The gradient of the local `x` is the sum over ranks
    of their gradients for this rank's slice of the gathered tensor.
    """
    return _AllGatherSeq.apply(x, dim % x.dim(), group)


def position_runs(positions: list[int]) -> tuple[tuple[int, int, int], ...]:
    """This rank's contiguous runs of global positions, as (local start, local end, global
    start): one run for contiguous sharding, two for load-balanced."""
    runs, start = [], 0
    for i in range(1, len(positions) + 1):
        if i == len(positions) or positions[i] != positions[i - 1] + 1:
            runs.append((start, i, positions[start]))
            start = i
    return tuple(runs)


def causal_mask(q_positions: torch.Tensor, k_positions: torch.Tensor) -> torch.Tensor:
    """Boolean [Tq, Tk] mask, True where query may attend key (key position <= query's)."""
    return q_positions[:, None] >= k_positions[None, :]


def causal_run_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    """Queries [B, H, c, D] at the last c of the key positions [B, Hkv, L, D] (L >= c), each
    meeting the keys up to its own position: causal attention aligned lower-right."""
    c, keys = q.shape[2], k.shape[2]
    gqa = q.shape[1] != k.shape[1]
    if q.is_cuda:
        return F.scaled_dot_product_attention(q, k, v, attn_mask=causal_lower_right(c, keys),
                                              enable_gqa=gqa)
    mask = torch.ones(c, keys, dtype=torch.bool, device=q.device).tril(diagonal=keys - c)
    return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, enable_gqa=gqa)


def attention_by_runs(q: torch.Tensor, k_all: torch.Tensor, v_all: torch.Tensor, *,
                      k_positions: torch.Tensor, runs: tuple[tuple[int, int, int], ...]
                      ) -> torch.Tensor:
    """Keys put in global order; each run of queries meets the keys up to its end. The runs'
    outputs are joined in SDPA's own memory order ([B, T, H, D] underneath), so the block's
    output projection reshapes them without another copy."""
    order = torch.argsort(k_positions)
    k_seq, v_seq = k_all.index_select(2, order), v_all.index_select(2, order)
    outs = [causal_run_attention(q[:, :, a:b], k_seq[:, :, :first + b - a],
                                 v_seq[:, :, :first + b - a]) for a, b, first in runs]
    if len(outs) == 1:
        return outs[0]
    return torch.cat([out.transpose(1, 2) for out in outs], dim=1).transpose(1, 2)


def context_parallel_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, *,
                               q_positions: torch.Tensor, group, mask=None,
                               runs: tuple[tuple[int, int, int], ...] | None = None,
                               by_runs: bool | None = None) -> torch.Tensor:
    """Exact causal attention for a sequence sharded over the cp `group`.

    q: [B, Hq, Tl, D]; k, v: [B, Hkv, Tl, D] (Hkv may divide Hq: grouped-query attention),
    all local; `q_positions`: LongTensor [Tl] of this rank's global positions (its k/v hold
    the same positions); `runs`: `position_runs` of them (computed when not given). K, V and
    positions are all-gathered over `group`. `by_runs` (default: on CUDA): `attention_by_runs`;
    else one SDPA call with the causal mask of the global positions. With document masking,
    `mask` (from `context_document_mask`) is used over the gathered keys instead. Returns
    [B, Hq, Tl, D].

    Not ring attention: K/V for the whole sequence are materialised on every rank (O(T)
    memory). torch 2.13's experimental `context_parallel` only handles CUDA SDPA kernels, so
    this exact all-gather form is used on every device for now.
    """
    q_positions = q_positions.to(device=q.device, dtype=torch.long)
    assert q_positions.shape == (q.shape[2],), "q_positions must be [Tl] matching q"
    assert k.shape[2] == q.shape[2] and v.shape[2] == q.shape[2], "q, k, v must share Tl"
    k_all = all_gather_sequence(k, dim=2, group=group)
    v_all = all_gather_sequence(v, dim=2, group=group)
    if mask is not None:
        return masked_attention(q, k_all, v_all, mask=mask)
    k_positions = _gather_cat(q_positions, dim=0, group=group)
    if q.is_cuda if by_runs is None else by_runs:
        runs = runs if runs is not None else position_runs(q_positions.tolist())
        return attention_by_runs(q, k_all, v_all, k_positions=k_positions, runs=runs)
    return F.scaled_dot_product_attention(q, k_all, v_all,
                                          attn_mask=causal_mask(q_positions, k_positions),
                                          enable_gqa=q.shape[1] != k.shape[1])


def context_document_mask(doc_ids: torch.Tensor, *, group, positions: torch.Tensor):
    """Document mask (parallel/document_masking.py) of this rank's queries, document ids `doc_ids`
    [B, Tl] at global `positions` [Tl], over the keys all-gathered in rank order as
    `context_parallel_attention` gathers K/V: causal by global position AND same document."""
    positions = positions.to(device=doc_ids.device, dtype=torch.long)
    k_ids = _gather_cat(doc_ids, dim=1, group=group)
    k_positions = _gather_cat(positions, dim=0, group=group)
    return document_mask(doc_ids, k_ids, q_positions=positions, k_positions=k_positions)


class ContextParallelAttention:
    """The attention core of one rank's sequence shard: exact causal attention over the
    whole sequence of its cp group. Set as `Attention.context` by `apply_context_parallel`."""

    def __init__(self, *, group, positions: torch.Tensor):
        self.group = group
        self.positions = positions
        self.runs = position_runs(positions.tolist())

    # Its gloo/NCCL collectives (dist.all_gather in an autograd Function) are not traceable:
    # with training.compile the rest of each block compiles and this call runs eagerly.
    @torch.compiler.disable
    def __call__(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, *,
                 mask=None) -> torch.Tensor:
        return context_parallel_attention(q, k, v, q_positions=self.positions, group=self.group,
                                          mask=mask, runs=self.runs)


def apply_context_parallel(model: torch.nn.Module, *, group, positions: torch.Tensor) -> None:
    """Make `model` (or a pipeline stage) run on the tokens at `positions` of each sequence:
    RoPE by global position, attention over the cp group's whole sequence (and, with
    document masking, each block's mask built once over it by `context_document_mask`);
    a module with a `sequence_group` (an MoE router) sums its statistics over the group."""
    model.rope_positions = positions
    model.document_mask = functools.partial(context_document_mask, group=group,
                                            positions=positions)
    attention = family_of(model.spec).attention
    for block in getattr(model, BLOCKS).values():
        block.get_submodule(attention).context = ContextParallelAttention(group=group,
                                                                         positions=positions)
    for module in model.modules():
        if hasattr(module, "sequence_group"):  # MoE routers: statistics of whole sequences
            module.sequence_group = group
