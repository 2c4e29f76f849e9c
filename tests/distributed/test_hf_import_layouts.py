"""Hugging Face models saved by transformers as sharded safetensors (an index and several small
files), loaded under 2-D layouts on 4 gloo ranks (one spawn): FSDP x TP (2 x 2) and pipeline
stages x TP / x FSDP (2 x 2). Every local shard is its slice of the safetensors tensor; each
rank reads exactly the slices it holds, and opens only the files that hold them; the logits
and the loss equal transformers' (fp32). Llama with llama3 RoPE scaling, Qwen2 with q/k/v
biases (split with their column-parallel weights under tp)."""
from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

from conf.run_dir.spec_io import spec_to_dict
from parallel.cost.params import parameter_shapes, tp_local_shape
from tests.support.hf_import_ranks import hf_layout_rank
from tests.support.hf_models import hf_logits, make_llama, make_qwen2, tokens
from tests.support.spawn import run_on_ranks
from tests.support.specs import hf_spec

pytestmark = pytest.mark.distributed

WORLD = 4
SHARD = "40KB"
"""Small enough that each model is split over several files (the embeddings alone are 77 KB)."""
LAYOUTS = {"fsdp_tp": ["parallel=fsdp_tp"],
           "fsdp_tp_lossparallel": ["parallel=fsdp_tp", "parallel.loss_parallel=true"],
           "pp_tp": ["parallel=pp", "parallel.pp=2", "parallel.tp=2"],
           "pp_fsdp": ["parallel=pp", "parallel.pp=2", "parallel.dp_shard=2", "parallel.zero=3"]}
PER_MODEL = {"llama": ("fsdp_tp", "pp_tp"), "qwen2": ("fsdp_tp_lossparallel", "pp_fsdp")}


@pytest.fixture(scope="module")
def loaded(tmp_path_factory):
    """Both models, their specs, and every rank's reports from one 4-rank spawn."""
    root = tmp_path_factory.mktemp("hf_layouts")
    models = {"llama": make_llama(root / "llama", tied=False, max_shard_size=SHARD),
              "qwen2": make_qwen2(root / "qwen2", max_shard_size=SHARD)}
    specs = [hf_spec(root / name, f"cluster.procs_per_node={WORLD}",
                     f"parallel.name={name}_{lay}", *LAYOUTS[lay])
             for name in models for lay in PER_MODEL[name]]
    ids = tokens(41)
    results = run_on_ranks(hf_layout_rank, world_size=WORLD, workdir=root, timeout_s=400,
                           kwargs={"spec_dicts": [spec_to_dict(s) for s in specs],
                                   "tokens": ids})
    return models, specs, ids, results


def _cases(loaded):
    models, specs, ids, results = loaded
    for index, spec in enumerate(specs):
        family = spec.parallel.name.split("_")[0]
        yield spec, models[family], ids, [results[rank][index] for rank in range(WORLD)]


def test_folders_are_sharded_with_an_index(loaded):
    models, specs, _, _ = loaded
    for spec in specs:
        index = json.loads((Path(spec.model.path) / "model.safetensors.index.json").read_text())
        assert len(set(index["weight_map"].values())) >= 3, spec.parallel.name


def test_each_rank_reads_exactly_its_slices_and_only_their_files(loaded):
    for spec, model, _, reports in _cases(loaded):
        name = spec.parallel.name
        index = json.loads((Path(spec.model.path) / "model.safetensors.index.json").read_text())
        whole = {n: tuple(p.shape) for n, p in model.state_dict().items()}
        coverage = {n: torch.zeros(shape, dtype=torch.int32) for n, shape in whole.items()
                    if n in index["weight_map"]}
        for report in reports:
            tensors = [r.tensor for r in report["reads"]]
            assert len(tensors) == len(set(tensors)) == len(report["held"]), name
            read_numel = sum(_numel(r.region) for r in report["reads"])
            assert read_numel == report["local_numel"] < sum(map(_numel_of, whole.values())), name
            wanted_files = {index["weight_map"][t] for t in tensors}
            assert sorted(report["opened"]) == sorted(wanted_files), name
            for r in report["reads"]:
                coverage[r.tensor][tuple(slice(a, b) for a, b in r.region)] += 1
        for tensor, counts in coverage.items():  # every element read, equally often
            assert counts.min() >= 1 and counts.min() == counts.max(), (name, tensor)
        if spec.parallel.pp == 2:  # a stage opens only the files holding its own tensors
            all_files = set(index["weight_map"].values())
            for report in reports:
                assert set(report["opened"]) < all_files, name
                stage = report["coords"]["pp"]
                assert all(f"layers.{1 - stage}." not in n for n in report["held"]), name
                assert ("tok_embeddings.weight" in report["held"]) == (stage == 0), name
                assert ("output.weight" in report["held"]) == (stage == 1), name


def _numel(region) -> int:
    out = 1
    for start, stop in region:
        out *= stop - start
    return out


def _numel_of(shape) -> int:
    return _numel([(0, size) for size in shape])


def test_logits_and_loss_equal_transformers(loaded):
    for spec, model, ids, reports in _cases(loaded):
        name = spec.parallel.name
        expected = hf_logits(model, ids[:, :-1])
        loss_sum = F.cross_entropy(expected.flatten(0, 1), ids[:, 1:].flatten(),
                                   reduction="sum").item()
        reporting = [r["loss_sum"] for r in reports if r["loss_sum"] is not None]
        assert reporting, name  # the ranks that report a loss (tp rank 0 of the last stage)
        for value in reporting:  # fp32 sums of 80 token losses: equal to ~1e-6 relative
            assert value == pytest.approx(loss_sum, rel=1e-5), name
        if spec.parallel.pp == 2:
            continue
        for report in reports:
            torch.testing.assert_close(report["logits"], expected, atol=1e-5, rtol=0, msg=name)
            assert report["sharded"] > 0, name
        counted = {n: tp_local_shape(n, shape, 2, spec.model.family)
                   for n, shape in parameter_shapes(spec.model)}
        tp_shapes = {n: tuple(s) for n, s in reports[0]["local_shapes"].items()}
        # fsdp also splits dim 0 of every tp-local shard: the cost model's tp-local shape, halved
        assert tp_shapes == {n: (-(-shape[0] // 2), *shape[1:]) for n, shape in counted.items()}
