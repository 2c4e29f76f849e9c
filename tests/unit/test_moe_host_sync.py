"""No host synchronisation in the MoE forward and backward: run on fake tensors (shapes and
dtypes, no data), every op whose result needs the device's data on the host raises there
(`.item()`, `.tolist()`, `int(t)`, `if t:`, bincount, nonzero, boolean masks, one-argument
torch.where, repeat_interleave without output_size, unique, ...; the detector's own test
shows each). CUDA's sync debug mode does the same on a GPU; this works on CPU. Under expert
parallelism the one host read allowed is the all-to-all's split sizes (exchange_counts), here
answered for ep=1 so that everything around it runs on fake tensors too. The runs are in
bf16 autocast, where the experts are torch's grouped GEMM; in fp32 they are the per-expert
loop, whose split sizes are the first and only read. The grouped GEMM and the loop agree,
dropless and under a capacity (dropped copies trailing, masked); the layer compiles as one
graph (torch.compile fullgraph=True) and equals eager."""
from __future__ import annotations

import types

import pytest
import torch
from torch._subclasses.fake_tensor import (DataDependentOutputException,
                                           DynamicOutputShapeException, FakeTensorMode)

import parallel.expert_parallel as expert_parallel
from tests.support.specs import cpu_spec
from training.models.moe.model import MoeTransformer
from training.models.moe.model.grouped_experts import GroupedExperts, grouped_mm_on_cpu
from training.models.moe.model.moe_layer import MoE

HOST_READS = (DataDependentOutputException, DynamicOutputShapeException)
OVERRIDES = {"dropless": (), "capacity": ("model.moe.capacity_factor=0.75",),
             "sigmoid_shared": ("model.moe.score=sigmoid", "model.moe.num_shared_experts=1",
                                "model.moe.bias_update_rate=0.01", "model.moe.seq_aux_loss=true",
                                "checkpoint.export_safetensors=false")}


def moe_model(*overrides: str):
    return cpu_spec("model=tiny_moe", "model.dim=16", "model.n_heads=2", "model.n_kv_heads=1",
                    "data=synthetic", *overrides).model


def forward_backward_on_fake_tensors(build, *, batch: int = 2, seq: int = 8,
                                     dtype=torch.bfloat16) -> None:
    """Build the module and run forward + backward (router losses included) with fake
    tensors, the matmuls in `dtype` (autocast); a host read raises one of HOST_READS."""
    with FakeTensorMode(), torch.autocast("cpu", dtype=dtype, enabled=dtype != torch.float32):
        module = build()
        if isinstance(module, MoE):
            out = module(torch.randn(batch, seq, module.router.in_features))
            loss = out.square().mean() + module.router_losses
        else:
            logits = module(torch.randint(0, module.spec.vocab_size, (batch, seq)))
            loss = logits.float().square().mean() + module.router_losses()
        loss.backward()
        assert all(p.grad is not None for p in module.parameters() if p.requires_grad)


@pytest.mark.parametrize("name", OVERRIDES)
def test_moe_layer_forward_backward_reads_nothing_on_the_host(name):
    model = moe_model(*OVERRIDES[name])
    forward_backward_on_fake_tensors(lambda: MoE(model).train())


def test_in_fp32_the_loops_split_sizes_are_the_first_host_read():
    if not grouped_mm_on_cpu():
        pytest.skip("this torch has no CPU torch._grouped_mm: the bf16 runs take the loop")
    model = moe_model()
    with pytest.raises(HOST_READS) as read:
        forward_backward_on_fake_tensors(lambda: MoE(model).train(), dtype=torch.float32)
    assert read.traceback[-1].name != "_looped"  # the read is inside torch, called from:
    assert any(entry.name == "_looped" for entry in read.traceback)


def test_moe_model_forward_backward_reads_nothing_on_the_host():
    model = moe_model(*OVERRIDES["capacity"])
    forward_backward_on_fake_tensors(lambda: MoeTransformer(model).train())


@pytest.mark.parametrize("read", [
    lambda c: c.tolist(), lambda c: c.sum().item(), lambda c: int(c.sum()),
    lambda c: bool(c.sum() > 0), lambda c: torch.bincount(c, minlength=4),
    lambda c: c.nonzero(), lambda c: c[c > 1], lambda c: torch.where(c > 1),
    lambda c: torch.repeat_interleave(c, c), lambda c: torch.unique(c),
    lambda c: torch.split(torch.zeros(8), c[:2].tolist())],
    ids=["tolist", "item", "int", "bool", "bincount", "nonzero", "bool_mask", "where_1arg",
         "repeat_interleave", "unique", "split_by_tensor"])
def test_the_detector_catches_each_kind_of_host_read(read):
    with FakeTensorMode(), pytest.raises(HOST_READS):
        read(torch.zeros(4, dtype=torch.long))


def wrapped_as_ep(layer: MoE) -> MoE:
    """The layer's experts called through ep_forward, as apply_ep wraps them (ep=1)."""
    local = type(layer.experts).forward
    layer.experts.forward = types.MethodType(
        lambda self, x, counts: expert_parallel.ep_forward(
            self, x, counts, ep=1, group=None, local_forward=local), layer.experts)
    return layer


def test_under_ep_the_split_sizes_are_the_only_host_read(monkeypatch):
    """exchange_counts is answered with its ep=1 result (dropless: every copy goes to this
    rank, a number known without data) and counted; everything else of the ep forward and
    backward runs on fake tensors."""
    model = moe_model()
    calls = []

    def split_sizes(counts, *, ep, group):
        calls.append(ep)
        rows = 2 * 8 * model.moe.top_k
        return counts.view(1, -1), [rows], [rows]

    monkeypatch.setattr(expert_parallel, "exchange_counts", split_sizes)
    monkeypatch.setattr(expert_parallel, "all_to_all", lambda x, **_: x)
    forward_backward_on_fake_tensors(lambda: wrapped_as_ep(MoE(model).train()))
    assert calls == [1]


def test_ep_wrapper_sends_only_the_kept_copies_and_returns_zeros_for_the_dropped(monkeypatch):
    """Under a capacity the dropped copies trail the kept ones: ep_forward sends the kept
    rows only (the split sizes sum to them) and pads the answer; the layer's output and
    gradients equal the unwrapped layer's (ep=1, real tensors, fp32: the loop)."""
    sent = []

    def split_sizes(counts, *, ep, group):
        kept = int(counts.sum())
        return counts.view(1, -1), [kept], [kept]

    def all_to_all(x, *, out_splits, in_splits, group):
        sent.append((x.shape[0], in_splits))
        return x

    monkeypatch.setattr(expert_parallel, "exchange_counts", split_sizes)
    monkeypatch.setattr(expert_parallel, "all_to_all", all_to_all)
    model = moe_model("model.moe.capacity_factor=0.5")
    results = []
    for wrap in (False, True):
        torch.manual_seed(0)
        layer = MoE(model)
        with torch.no_grad():
            for param in layer.parameters():
                param.normal_(0, 0.5)
        layer = wrapped_as_ep(layer) if wrap else layer
        x = torch.randn(2, 8, 16, generator=torch.Generator().manual_seed(1),
                        requires_grad=True)
        out = layer(x)
        out.square().sum().backward()
        results.append([out.detach(), x.grad] + [p.grad for p in layer.parameters()])
    for got, want in zip(*results):
        torch.testing.assert_close(got, want, atol=1e-6, rtol=1e-6)
    capacity = layer.capacity(16)
    assert sent and all(rows == sum(splits) <= 4 * capacity < 32 for rows, splits in sent)


@pytest.mark.parametrize("capacity", [False, True])
def test_grouped_gemm_and_loop_agree_with_trailing_unrouted_rows(capacity):
    if not grouped_mm_on_cpu():
        pytest.skip("this torch has no CPU torch._grouped_mm: the loop is the only path")
    torch.manual_seed(0)
    experts = GroupedExperts(num_experts=4, dim=16, ffn_dim=32)
    with torch.no_grad():
        for p in experts.parameters():
            p.normal_(0, 0.3)
    counts = torch.tensor([3, 0, 9, 4])
    rows = 20 if capacity else 16  # rows past sum(counts): dropped copies, masked
    kept = (torch.arange(rows) < counts.sum()).unsqueeze(1)
    results = []
    for grouped in (True, False):
        experts.allow_grouped_mm = grouped
        x = torch.randn(rows, 16, generator=torch.Generator().manual_seed(1),
                        requires_grad=True)
        with torch.autocast("cpu", dtype=torch.bfloat16):
            out = torch.where(kept, experts(torch.where(kept, x, 0), counts), 0)
        out.float().square().sum().backward()
        results.append([out.detach().float(), x.grad] + [p.grad for p in experts.parameters()])
        experts.zero_grad(set_to_none=True)
    assert results[0][0].dtype == torch.float32 and results[0][1].abs().sum() > 0
    for got, want in zip(*results):  # both bf16 matmuls, summed in a different order
        torch.testing.assert_close(got, want, atol=2e-2, rtol=2e-2)
    assert results[0][1][int(counts.sum()):].abs().sum() == 0  # masked rows: no gradient


@pytest.mark.parametrize("name", ["dropless", "capacity"])
def test_moe_layer_compiles_as_one_graph_and_equals_eager(name):
    """torch.compile(fullgraph=True) refuses a graph break, which any host read would be;
    the CPU probe is a constant to it (the layer in bf16 autocast: the grouped GEMM)."""
    if not grouped_mm_on_cpu():
        pytest.skip("this torch has no CPU torch._grouped_mm: the loop reads its split sizes")
    torch.manual_seed(0)
    layer = MoE(moe_model(*OVERRIDES[name]))
    with torch.no_grad():
        for param in layer.parameters():
            param.normal_(0, 0.5)
    layer.reset_stats()
    x = torch.randn(2, 8, 16)
    torch._dynamo.reset()
    compiled = torch.compile(layer, backend="aot_eager", fullgraph=True)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        torch.testing.assert_close(compiled(x), layer(x), atol=0, rtol=0)
