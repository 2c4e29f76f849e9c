"""Memory under data.document_mask on the SDPA path (CPU): the plan's activation term
(parallel.cost.memory.layout_activation_bytes: per-token RoPE rows, ONE additive dense mask
[B, T/cp, T] per forward shared by every block, and the boolean mask while a checkpoint holds
it) EQUALS what one forward keeps for backward (tests/support/activation_memory.py), up to
the loss's two fp32 scalars: in one process for every recompute policy family and fp32 / bf16,
and on two gloo ranks under cp, FSDP (zero3: cast block inputs) and tp. Before the mask was shared, SDPA kept one additive copy per block (n_layers of them)."""
from __future__ import annotations

import dataclasses

import pytest

from conf.run_dir.spec_io import spec_to_dict
from tests.support.activation_memory import activation_rank
from tests.support.spawn import run_on_ranks
from tests.support.specs import cpu_spec

pytestmark = pytest.mark.distributed

BASE = ("model=tiny", "model.n_layers=3", "data=synthetic", "training.seq_len=64",
        "training.micro_batch_size=2", "training.grad_accum_steps=1")
SCALARS = 8  # the loss sum and cross entropy's total weight, fp32
EOS = 3


def _specs(layouts: dict[str, list[str]], policies: list[str], world: int) -> list:
    """Synthetic tokens name no EOS (resolve() refuses the knob there, its own test): the
    document mask is switched on by hand with EOS = 3, which the random tokens hold."""
    specs = []
    for name, extra in layouts.items():
        for precision in ("fp32", "bf16"):
            for policy in policies:
                spec = cpu_spec(*BASE, f"cluster.procs_per_node={world}",
                                f"precision={precision}", f"recompute={policy}", *extra)
                specs.append(dataclasses.replace(
                    spec, data=dataclasses.replace(spec.data, document_mask=True, eos_id=EOS),
                    parallel=dataclasses.replace(spec.parallel,
                                                 name=f"{name}-{precision}-{policy}")))
    return specs


def _check(rows: list[dict]) -> None:
    wrong = [f"{row['name']} rank {row['rank']}: kept {row['measured']} B, plan "
             f"{row['plan']} B" for row in rows if row["measured"] - row["plan"] != SCALARS]
    assert not wrong, "\n".join(wrong)


def test_one_process_document_mask_activations_equal_the_plan():
    specs = _specs({"single": ["parallel=single"]},
                   ["none", "full_every2", "selective", "selective_attention"], 1)
    rows = activation_rank(rank=0, world_size=1, spec_dicts=[spec_to_dict(s) for s in specs])
    _check(rows)
    # the dense mask term is there and is one copy, not one per block
    from parallel.cost.activations import (ActivationDtypes, ActivationSplit,
                                           document_mask_bytes)
    none = specs[0]
    assert document_mask_bytes(recompute=none.recompute, layers=[0, 1, 2], seq=64,
                               micro_batch=2, device_type="cpu",
                               dtypes=ActivationDtypes.uniform(4),
                               split=ActivationSplit(document_mask=True)) == 2 * 64 * 64 * 4


def test_two_rank_document_mask_activations_equal_the_plan(tmp_path):
    layouts = {"cp_balanced": ["parallel=cp"], "zero3": ["parallel=zero3"],
               "tp_sp": ["parallel=tp"]}
    specs = _specs(layouts, ["none", "full_every2"], 2)
    results = run_on_ranks(activation_rank, world_size=2, workdir=tmp_path, timeout_s=600,
                           kwargs={"spec_dicts": [spec_to_dict(s) for s in specs]})
    _check([row for rows in results for row in rows])
