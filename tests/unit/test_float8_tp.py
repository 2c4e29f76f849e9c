"""precision=fp8 with parallel.tp > 1: resolved (torchao's Float8 TP styles, parallel/float8_tp.py),
planned with the block linears at the fp8 rate on their tp-local shapes and the sequence-
parallel all-gathers at 1 byte an element; and the TP pass choosing the Float8 styles for
exactly the modules fp8 converted. torchao is not needed here (its styles are stood in for);
the run on CUDA is tests/gpu/test_float8_tp_cuda.py."""
from __future__ import annotations

from functools import lru_cache

import pytest

from parallel.cost.comm import Link, step_collectives
from parallel.cost.matmul_rate import block_gemms
from parallel.cost.plan import make_plan
from parallel.cost.step_time import estimate_time
from tests.support.specs import cpu_spec

H100 = ("model=llama3_1b", "cluster=slurm", "cluster.gpu_name=H100", "training.device=cuda",
        "training.seq_len=4096", "training.grad_accum_steps=1", "cluster.calibration=none",
        "recompute=none", "cluster.nodes=1", "parallel=fsdp_tp", "parallel.tp=2")
LINK = Link(name="x", gbps=100.0, latency_s=0.0)


@lru_cache(maxsize=None)
def gpu(*overrides: str):
    return cpu_spec(*H100, *overrides)


def tp_collectives(spec):
    return {c.op: c for c in step_collectives(spec, ranks_per_node=8, intra=LINK, inter=LINK)
            if c.axis == "tp"}


def test_fp8_with_tp_resolves_on_a_device_with_fp8():
    spec = gpu("precision=fp8")
    assert spec.precision.name.value == "fp8" and spec.parallel.tp == 2
    assert spec.parallel.sequence_parallel


def test_the_sequence_parallel_all_gathers_move_fp8_and_the_reduce_scatters_do_not():
    """torchao casts the column inputs (forward) and the row outputs' gradients (backward)
    to fp8 before gathering them; the reduce-scatters stay bf16. (Mutation tried: fp8 bytes
    on both ops -> the reduce-scatter check fails; on none -> the halving fails.)"""
    bf16, fp8 = tp_collectives(gpu("precision=bf16")), tp_collectives(gpu("precision=fp8"))
    assert fp8["all_gather"].size_bytes == bf16["all_gather"].size_bytes / 2
    assert fp8["all_gather"].calls == bf16["all_gather"].calls
    assert fp8["reduce_scatter"].size_bytes == bf16["reduce_scatter"].size_bytes
    assert "fp8" in fp8["all_gather"].why
    assert fp8["all_gather"].seconds < bf16["all_gather"].seconds


def test_without_sequence_parallel_fp8_keeps_the_all_reduces_in_bf16():
    """Without SP nothing is gathered: the row outputs' and column inputs' gradients are
    all-reduced in high precision, as torchao's styles leave them."""
    off = ("parallel.sequence_parallel=false",)
    bf16 = tp_collectives(gpu(*off, "precision=bf16"))
    fp8 = tp_collectives(gpu(*off, "precision=fp8"))
    assert set(fp8) == {"all_reduce"}
    assert fp8["all_reduce"].size_bytes == bf16["all_reduce"].size_bytes


def test_the_block_linears_run_at_the_fp8_rate_on_their_tp_local_shapes():
    spec = gpu("precision=fp8")
    whole = block_gemms(spec.model, tokens=4096, tp=1, fp8=True)
    local = block_gemms(spec.model, tokens=4096, tp=2, fp8=True)
    assert all(g.fp8 for g in local)
    assert sum(g.flops for g in local) == pytest.approx(sum(g.flops for g in whole) / 2)
    bf16 = estimate_time(gpu("precision=bf16"), make_plan(gpu("precision=bf16")))
    fp8 = estimate_time(spec, make_plan(spec))
    assert fp8.breakdown.gemm_efficiency > 1.4 * bf16.breakdown.gemm_efficiency  # bf16 peak
    assert fp8.tokens_per_s_per_device > bf16.tokens_per_s_per_device


# ---- the TP pass: which modules take the Float8 styles (torch, no torchao) -------------------

def _block_and_plan():
    from training.model_builder import build_model_on_meta
    from training.models import family_of
    from training.models.family import BLOCKS

    spec = cpu_spec("model=tiny")
    model = build_model_on_meta(spec.model)
    return next(iter(getattr(model, BLOCKS).values())), family_of(spec.model).tp


def test_the_float8_paths_are_the_converted_tp_linears_and_the_inputs_only_they_read():
    from torch import nn

    from parallel.float8_tp import float8_paths

    block, tp = _block_and_plan()
    every = float8_paths(block, tp, converted=lambda m: isinstance(m, nn.Linear))
    assert every == {*tp.column, *tp.row, *tp.gathered_inputs}
    down = tp.row[-1]  # the MLP's down projection left in bf16
    some = float8_paths(block, tp, converted=lambda m: m is not block.get_submodule(down))
    assert down not in some
    mlp = down.rpartition(".")[0]
    assert mlp in tp.gathered_inputs and mlp not in some  # one of its linears is not fp8
    assert set(tp.gathered_inputs) - {mlp} <= some
    assert float8_paths(block, tp, converted=lambda m: False) == frozenset()


@pytest.mark.parametrize("sequence_parallel", [False, True])
def test_the_block_plan_puts_the_float8_styles_on_those_paths_with_the_plain_layouts(
        sequence_parallel):
    from torch.distributed.tensor.parallel import (
        ColwiseParallel,
        PrepareModuleInput,
        RowwiseParallel,
    )

    from parallel.tensor_parallel import _block_plan

    class Col(ColwiseParallel): pass
    class Row(RowwiseParallel): pass
    class Gather(PrepareModuleInput): pass

    _, tp = _block_and_plan()
    converted = frozenset((*tp.column[:1], *tp.row, *tp.gathered_inputs[:1]))
    plain = _block_plan(tp, sequence_parallel=sequence_parallel)
    fp8 = _block_plan(tp, sequence_parallel=sequence_parallel,
                      float8=(converted, (Col, Row, Gather)))
    assert plain.keys() == fp8.keys()
    for path, style in fp8.items():
        stand_in = {ColwiseParallel: Col, RowwiseParallel: Row, PrepareModuleInput: Gather}
        want = stand_in.get(type(plain[path]), type(plain[path])) if path in converted \
            else type(plain[path])
        assert type(style) is want, path
        assert vars(style) == vars(plain[path]), path  # the same layouts either way
