"""training.loss_chunks: the head and cross entropy in row blocks (training/loss.py) give the
whole path's loss and gradients, in fp32 and under bf16 autocast, tied and untied, with
ignored targets and uneven blocks; resolve() refuses the layouts it does not cover. The same
chunked loss under DDP, FSDP and cp is proven against one unchunked process in
tests/distributed/test_layout_parity.py, and its kept bytes against the plan in
tests/distributed/test_activation_memory.py (tests/support/layouts.py `*_loss_chunks`)."""
from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from conf.errors import ConfigError
from parallel.cost.activations import ActivationDtypes, ActivationSplit, head_bytes_per_token
from training.loss import IGNORE_INDEX, chunked_head_loss_sum, row_blocks, token_cross_entropy_sum
from training.model_builder import build_model
from tests.support.specs import cpu_spec

BASE = ("model=tiny", "data=synthetic", "training.seq_len=32", "training.micro_batch_size=2")


def _inputs(seed: int = 0, *, rows: tuple[int, int] = (3, 17), dim: int = 16, vocab: int = 50):
    g = torch.Generator().manual_seed(seed)
    hidden = torch.randn(*rows, dim, generator=g, requires_grad=True)
    weight = torch.randn(vocab, dim, generator=g, requires_grad=True)
    targets = torch.randint(0, vocab, rows, generator=g)
    targets[0, :4] = IGNORE_INDEX
    return hidden, weight, targets


def _loss_and_grads(loss_fn, hidden, weight, targets, scale: float = 0.37):
    hidden.grad = weight.grad = None
    loss = loss_fn(hidden, weight, targets)
    (loss * scale).backward()
    return loss.detach(), hidden.grad.clone(), weight.grad.clone()


def _whole(hidden, weight, targets):
    return token_cross_entropy_sum(F.linear(hidden, weight), targets)


@pytest.mark.parametrize("chunks", [1, 2, 5, 51])  # 51 rows: one row per block
def test_chunked_loss_and_grads_equal_the_whole_path_in_fp32(chunks):
    hidden, weight, targets = _inputs()
    want = _loss_and_grads(_whole, hidden, weight, targets)
    got = _loss_and_grads(lambda h, w, t: chunked_head_loss_sum(h, w, t, chunks=chunks),
                          hidden, weight, targets)
    for a, b in zip(got, want):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-5)


def test_chunked_loss_under_bf16_autocast_is_the_whole_path_rounded_alike():
    hidden, weight, targets = _inputs(1)

    def under_autocast(fn):
        def run(h, w, t):
            with torch.autocast("cpu", dtype=torch.bfloat16):
                return fn(h, w, t)
        return run

    want = _loss_and_grads(under_autocast(_whole), hidden, weight, targets)
    got = _loss_and_grads(under_autocast(
        lambda h, w, t: chunked_head_loss_sum(h, w, t, chunks=4)), hidden, weight, targets)
    assert got[2].dtype == torch.float32  # the fp32 weight's gradient, as autocast gives it
    torch.testing.assert_close(got[0], want[0], rtol=1e-5, atol=1e-4)  # same bf16 logits
    for a, b in zip(got[1:], want[1:]):
        torch.testing.assert_close(a, b, rtol=2e-2, atol=2e-2)  # bf16 matmuls, summed apart


def test_without_grad_the_chunked_loss_makes_no_graph():
    hidden, weight, targets = _inputs(2)
    with torch.no_grad():
        loss = chunked_head_loss_sum(hidden, weight, targets, chunks=3)
    assert loss.grad_fn is None
    torch.testing.assert_close(loss, _whole(hidden, weight, targets).detach())


def test_row_blocks_cover_every_row_once():
    for rows, chunks in [(10, 3), (64, 4), (7, 7), (5, 1)]:
        blocks = row_blocks(rows, chunks)
        assert len(blocks) == chunks
        assert [i for b in blocks for i in range(rows)[b]] == list(range(rows))


@pytest.mark.parametrize("tied", [False, True])
def test_the_model_returns_the_same_loss_and_gradients_in_blocks(tied):
    spec = cpu_spec(*BASE, f"model.tie_embeddings={str(tied).lower()}")
    tokens = torch.randint(0, spec.model.vocab_size, (2, 32), generator=torch.Generator()
                           .manual_seed(3))
    targets = tokens.roll(-1, dims=1)
    runs = []
    for chunks in (1, 3):
        model = build_model(spec.model, device=torch.device("cpu"), seed=0)
        if chunks == 1:
            loss = token_cross_entropy_sum(model(tokens), targets)
        else:
            loss = model(tokens, targets=targets, loss_chunks=chunks)
        loss.backward()
        runs.append((loss.detach(), {n: p.grad for n, p in model.named_parameters()}))
    (whole, whole_grads), (chunked, chunked_grads) = runs
    torch.testing.assert_close(chunked, whole, rtol=1e-5, atol=1e-5)
    assert chunked_grads.keys() == whole_grads.keys()
    for name in whole_grads:
        torch.testing.assert_close(chunked_grads[name], whole_grads[name], rtol=1e-4,
                                   atol=1e-6, msg=name)


@pytest.mark.parametrize("overrides, says", [
    (["training.loss_chunks=0"], "must be >= 1"),
    (["training.loss_chunks=4", "parallel=tp", "cluster.procs_per_node=2"],
     "needs parallel.tp=1"),
    (["training.loss_chunks=4", "parallel=pp", "cluster.procs_per_node=2"],
     "needs parallel.pp=1"),
    (["training.loss_chunks=65"], "must not exceed the 64 token rows"),
])
def test_resolve_refuses_loss_chunks_it_cannot_run(overrides, says):
    with pytest.raises(ConfigError) as error:
        cpu_spec(*BASE, *overrides)
    text = str(error.value)
    assert "training.loss_chunks" in text and says in text


def test_the_plan_keeps_no_logits_in_blocks():
    spec = cpu_spec(*BASE)
    dtypes = ActivationDtypes.uniform(4)
    whole = head_bytes_per_token(spec.model, dtypes=dtypes, split=ActivationSplit())
    chunked = head_bytes_per_token(spec.model, dtypes=dtypes,
                                   split=ActivationSplit(loss_chunks=4))
    assert whole - chunked == 4 * spec.model.vocab_size  # the fp32 log-softmax
