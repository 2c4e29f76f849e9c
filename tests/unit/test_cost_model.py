"""The torch-free cost model (parallel.cost) against real tensors: parameter counts and static
memory."""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from parallel.cost.devices import GIB, gpu_memory_bytes, gpu_peak
from parallel.cost.flops import ATTENTION_TERMS, flops_per_token
from parallel.cost.memory import estimate_memory
from parallel.cost.params import numel, param_counts, parameter_shapes, tp_local_shape
from parallel.tp_plan import tp_split_dim
from tests.support.specs import cpu_spec
from training.parallel_model import ParallelModel
from training.model_builder import build_model, count_params
from training.models import family_of
from training.optim import build_optimizer
from training.step import clip_and_step, forward_backward

REPO = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize("tied", [False, True])
def test_param_counts_match_the_built_model(tied):
    spec = cpu_spec("model=debug", f"model.tie_embeddings={str(tied).lower()}")
    model = build_model(spec.model, device=torch.device("meta"), seed=0)
    total, embedding = count_params(model)
    counts = param_counts(spec.model)
    assert (counts.total, counts.embedding) == (total, embedding)


@pytest.mark.parametrize("tied", [False, True])
def test_flops_per_token_counts_every_matmul_the_model_runs(tied):
    """The matmuls (aten.mm, forward + backward) of a real step are 6N - 6*(norm weights) per
    token: with tied embeddings the output head still runs its vocab x dim matmul."""
    from torch.utils.flop_counter import FlopCounterMode

    spec = cpu_spec("model=debug", f"model.tie_embeddings={str(tied).lower()}")
    model = build_model(spec.model, device=torch.device("cpu"), seed=0)
    batch, seq = 2, 32
    tokens = torch.randint(0, spec.model.vocab_size, (batch, seq))
    with FlopCounterMode(display=False) as counter:
        model(tokens).float().sum().backward()
    m = spec.model
    attention = ATTENTION_TERMS["full"] * m.n_layers * m.n_heads * m.head_dim * seq
    norms = sum(p.numel() for p in model.parameters() if p.ndim == 1)
    want = (flops_per_token(m, seq) - attention - 6 * norms) * batch * seq
    assert counter.get_total_flops() == want
    causal = flops_per_token(m, seq, attention="causal")
    assert flops_per_token(m, seq) - causal == attention // 2


def tensor_bytes(tensors) -> int:
    return sum(t.numel() * t.element_size() for t in tensors if isinstance(t, torch.Tensor))


def test_static_memory_estimate_matches_bytes_held_after_a_step():
    spec = cpu_spec("model=tiny", "data=synthetic", "parallel=single", "training.seq_len=16",
                    "training.micro_batch_size=2")
    model = build_model(spec.model, device=torch.device("cpu"), seed=0)
    optimizer = build_optimizer(model, optim=spec.optim)
    batch = [(torch.randint(0, 256, (2, 16)), torch.randint(0, 256, (2, 16)))]
    layout = ParallelModel.single(model)
    forward_backward(layout, batch, device=torch.device("cpu"),
                     autocast=torch.autocast("cpu", enabled=False))
    grads = tensor_bytes(p.grad for p in model.parameters())
    clip_and_step(layout, [optimizer], grad_clip=1.0)
    estimate = estimate_memory(spec)
    held_optimizer = sum(tensor_bytes(state.values()) for state in optimizer.state.values())
    assert tensor_bytes(model.parameters()) == estimate.params
    assert grads == estimate.grads
    assert held_optimizer == estimate.optimizer  # two moments per element + a step per tensor


def test_the_cost_model_never_imports_torch():
    modules = ["parallel.tp_plan", *(f"parallel.cost.{m}" for m in
               ("activations", "devices", "fit", "flops", "memory", "params", "plan",
                "step_time"))]
    code = "import sys; " + "; ".join(f"import {m}" for m in modules) + \
           "; print('torch' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True,
                         timeout=120, env={**os.environ, "PYTHONPATH": str(REPO)})
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "False"


@pytest.mark.parametrize("sequence_parallel", [False, True])
def test_tensor_parallel_applies_the_table_the_cost_model_counts(sequence_parallel):
    """parallel/tensor_parallel.py shards exactly the modules parallel/tp_plan.py names, in the
    style that splits the dim tp_local_shape divides (colwise: dim 0, rowwise: dim 1)."""
    from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel

    from parallel.tensor_parallel import _block_plan

    spec = cpu_spec("model=debug")
    tp = family_of(spec.model).tp
    plan = _block_plan(tp, sequence_parallel=sequence_parallel)
    colwise = {k for k, v in plan.items() if isinstance(v, ColwiseParallel)}
    rowwise = {k for k, v in plan.items() if isinstance(v, RowwiseParallel)}
    assert colwise == set(tp.column)
    assert rowwise == set(tp.row)
    for name, shape in parameter_shapes(spec.model):
        module = ".".join(name.split(".")[2:-1])
        if module in colwise:
            assert tp_local_shape(name, shape, 2, "llama") == (shape[0] // 2, shape[1]), name
        elif module in rowwise:
            assert tp_local_shape(name, shape, 2, "llama") == (shape[0], shape[1] // 2), name
        elif name.startswith("layers."):
            assert tp_local_shape(name, shape, 2, "llama") == shape, name


def test_the_embedding_and_head_are_split_by_vocabulary():
    spec = cpu_spec("model=debug")
    shapes = dict(parameter_shapes(spec.model))
    vocab, dim = spec.model.vocab_size, spec.model.dim
    assert tp_local_shape("tok_embeddings.weight", shapes["tok_embeddings.weight"], 4,
                          "llama") == \
        (vocab // 4, dim)
    assert tp_local_shape("output.weight", shapes["output.weight"], 4, "llama") == (vocab // 4, dim)
    assert tp_local_shape("norm.weight", shapes["norm.weight"], 4, "llama") == (dim,)
    assert tp_split_dim("layers.0.attention_norm.weight", "llama") is None


@pytest.mark.parametrize(("name", "dtype", "source"), [
    ("NVIDIA H100 80GB HBM3", "bf16", "table:H100 bf16 dense"),
    ("NVIDIA H100 PCIe", "bf16", "table:H100 PCIe bf16 dense"),
    ("NVIDIA H100 NVL", "fp32", "table:H100 NVL fp32 dense"),  # not the SXM row
    ("nvidia a100-sxm4-40gb", "fp32", "table:A100 fp32 dense"),
])
def test_gpu_peaks_come_from_the_device_catalogue(name, dtype, source):
    peak = gpu_peak(name, dtype)
    assert peak is not None and peak.source == source
    assert gpu_peak("Some Future GPU", "bf16") is None


@pytest.mark.parametrize(("name", "gib"), [
    ("NVIDIA A100-SXM4-80GB", 80), ("NVIDIA A100-SXM4", 40), ("NVIDIA H100 NVL", 94),
    ("NVIDIA H100 PCIe", 80), ("H200", 141), ("h100", None), ("Some Future GPU", None),
    ("NVIDIA GH200 480GB", 96),  # 480 GB is the superchip's CPU memory, not the GPU's
])
def test_gpu_memory_comes_from_the_name_or_the_device_catalogue(name, gib):
    """The table matches case-sensitively (as the sweep preview always did; gpu_peak does not)."""
    assert gpu_memory_bytes(name) == (None if gib is None else gib * GIB)


@pytest.mark.parametrize("tied", [False, True])
def test_autocast_weight_copies_match_the_bf16_weights_saved_for_backward(tied):
    """Without FSDP, bf16 autocast saves a bf16 copy of every matmul weight (the tied head's
    too) for backward: the weight copies term is exactly those bytes."""
    from parallel.cost.memory import weight_copy_bytes

    spec = cpu_spec("model=debug", "precision=bf16", "parallel=single",
                    f"model.tie_embeddings={str(tied).lower()}")
    model = build_model(spec.model, device=torch.device("cpu"), seed=0)
    weights = [p for p in model.parameters() if p.ndim == 2]
    saved: dict[int, int] = {}

    def pack(t):
        is_copy = t.dtype == torch.bfloat16 and t.ndim == 2 and any(
            c.shape == w.shape and torch.equal(c, w.detach().bfloat16())
            for w in weights for c in (t, t.t()))
        if is_copy:
            saved[t.untyped_storage().data_ptr()] = t.untyped_storage().nbytes()
        return t

    tokens = torch.randint(0, spec.model.vocab_size, (2, 8))
    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t), \
            torch.autocast("cpu", dtype=torch.bfloat16):
        model(tokens)
    assert weight_copy_bytes(spec, 0) == sum(saved.values()) > 0
    fp32 = cpu_spec("model=debug", "precision=fp32", "parallel=single")
    assert weight_copy_bytes(fp32, 0) == 0


def test_fsdp_weight_copies_zero2_keeps_every_unit_gathered_zero3_the_head_and_one_block():
    """parallel/fsdp.py: zero=2 never reshards after forward; zero=3 does, except the head
    unit (final norm + head) and the block in use (the one prefetched in backward is a
    collective buffer, tests/unit/test_step_peak.py); the untied embedding is re-sharded
    (tests/distributed/test_fsdp_units.py checks the real units)."""
    from parallel.cost.memory import weight_copy_bytes

    def spec(zero):
        return cpu_spec("model=debug", "precision=bf16", "parallel=fsdp", f"parallel.zero={zero}",
                        "cluster.procs_per_node=4")

    m = spec(2).model
    shapes = dict(parameter_shapes(m))
    total = param_counts(m).total
    block = sum(numel(s) for name, s in shapes.items() if name.startswith("layers.0."))
    head_unit = total - m.n_layers * block - numel(shapes["tok_embeddings.weight"])
    assert weight_copy_bytes(spec(2), 0) == 2 * total
    assert weight_copy_bytes(spec(3), 0) == 2 * (head_unit + block)
    z2, z3 = estimate_memory(spec(2)), estimate_memory(spec(3))
    assert z2.total - z3.total == z2.weight_copies - z3.weight_copies > 0


@pytest.mark.parametrize(("overrides", "fullest"), [
    (("model=debug", "model.tie_embeddings=true", "cluster.procs_per_node=6"), 1),
    (("model=tiny", "model.tie_embeddings=false", "cluster.procs_per_node=6"), 2),
    (("model=tiny", "model.tie_embeddings=false", "cluster.procs_per_node=16"), 0),
])
def test_zero1_fullest_rank_is_found_without_walking_every_rank(overrides, fullest, monkeypatch):
    """The fullest ZeRO-1 rank (not always shard 0) from one owner assignment per layout:
    the same answer as estimating every rank."""
    import parallel.cost.memory as memory
    import parallel.cost.memory_static as memory_static

    spec = cpu_spec("parallel=zero1", *overrides)
    every = [memory.estimate_memory(spec, rank=r) for r in range(spec.world_size)]
    assert max(range(len(every)), key=lambda r: every[r].total) == fullest
    calls = []
    monkeypatch.setattr(memory_static, "zero1_owners", lambda *a: calls.append(a) or
                        __import__("parallel.dims").dims.zero1_owners(*a))
    memory.clear_memory_caches()
    assert memory.estimate_memory(spec) == every[fullest]
    assert len(calls) == 1  # owners computed once for the layout, not once per rank


def test_fsdp_weight_copies_zero_bubble_pipeline_keeps_every_unit_gathered():
    """parallel/pipeline.py keeps FSDP units gathered under the split I/W backward."""
    from parallel.cost.memory import weight_copy_bytes

    def spec(schedule):
        return cpu_spec("model=debug", "precision=bf16", "parallel=fsdp", "parallel.zero=3",
                        "parallel.pp=2", "parallel.dp_shard=2", f"parallel.pp_schedule={schedule}",
                        "parallel.pp_microbatches=4", "parallel.pp_virtual_stages=2",
                        "cluster.procs_per_node=4")

    from parallel.cost.params import held_parameters

    zero_bubble, interleaved = spec("interleaved_zero_bubble"), spec("interleaved_1f1b")
    held = sum(numel(shape) for _, shape in held_parameters(zero_bubble, 0))
    assert weight_copy_bytes(zero_bubble, 0) == 2 * held > weight_copy_bytes(interleaved, 0)
