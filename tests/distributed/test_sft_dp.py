"""SFT on 2 data-parallel gloo ranks x 2 micro-batches: the step's loss and gradients equal
one process's mean over the learned (assistant) tokens of all 4 bins, computed by hand from
the shards."""
from __future__ import annotations

import json
import random

import numpy as np
import pytest
import torch
import torch.distributed as dist

from tests.support.spawn import run_on_ranks

pytestmark = pytest.mark.distributed
WORDS = "alpha beta gamma delta tokens shards loss falls over the lazy dog".split()


def _prepare(tmp_path) -> str:
    from launcher.data.hf_tokenizer import train_bpe
    from launcher.data.sft_prepare import SftOptions, prepare_sft

    rnd = random.Random(5)
    (tmp_path / "c.txt").write_text(" ".join(rnd.choices(WORDS, k=2000)))
    tok = train_bpe([tmp_path / "c.txt"], vocab_size=300, out_dir=tmp_path / "tok").parent
    with open(tmp_path / "chats.jsonl", "w") as f:
        for _ in range(40):
            turns = [{"role": role, "content": " ".join(rnd.choices(WORDS, k=rnd.randint(1, 5)))}
                     for role in ("user", "assistant") * rnd.randint(1, 2)]
            f.write(json.dumps({"messages": turns}) + "\n")
    out, m, _ = prepare_sft([str(tmp_path / "chats.jsonl")], tokenizer=str(tok),
                            out_dir=str(tmp_path / "sft"),
                            options=SftOptions(seq_len=63, val_fraction=0.1))
    assert m["splits"]["train"]["bins"] >= 4
    return str(out)


def sft_dp_rank(*, rank: int, world_size: int, prepared: str) -> dict:
    from tests.support.layout_parity import full, named_params
    from tests.support.specs import cpu_spec
    from tests.support.sft_shards import hand_loss
    from conf.data_contract.prepared_corpus import read_manifest
    from pathlib import Path
    from training.data.build import build_train_batches
    from training.loss import IGNORE_INDEX
    from training.model_builder import build_model
    from training.parallel_model import build_parallel_model
    from training.step import forward_backward

    cpu = torch.device("cpu")
    spec = cpu_spec("model=tiny", "data=files", f"data.prepared={prepared}",
                    "model.vocab_size=300", "training.seq_len=63", "training.micro_batch_size=1",
                    "training.grad_accum_steps=2", "parallel=ddp", "cluster.procs_per_node=2")
    layout = build_parallel_model(spec, rank=rank, device=cpu)
    batches = build_train_batches(spec.data, spec.training, dp_rank=layout.dims.dp_rank(rank),
                                  dp_size=layout.dims.dp)
    global_bins = batches.order.window_indices(np.arange(4))
    micro = batches.next_step()
    loss = forward_backward(layout, micro, device=cpu,
                            autocast=torch.autocast("cpu", enabled=False))
    total = torch.tensor([float(loss.local_loss_sum)], dtype=torch.float64)
    dist.all_reduce(total)
    grads = {n: full(p.grad) for n, p in named_params(layout).items()}
    reference = build_model(spec.model, device=cpu, seed=spec.training.seed)
    hand = hand_loss(reference, Path(prepared), read_manifest(prepared), global_bins)
    hand.backward()
    for name, p in reference.named_parameters():
        torch.testing.assert_close(grads[name], p.grad, atol=1e-6, rtol=1e-4, msg=name)
    local = sum(int((t != IGNORE_INDEX).sum()) for _, t in micro)
    return {"loss": total.item() / loss.global_tokens, "hand": float(hand.detach()),
            "global_tokens": loss.global_tokens, "local_tokens": local}


def test_sft_loss_is_the_mean_over_learned_tokens_across_ranks(tmp_path):
    prepared = _prepare(tmp_path)
    results = run_on_ranks(sft_dp_rank, world_size=2, workdir=tmp_path,
                           kwargs={"prepared": prepared})
    assert results[0]["local_tokens"] != results[1]["local_tokens"]
    for r in results:
        assert r["global_tokens"] == sum(x["local_tokens"] for x in results)
        assert r["loss"] == pytest.approx(r["hand"], rel=1e-5)
