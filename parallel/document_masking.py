"""Document masking: several documents packed into one training window attend only within
themselves, and RoPE positions restart at each document.

Documents are separated by an end-of-sequence token (`data.document_mask`, resolved to
`DataSpec.eos_id`: the tokenizer's EOS, or the separator an SFT dir records,
conf/rules/document_rules.py). The EOS belongs to the document it ends; the token after it starts
the next one. The first tokens of a window (up to and including its first EOS) are one
document even when that document began in an earlier window.

- `document_ids_and_positions`: per-token document index and position inside the document,
  computed once per micro-batch from the whole (unsharded) input tokens.
- `own_document_targets`: next-token targets with those in another document ignored: the
  target of a document's last token (its end token) is the next document's first token,
  which nothing in the document predicts; the end token itself stays a target (of the token
  before it), so a model learns where a document ends.
- `document_mask`: the attention mask "key position <= query position AND same document",
  one formula (`_allowed`) used both as a boolean SDPA mask and, on CUDA where flex attention
  exists, as the `mask_mod` of a flex-attention `BlockMask`. Queries and keys carry their own
  ids and positions, so the same call serves one process (keys = queries) and context
  parallelism (keys = the all-gathered sequence, positions global). Memory: the BlockMask is
  built a chunk of query tiles at a time (`blockwise_block_mask`), so the dense mask never
  exists whole on that path; the SDPA mask (CPU, or no flex) is dense: B x Tq x Tk bytes
  per rank (Tq = T/cp under context parallelism, Tk = T) and ONE additive copy in the compute
  dtype kept for backward, shared by all blocks (`DenseDocumentMask`), in the memory plan.
- `masked_attention`: attention under such a mask (SDPA for a `DenseDocumentMask`, flex
  attention for a `BlockMask`).
"""
from __future__ import annotations

import functools
import importlib.util

import torch
import torch.nn.functional as F

FLEX_BLOCK = 128
"""flex attention's default tile (torch's _DEFAULT_SPARSE_BLOCK_SIZE)."""
MASK_CHUNK_ELEMENTS = 1 << 27
"""Mask entries (bytes, bool) evaluated at once when building a BlockMask: bounds the
transient at 128 MiB (plus its padded copy) whatever the sequence, not B x Tq x Tk."""


def document_ids_and_positions(tokens: torch.Tensor, *, eos_id: int
                               ) -> tuple[torch.Tensor, torch.Tensor]:
    """(document index, position inside the document), both LongTensor [B, T], of `tokens`
    [B, T]. Document 0 runs to the first EOS (inclusive); each EOS ends its document."""
    is_eos = (tokens == eos_id).long()
    ids = torch.cumsum(is_eos, dim=1) - is_eos
    index = torch.arange(tokens.shape[1], device=tokens.device).expand_as(tokens)
    starts_doc = torch.ones_like(is_eos, dtype=torch.bool)
    starts_doc[:, 1:] = is_eos[:, :-1].bool()
    doc_start = torch.cummax(torch.where(starts_doc, index, 0), dim=1).values
    return ids, index - doc_start


def own_document_targets(inputs: torch.Tensor, targets: torch.Tensor, *, eos_id: int,
                         ignore_index: int) -> torch.Tensor:
    """`targets` [B, T] (next tokens of `inputs` [B, T]) with `ignore_index` where the input
    ends its document: that target starts the next document (documents end AT the EOS)."""
    return targets.masked_fill(inputs == eos_id, ignore_index)


def _allowed(q_ids: torch.Tensor, k_ids: torch.Tensor, q_positions: torch.Tensor,
             k_positions: torch.Tensor) -> torch.Tensor:
    """Query may attend key: causal by (global) position, and the same document."""
    return (q_positions >= k_positions) & (q_ids == k_ids)


def document_mask(q_ids: torch.Tensor, k_ids: torch.Tensor, *, q_positions: torch.Tensor,
                  k_positions: torch.Tensor, flex: bool | None = None):
    """The mask of `_allowed` for queries with document ids `q_ids` [B, Tq] at sequence
    positions `q_positions` [Tq] over keys `k_ids` [B, Tk] at `k_positions` [Tk].

    A flex-attention `BlockMask` when `flex` (default: on CUDA where torch has flex
    attention), else a `DenseDocumentMask` for SDPA (exact on every device).
    """
    if flex is None:
        flex = q_ids.is_cuda and _flex_available()
    if not flex:
        return DenseDocumentMask(_dense(q_ids, k_ids, q_positions, k_positions))

    def mask_mod(b, h, q, kv):
        return _allowed(q_ids[b, q], k_ids[b, kv], q_positions[q], k_positions[kv])

    return blockwise_block_mask(mask_mod, q_ids, k_ids, q_positions, k_positions)


class DenseDocumentMask:
    """The boolean mask [B, 1, Tq, Tk] (`allowed`) and its additive form for SDPA, made once
    per dtype and shared by every block of a forward. Given the boolean mask, SDPA makes its
    own additive copy in each block and keeps it for backward: n_layers copies of
    B x Tq x Tk in the compute dtype; given this one, one copy per forward."""

    __slots__ = ("allowed", "_additive")

    def __init__(self, allowed: torch.Tensor):
        self.allowed = allowed
        self._additive: dict[torch.dtype, torch.Tensor] = {}

    def additive(self, dtype: torch.dtype) -> torch.Tensor:
        """0 where allowed, -inf elsewhere, in `dtype` (what SDPA makes of a boolean mask)."""
        if dtype not in self._additive:
            zeros = torch.zeros(self.allowed.shape, dtype=dtype, device=self.allowed.device)
            self._additive[dtype] = zeros.masked_fill_(~self.allowed, float("-inf"))
        return self._additive[dtype]


def _dense(q_ids, k_ids, q_positions, k_positions) -> torch.Tensor:
    return _allowed(q_ids[:, None, :, None], k_ids[:, None, None, :], q_positions[:, None],
                    k_positions[None, :])


def blockwise_block_mask(mask_mod, q_ids: torch.Tensor, k_ids: torch.Tensor,
                         q_positions: torch.Tensor, k_positions: torch.Tensor, *,
                         chunk_elements: int = MASK_CHUNK_ELEMENTS, block: int = FLEX_BLOCK):
    """The flex-attention `BlockMask` of `_allowed`, as torch's `create_block_mask` makes it
    (partial and full `block` x `block` tiles, kv indices ordered as it orders them), but built
    `chunk_elements` mask entries at a time: a whole number of query tiles per chunk, so the
    dense boolean mask never exists whole (eager `create_block_mask` materialises all
    B x Tq x Tk of it, 16 GiB at 128k tokens)."""
    from torch.nn.attention.flex_attention import BlockMask

    batch, tq, tk = q_ids.shape[0], q_ids.shape[1], k_ids.shape[1]
    rows = max(block, chunk_elements // max(batch * tk, 1) // block * block)
    tiles = [_tile_counts(_dense(q_ids[:, start:start + rows], k_ids,
                                 q_positions[start:start + rows], k_positions), block)
             for start in range(0, tq, rows)]
    counts = torch.cat(tiles, dim=2)
    full = counts == block * block
    partial = (counts > 0) & ~full
    return BlockMask.from_kv_blocks(*_ordered(partial), *_ordered(full), BLOCK_SIZE=block,
                                    mask_mod=mask_mod, seq_lengths=(tq, tk))


def _tile_counts(allowed: torch.Tensor, block: int) -> torch.Tensor:
    """Allowed entries per `block` x `block` tile of a [B, 1, Tq, Tk] mask (padded with
    False to whole tiles): [B, 1, Tq/block, Tk/block]."""
    pad_q, pad_k = -allowed.shape[2] % block, -allowed.shape[3] % block
    allowed = F.pad(allowed, (0, pad_k, 0, pad_q))
    b, h, tq, tk = allowed.shape
    return allowed.view(b, h, tq // block, block, tk // block, block).sum(dim=(3, 5))


def _ordered(tiles: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(tiles per query row, their kv tile indices first, in column order): flex's layout."""
    tiles = tiles.to(torch.int32)
    order = torch.argsort(tiles, dim=-1, descending=True, stable=True)
    return tiles.sum(dim=-1).to(torch.int32).contiguous(), order.to(torch.int32).contiguous()


def local_document_mask(doc_ids: torch.Tensor):
    """`document_mask` of one whole sequence (no context parallelism): positions 0..T-1."""
    positions = torch.arange(doc_ids.shape[1], device=doc_ids.device)
    return document_mask(doc_ids, doc_ids, q_positions=positions, k_positions=positions)


def masked_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, *, mask) -> torch.Tensor:
    """softmax(q k^T / sqrt(d) under `mask`) v on [B, heads, T, head_dim] (k/v heads may
    divide q heads); `mask` from `document_mask`."""
    gqa = q.shape[1] != k.shape[1]
    if isinstance(mask, DenseDocumentMask):
        return F.scaled_dot_product_attention(q, k, v, attn_mask=mask.additive(q.dtype),
                                              enable_gqa=gqa)
    return _compiled_flex_attention()(q, k, v, block_mask=mask, enable_gqa=gqa)


@functools.cache
def _flex_available() -> bool:
    return importlib.util.find_spec("torch.nn.attention.flex_attention") is not None


@functools.cache
def _compiled_flex_attention():
    """flex attention is only fast compiled (eager runs a slow reference); compile it once."""
    from torch.nn.attention.flex_attention import flex_attention

    return torch.compile(flex_attention, dynamic=False)
