"""The test-only toy family (tests/support/toy_family: fused q/k/v, LayerNorm with biases, GELU
MLP) under two-rank layouts against one process, as test_layout_parity.py proves Llama: after
one AdamW update the loss, every gradient and every parameter match, and the plan's static
memory per rank equals what each rank holds. The passes (FSDP units, TP plan with sequence
parallel, pipeline split) and the cost model learn the toy's names from its family alone."""
from __future__ import annotations

import pytest

from conf.run_dir.spec_io import spec_to_dict
from parallel.cost.params import parameter_shapes
from tests.support.layout_parity import parity_rank
from tests.support.spawn import run_on_ranks
from tests.support.specs import cpu_spec
from tests.support.toy_family import NAME as TOY

pytestmark = pytest.mark.distributed

BASE = ("model=tiny", "model.n_layers=4", f"model.family={TOY}", "model.n_kv_heads=-1",
        "data=synthetic", "training.seq_len=32", "optim.lr=1e-4",
        "training.micro_batch_size=2", "training.grad_accum_steps=2",
        "cluster.procs_per_node=2")
LAYOUTS = {
    "zero3": ["parallel=zero3"],
    "tp_sp": ["parallel=tp"],
    "pp_1f1b": ["parallel=pp", "recompute=selective", "recompute.targets=[attention,norm]"],
}


def test_toy_family_two_rank_layouts_match_one_process(tmp_path):
    specs = [cpu_spec(*BASE, f"parallel.name={name}", *extra) for name, extra in LAYOUTS.items()]
    results = run_on_ranks(parity_rank, world_size=2, workdir=tmp_path, timeout_s=400,
                           kwargs={"spec_dicts": [spec_to_dict(s) for s in specs]})
    for index, spec in enumerate(specs):
        rows = [rank_rows[index] for rank_rows in results]
        covered = set().union(*(row["names"] for row in rows))
        assert covered == {name for name, _ in parameter_shapes(spec.model)}, spec.parallel.name
        assert "layers.3.attn.c_attn.weight" in covered
        assert len({round(row["loss"], 6) for row in rows}) == 1, spec.parallel.name
