"""A Hugging Face model loaded under sharded layouts on 2 gloo ranks: every local shard is its
slice of the safetensors tensor, pipeline stages hold only their blocks, and the logits equal
transformers' (fp32). Llama (untied) with llama3 RoPE scaling in one file; Qwen2
with q/k/v biases (split with their column-parallel weights under tp) in sharded files."""
from __future__ import annotations

import pytest
import torch

from conf.spec_io import spec_to_dict
from parallel.cost.params import parameter_shapes, tp_local_shape
from tests.distributed.hf_import_ranks import hf_layout_rank
from tests.distributed.spawn import run_on_ranks
from tests.unit.test_hf_import import hf_logits, hf_spec, make_llama, make_qwen2, tokens

pytestmark = pytest.mark.distributed

LAYOUTS = {"zero3": ["parallel=zero3"], "tp": ["parallel=tp"], "pp": ["parallel=pp"]}
PER_MODEL = {"llama": ("tp", "pp"), "qwen2": ("zero3", "tp")}
"""Four builds keep the spawn short; tp on both (Qwen2's biases split with their weights)."""


def test_hf_weights_load_under_fsdp_tp_and_pp(tmp_path):
    models = {"llama": make_llama(tmp_path / "llama", tied=False),  # tied+tp: refused
              "qwen2": make_qwen2(tmp_path / "qwen2", max_shard_size="40KB")}
    ids = tokens()
    specs = [hf_spec(tmp_path / name, "cluster.procs_per_node=2", f"parallel.name={name}_{lay}",
                     *LAYOUTS[lay]) for name in models for lay in PER_MODEL[name]]
    results = run_on_ranks(hf_layout_rank, world_size=2, workdir=tmp_path,
                           kwargs={"spec_dicts": [spec_to_dict(s) for s in specs],
                                   "tokens": ids})
    for index, spec in enumerate(specs):
        family = spec.parallel.name.split("_")[0]
        expected = hf_logits(models[family], ids)
        first, second = results[0][index], results[1][index]
        if spec.parallel.pp == 2:  # each stage holds only its own blocks
            assert all(".1." not in n for n in first["held"] if n.startswith("layers."))
            assert all(".0." not in n for n in second["held"] if n.startswith("layers."))
            assert "tok_embeddings.weight" in first["held"] and "norm.weight" in second["held"]
            continue
        assert first["held"] == second["held"] and first["sharded"] > 0, spec.parallel.name
        if spec.parallel.tp == 2:  # the cost model's tp-local shapes (biases too) are the real ones
            counted = {n: tp_local_shape(n, shape, 2) for n, shape in parameter_shapes(spec.model)}
            assert first["local_shapes"] == counted
        for report in (first, second):
            torch.testing.assert_close(report["logits"], expected, atol=1e-5, rtol=0,
                                       msg=spec.parallel.name)
