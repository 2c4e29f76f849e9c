"""FLOPs under data.document_mask: MFU keeps the dense causal convention over the whole
seq_len window (FLOPs per token unchanged, so runs stay comparable), and the plan, the MFU log
and summary.json say so, with the most that convention can overstate the work done: the
attention term's share of the total (parallel/cost/flops.py `run_flops_convention`)."""
from __future__ import annotations

import dataclasses
import re

import pytest

from parallel.cost.flops import FLOPS_CONVENTION, matmul_params, run_flops_convention
from parallel.cost.plan import make_plan
from tests.support.specs import cpu_spec


def _masked(spec):
    """The spec with document masking on (synthetic data names no EOS; resolve() refuses it
    there, its own test; the FLOPs do not depend on which id ends documents)."""
    return dataclasses.replace(spec, data=dataclasses.replace(spec.data, document_mask=True,
                                                              eos_id=3))


def _fraction_not_done(spec, lengths: list[int]) -> float:
    """Share of the window's counted FLOPs that per-document attention does not compute, for
    a window cut into documents of `lengths`: the attention term scales with sum(L_d^2)
    instead of T^2 (the matmul term 6N per token is the same)."""
    t = spec.training.seq_len
    counted = make_plan(spec).flops_per_token * t
    attention = counted - 6 * matmul_params(spec.model) * t
    return attention * (1 - sum(n * n for n in lengths) / t ** 2) / counted


@pytest.mark.parametrize("model", ["tiny", "llama3_8b"])
def test_document_mask_keeps_dense_flops_and_names_the_most_it_overstates(model):
    plain = cpu_spec(f"model={model}", "data=synthetic", "training.seq_len=64")
    masked = _masked(plain)
    plan, masked_plan = make_plan(plain), make_plan(masked)
    assert masked_plan.flops_per_token == plan.flops_per_token  # the dense convention
    assert plan.flops_convention == FLOPS_CONVENTION and "document_mask" not in FLOPS_CONVENTION
    convention = masked_plan.flops_convention
    assert convention.startswith(FLOPS_CONVENTION)
    assert "data.document_mask: the attention term still counts the whole seq_len window" \
        in convention
    share = float(re.search(r"attention term's ([0-9.]+)% of the total", convention)[1]) / 100
    # the stated bound is the attention share (6N is the rest), and it is tight: one-token
    # documents leave nearly all of it undone; longer documents less
    t = plain.training.seq_len
    expected = 1 - 6 * matmul_params(plain.model) / plan.flops_per_token
    assert share == pytest.approx(expected, abs=5e-4) and 0 < share < 1
    assert _fraction_not_done(plain, [1] * t) == pytest.approx(share * (1 - 1 / t),
                                                                    abs=5e-4)
    for lengths in ([t], [t // 2] * 2, [5, 11, t - 16]):
        assert 0 <= _fraction_not_done(plain, lengths) < share
    assert run_flops_convention(masked) == convention and run_flops_convention(plain) == \
        FLOPS_CONVENTION


def test_summary_json_names_the_runs_convention(tmp_path):
    from training.summary_json import summarize

    masked = _masked(cpu_spec("model=tiny", "data=synthetic"))
    (tmp_path / "metrics.jsonl").write_text("")
    summary = summarize(tmp_path, peak_source="test", last_checkpoint="", export_dir="",
                        flops_convention=run_flops_convention(masked))
    assert "data.document_mask" in summary["flops_convention"]
