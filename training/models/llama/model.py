"""A Llama-style decoder built from a `ModelSpec`.

RMSNorm, RoPE in the Hugging Face "rotate_half" layout (exported q/k weights need no permutation),
grouped-query attention through `scaled_dot_product_attention`, a SwiGLU feed-forward block, and
tied or untied embeddings. Blocks live in `model.layers`, an `nn.ModuleDict` keyed "0", "1", ...
(the same state-dict keys a ModuleList gives), so a pipeline stage can drop the blocks it does
not own without renumbering the rest. A stage also drops `tok_embeddings` (not first) or
`norm`/`output` (not last); `forward` then takes or returns hidden states. The attention core and
the SwiGLU product are methods of their own so recompute policies can target them by name, and
context parallelism sets `rope_positions`, `document_mask` and `Attention.context` per rank.
Document masking (`data.document_mask`, parallel/document_masking.py): `forward(tokens, doc_ids=...,
doc_positions=...)` builds one block-diagonal causal mask per forward for every block and
gives RoPE each token's position inside its document.

State-dict keys: the family's table (training/models/llama/__init__.py, shapes.py; hf.py maps
them to Hugging Face names). Built through training/model_builder.py `build_model`.
"""
from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn

from conf.spec import Llama3RopeScaling, ModelSpec
from parallel.document_masking import local_document_mask, masked_attention
from training.loss import OutputHead, TiedHead


class RMSNorm(nn.Module):
    """Root-mean-square norm with a learned scale, computed in fp32 like Hugging Face's."""

    def __init__(self, dim: int, *, eps: float):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.empty(dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x_fp32 = x.float()
        normed = x_fp32 * torch.rsqrt(x_fp32.pow(2).mean(-1, keepdim=True) + self.eps)
        return self.weight * normed.to(x.dtype)



def rope_tables(*, head_dim: int, max_seq_len: int, theta: float,
                scaling: Llama3RopeScaling | None = None,
                device: torch.device | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """cos and sin tables [max_seq_len, head_dim] in the Hugging Face (half-split) layout;
    `scaling` (ModelSpec.llama3_rope) rescales the frequencies as Llama 3.1/3.2 do."""
    exponents = torch.arange(0, head_dim, 2, dtype=torch.int64, device=device).float() / head_dim
    inv_freq = 1.0 / (theta ** exponents)
    if scaling is not None:
        inv_freq = llama3_inv_freq(inv_freq, scaling)
    positions = torch.arange(max_seq_len, dtype=torch.int64, device=device).float()
    angles = torch.outer(positions, inv_freq)
    angles = torch.cat((angles, angles), dim=-1)
    return angles.cos(), angles.sin()


def llama3_inv_freq(inv_freq: torch.Tensor, scaling: Llama3RopeScaling) -> torch.Tensor:
    """Llama 3.1's frequency scaling: wavelengths longer than original_max / low_freq_factor
    are slowed by `factor`, those shorter than original_max / high_freq_factor are kept, and
    the ones between blend the two linearly in original_max / wavelength."""
    wavelen = 2 * math.pi / inv_freq
    context = scaling.original_max_seq_len
    blend = ((context / wavelen - scaling.low_freq_factor)
             / (scaling.high_freq_factor - scaling.low_freq_factor)).clamp(0.0, 1.0)
    return (1 - blend) * inv_freq / scaling.factor + blend * inv_freq


def rotate_half(x: torch.Tensor) -> torch.Tensor:
    """The two halves of the last dim swapped, (x1, x2) -> (x2, x1): Hugging Face's
    rotate_half without its negation, which `signed_sin` folds into the sin table."""
    first, second = x.chunk(2, dim=-1)
    return torch.cat((second, first), dim=-1)


def signed_sin(sin: torch.Tensor) -> torch.Tensor:
    """sin table [..., head_dim] with its first half negated: (-sin1, sin2), so that
    rotate_half(x) * signed_sin(sin) equals Hugging Face's (-x2, x1) * sin."""
    half = sin.shape[-1] // 2
    return torch.cat((-sin[..., :half], sin[..., half:]), dim=-1)


def apply_rope(x: torch.Tensor, *, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rotate x [B, T, heads, head_dim] by position in the Hugging Face half-split layout
    (x1 cos - x2 sin, x2 cos + x1 sin); cos and `signed_sin` tables broadcast against x as
    [T, 1, head_dim] or [B, T, 1, head_dim]. One multiply, one swap and one fused
    multiply-add, on x before the heads are transposed (contiguous)."""
    return torch.addcmul(x * cos, rotate_half(x), sin)


class Attention(nn.Module):
    """Causal grouped-query self-attention (n_kv_heads may be fewer than n_heads)."""

    def __init__(self, model: ModelSpec):
        super().__init__()
        self.n_heads = model.n_heads
        self.n_kv_heads = model.n_kv_heads
        self.head_dim = model.head_dim
        bias = model.attention_bias  # Qwen2: q, k and v have biases, o has none
        self.wq = nn.Linear(model.dim, model.n_heads * model.head_dim, bias=bias)
        self.wk = nn.Linear(model.dim, model.n_kv_heads * model.head_dim, bias=bias)
        self.wv = nn.Linear(model.dim, model.n_kv_heads * model.head_dim, bias=bias)
        self.wo = nn.Linear(model.n_heads * model.head_dim, model.dim, bias=False)
        # Qwen3: an RMSNorm over each query and key head, before RoPE
        self.q_norm = RMSNorm(self.head_dim, eps=model.norm_eps) if model.qk_norm else None
        self.k_norm = RMSNorm(self.head_dim, eps=model.norm_eps) if model.qk_norm else None
        self.context = None
        """Context parallel: a callable (q, k, v) -> out over the cp group, or None."""

    def forward(self, x: torch.Tensor, *, cos: torch.Tensor, sin: torch.Tensor,
                mask=None) -> torch.Tensor:
        """x [B, T, dim]; cos/sin from `Transformer.rope_tables`; `mask` from
        `Transformer.document_mask` (None: plain causal attention)."""
        batch, seq, _ = x.shape
        # -1 for the head count lets tensor parallelism shard heads without touching this code.
        q = self.wq(x).view(batch, seq, -1, self.head_dim)
        k = self.wk(x).view(batch, seq, -1, self.head_dim)
        v = self.wv(x).view(batch, seq, -1, self.head_dim).transpose(1, 2)
        if self.q_norm is not None:
            q, k = self.q_norm(q), self.k_norm(k)
        cos, sin = rope_rows(cos, seq=seq), rope_rows(sin, seq=seq)
        q = apply_rope(q, cos=cos.to(q.dtype), sin=sin.to(q.dtype)).transpose(1, 2)
        k = apply_rope(k, cos=cos.to(k.dtype), sin=sin.to(k.dtype)).transpose(1, 2)
        out = self.core_attention(q, k, v, mask=mask)
        return self.wo(out.transpose(1, 2).reshape(batch, seq, -1))

    def core_attention(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, *,
                       mask=None) -> torch.Tensor:
        """softmax(q k^T / sqrt(d) + causal mask) v on [B, heads, T, head_dim]; with a
        document `mask`, causal within each document only."""
        if self.context is not None:
            return self.context(q, k, v, mask=mask)
        if mask is not None:
            return masked_attention(q, k, v, mask=mask)
        return F.scaled_dot_product_attention(q, k, v, is_causal=True,
                                              enable_gqa=q.shape[1] != k.shape[1])


def rope_rows(table: torch.Tensor, *, seq: int) -> torch.Tensor:
    """A RoPE table as `apply_rope` takes it for a sequence of `seq` tokens: rows [N, head_dim]
    (N >= seq; positions 0.. or this cp rank's) -> [seq, 1, head_dim]; per-token rows
    [B, seq, head_dim] (document positions) -> [B, seq, 1, head_dim].

    Sliced here, where the sequence is whole again under sequence parallel."""
    if table.dim() == 2:
        assert seq <= table.shape[0], f"sequence {seq} > the {table.shape[0]} RoPE positions"
        table = table[:seq]
    else:
        assert table.shape[1] == seq, f"{table.shape[1]} RoPE positions for sequence {seq}"
    return table.unsqueeze(-2)



class FeedForward(nn.Module):
    """SwiGLU: w2(silu(w1 x) * w3 x); w1 = gate, w3 = up, w2 = down."""

    def __init__(self, model: ModelSpec):
        super().__init__()
        self.w1 = nn.Linear(model.dim, model.ffn_dim, bias=False)
        self.w3 = nn.Linear(model.dim, model.ffn_dim, bias=False)
        self.w2 = nn.Linear(model.ffn_dim, model.dim, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.w2(self.swiglu(self.w1(x), self.w3(x)))

    def swiglu(self, gate: torch.Tensor, up: torch.Tensor) -> torch.Tensor:
        return F.silu(gate) * up



class TransformerBlock(nn.Module):
    """Pre-norm block: x + attention(norm(x)), then + feed_forward(norm(.))."""

    def __init__(self, model: ModelSpec):
        super().__init__()
        self.attention_norm = RMSNorm(model.dim, eps=model.norm_eps)
        self.attention = Attention(model)
        self.ffn_norm = RMSNorm(model.dim, eps=model.norm_eps)
        self.feed_forward = FeedForward(model)

    def forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor,
                mask=None) -> torch.Tensor:
        h = x + self.attention(self.attention_norm(x), cos=cos, sin=sin, mask=mask)
        return h + self.feed_forward(self.ffn_norm(h))


class Transformer(nn.Module):
    """Decoder-only language model: tokens [B, T] -> logits [B, T, vocab]."""

    def __init__(self, model: ModelSpec):
        super().__init__()
        self.spec = model
        self.tok_embeddings = nn.Embedding(model.vocab_size, model.dim)
        self.layers = nn.ModuleDict({str(i): TransformerBlock(model) for i in range(model.n_layers)})
        self.norm = RMSNorm(model.dim, eps=model.norm_eps)
        # Tied: the head has no weight of its own (logits reuse tok_embeddings.weight), so
        # there is one key per parameter.
        self.output = TiedHead() if model.tie_embeddings else OutputHead(model.dim,
                                                                          model.vocab_size)
        cos, sin = rope_tables(head_dim=model.head_dim, max_seq_len=model.max_seq_len,
                               theta=model.rope_theta, scaling=model.llama3_rope)
        self.register_buffer("rope_cos", cos, persistent=False)
        self.register_buffer("rope_sin", sin, persistent=False)
        self.register_buffer("rope_sin_signed", signed_sin(sin), persistent=False)
        self.rope_positions: torch.Tensor | None = None
        """Global positions of this rank's tokens (context parallel); None = 0..T-1."""

    document_mask = staticmethod(local_document_mask)
    """doc_ids [B, T] of this rank's tokens -> the attention mask every block uses (one
    sequence here; context parallelism sets one over its cp group's whole sequence)."""

    def forward(self, tokens: torch.Tensor, *, doc_ids: torch.Tensor | None = None,
                doc_positions: torch.Tensor | None = None, targets: torch.Tensor | None = None,
                loss_chunks: int = 1) -> torch.Tensor:
        """tokens [B, T] -> logits [B, T, vocab]; a pipeline stage may take or give hidden
        states [B, T, dim] instead (no tok_embeddings / no norm; the last stage of a tied
        model keeps tok_embeddings for the head's weight and takes hidden states). With
        `targets` [B, T]: the sum of their cross entropies instead, the head run `loss_chunks`
        row blocks at a time (training/loss.py `chunked_head_loss_sum`; never the whole
        logits at once).

        Document masking (parallel/document_masking.py): `doc_ids` [B, T] and `doc_positions` [B, T]
        of these tokens (this cp rank's share) keep attention inside each document and give
        RoPE each token's position inside its document. None: one causal sequence."""
        cos, sin = self.rope_tables(doc_positions)
        mask = None if doc_ids is None else self.document_mask(doc_ids)
        # Token ids are integers; a later pipeline stage's input is float hidden states.
        h = tokens if tokens.is_floating_point() else self.tok_embeddings(tokens)
        for block in self.layers.values():
            h = block(h, cos, sin, mask=mask)
        if self.norm is None:
            return h
        h = self.norm(h)
        if self.spec.tie_embeddings:
            return self.output(h, self.tok_embeddings.weight, targets=targets,
                               loss_chunks=loss_chunks)
        return self.output(h, targets=targets, loss_chunks=loss_chunks)

    def rope_tables(self, positions: torch.Tensor | None = None
                    ) -> tuple[torch.Tensor, torch.Tensor]:
        """cos and `signed_sin` rows for `positions` (any shape, e.g. [B, T] positions inside
        documents), else for this context-parallel rank's positions, else for 0, 1, ...
        (each attention then takes the first T rows, T its whole sequence length)."""
        if positions is None:
            positions = self.rope_positions
        if positions is None:
            return self.rope_cos, self.rope_sin_signed
        return self.rope_cos[positions], self.rope_sin_signed[positions]

    @torch.no_grad()
    def reset_rope_tables(self) -> None:
        """Re-compute the RoPE tables (non-persistent buffers) after materialising."""
        spec = self.spec
        cos, sin = rope_tables(head_dim=spec.head_dim, max_seq_len=spec.max_seq_len,
                               theta=spec.rope_theta, scaling=spec.llama3_rope,
                               device=self.rope_cos.device)
        self.rope_cos.copy_(cos)
        self.rope_sin.copy_(sin)
        self.rope_sin_signed.copy_(signed_sin(sin))
