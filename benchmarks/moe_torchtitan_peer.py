"""torchtitan's Qwen3-MoE debug model, forward + backward + AdamW, timed under the peer's
Python (torch + torchtitan 0.3.0) for benchmarks/moe_vs_dense.py, which runs this file in a
subprocess and reads its last line: {"model", "params", "tokens_per_s"} as JSON.

The model is built as torchtitan's model registry builds it ("debugmodel_moe": 64 experts
top-8, 8 layers), or, with --shape (JSON: dim, n_layers, n_heads, n_kv_heads, head_dim,
vocab_size, moe_hidden_dim, num_experts, top_k), with the registry's own Qwen3-MoE layer
builder at that shape (moe_vs_dense.py passes meshrun's benchmark shape), with the
peer's CPU patches (benchmarks/model_vs_torchtitan.py: the triton-only module stubbed, SDPA
in place of flex attention). Any failure leaves the traceback on stderr and a non-zero exit;
moe_vs_dense.py prints its last line as the reason.

    <peer venv>/bin/python benchmarks/moe_torchtitan_peer.py [--threads 1] [--batch 4]
        [--seq-len 256] [--rounds 7] [--shape JSON]
"""
from __future__ import annotations

import argparse
import importlib
import json
import statistics
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from benchmarks.model_vs_torchtitan import TRITON_ONLY, triton_stub  # noqa: E402
from benchmarks.peer_paths import peer_source  # noqa: E402

FLAVOR = "debugmodel_moe"


def shaped_config(shape: dict):
    """A Qwen3-MoE config of `shape` (module docstring), built as the registry builds its
    debug flavour: the same norms, initialisations, RoPE (theta 1e6) and flex attention."""
    from torchtitan.models import qwen3

    d, vocab, head_dim = shape["dim"], shape["vocab_size"], shape["head_dim"]
    layers = qwen3._build_qwen3_moe_layers(
        fuse_qkv=True, n_layers=shape["n_layers"], dim=d, n_heads=shape["n_heads"],
        n_kv_heads=shape["n_kv_heads"], head_dim=head_dim,
        moe_hidden_dim=shape["moe_hidden_dim"], num_experts=shape["num_experts"],
        top_k=shape["top_k"], attn_backend="flex", moe_comm_backend="standard",
        rope=qwen3.CosSinRoPE.Config(dim=head_dim, max_seq_len=4096, theta=1000000.0))
    return qwen3.Qwen3Model.Config(
        vocab_size=vocab, dim=d, norm=qwen3._qwen3_norm(d),
        tok_embeddings=qwen3.Embedding.Config(num_embeddings=vocab, embedding_dim=d,
                                              param_init=qwen3._EMBEDDING_INIT),
        lm_head=qwen3.Linear.Config(in_features=d, out_features=vocab,
                                    param_init=qwen3._LINEAR_INIT),
        layers=layers)


def build(seq: int, batch: int, shape: dict | None = None):
    import os

    import torch

    sys.modules.setdefault(TRITON_ONLY, triton_stub())
    os.environ["TT_CPU_ATTN"] = "causal"
    sys.path.insert(0, str(peer_source()))
    importlib.import_module("tt_cpu_extra")  # patches FlexAttention for CPU
    from torchtitan.models.qwen3 import model_registry

    config = shaped_config(shape) if shape else model_registry(FLAVOR).model
    model = config.build()
    if hasattr(model, "init_weights"):
        model.init_weights()
    kwargs = {}
    if hasattr(model, "get_attention_masks"):
        kwargs["attention_masks"] = model.get_attention_masks(
            torch.arange(seq).expand(batch, seq))
    return model, kwargs


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--batch", type=int, default=4)
    p.add_argument("--seq-len", type=int, default=256)
    p.add_argument("--rounds", type=int, default=7)
    p.add_argument("--shape", type=json.loads, default=None,
                   help="JSON: the model's shape (module docstring); default: " + FLAVOR)
    a = p.parse_args()
    import torch
    import torch.nn.functional as F

    torch.set_num_threads(a.threads)
    model, kwargs = build(a.seq_len, a.batch, a.shape)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4)
    vocab = model.tok_embeddings.weight.shape[0]
    tokens = torch.randint(0, vocab, (a.batch, a.seq_len + 1),
                           generator=torch.Generator().manual_seed(0))
    times = []
    for r in range(a.rounds):
        start = time.perf_counter()
        optimizer.zero_grad(set_to_none=True)
        logits = model(tokens[:, :-1], **kwargs)
        F.cross_entropy(logits.flatten(0, 1).float(), tokens[:, 1:].flatten()).backward()
        optimizer.step()
        if r:
            times.append(time.perf_counter() - start)
    name = "meshrun's shape" if a.shape else FLAVOR
    print(json.dumps({"model": f"torchtitan qwen3 {name}",
                      "params": sum(t.numel() for t in model.parameters()),
                      "tokens_per_s": a.batch * a.seq_len / statistics.median(times)}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
