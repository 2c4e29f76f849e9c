"""Tied embeddings (model.tie_embeddings=true: Llama 3.2 1B/3B, Qwen2.5 0.5B-3B) under tensor
and pipeline parallelism (parallel/tied_embeddings.py), proven like every layout
(tests/support/layout_parity.py): after one AdamW update on the same global batch the loss,
every gradient and every parameter equal one process's (fp32, atol 5e-6, rtol 1e-4), and the
plan's static bytes per rank equal what each rank holds: the weight sharded by vocabulary rows
under tp, a copy on the first and on the last stage under pp (none on the stages between).

With pp x tp and loss parallel the schedule runs under torch's loss_parallel (this broke for
untied models too: parallel/pipeline.py `PipelineLoss.context`).

Then a round trip from a tied Llama that transformers made (llama3 RoPE, tie_word_embeddings,
as Llama 3.2): loaded under tp=2 and under pp=2 (each copy is the folder's embed_tokens), one
step, a checkpoint that stores the weight once and loads into one process and into both
pipeline stages, and an export that transformers loads (no lm_head tensor) with the logits of
one process's model after the same step."""
from __future__ import annotations

import json

import pytest
import torch

from conf.run_dir.spec_io import spec_to_dict
from parallel.cost.params import parameter_shapes
from parallel.dims import ParallelDims
from tests.support.layout_parity import ATOL, CPU, RTOL, parity_rank, reference_update
from tests.support.spawn import run_on_ranks
from tests.support.specs import PARITY_LR, cpu_spec, hf_spec
from tests.support.tied_round_trip import tied_round_trip_rank

pytestmark = pytest.mark.distributed

EMBEDDING = "tok_embeddings.weight"
BASE = ("model=tiny", "model.n_layers=4", "model.tie_embeddings=true", "data=synthetic",
        "training.seq_len=32", PARITY_LR, "training.micro_batch_size=2",
        "training.grad_accum_steps=2")
TWO_RANKS = {
    "tied_tp_sp": ["parallel=tp"],
    "tied_tp_loss_parallel": ["parallel=tp", "parallel.sequence_parallel=false",
                              "parallel.loss_parallel=true"],
    "tied_pp_interleaved": ["parallel=pp", "parallel.pp_schedule=interleaved_1f1b",
                            "parallel.pp_virtual_stages=2", "parallel.pp_microbatches=2"],
    "tied_zero3": ["parallel=zero3"],
}
FOUR_RANKS = {
    "tied_pp2_tp2_loss_parallel": ["parallel=pp", "parallel.pp=2", "parallel.tp=2",
                                   "parallel.loss_parallel=true"],
    "tied_pp2_dp2": ["parallel=pp", "parallel.pp=2", "parallel.dp_shard=-1", "parallel.zero=3"],
    "tied_pp4": ["parallel=pp", "training.micro_batch_size=4", "training.grad_accum_steps=1"],
}


def _specs(layouts: dict[str, list[str]], world: int) -> list:
    return [cpu_spec(*BASE, f"cluster.procs_per_node={world}", f"parallel.name={name}", *extra)
            for name, extra in layouts.items()]


def _check_reports(results: list[list[dict]], specs: list) -> None:
    """Every parameter compared somewhere, one loss agreed by all; the tied weight held by
    every rank without a pipeline, else by exactly the first and the last stage's ranks."""
    for index, spec in enumerate(specs):
        rows = [rank_rows[index] for rank_rows in results]
        name = spec.parallel.name
        covered = set().union(*(row["names"] for row in rows))
        assert covered == {n for n, _ in parameter_shapes(spec.model)}, name
        assert len({round(row["loss"], 6) for row in rows}) == 1, name
        dims = ParallelDims.from_spec(spec.parallel)
        holders = [rank for rank, row in enumerate(rows) if EMBEDDING in row["names"]]
        assert holders == [rank for rank in range(dims.world_size)
                           if dims.coordinates(rank)["pp"] in (0, dims.pp - 1)], name


def test_two_rank_tied_layouts_match_one_process(tmp_path):
    specs = _specs(TWO_RANKS, 2)
    results = run_on_ranks(parity_rank, world_size=2, workdir=tmp_path, timeout_s=400,
                           kwargs={"spec_dicts": [spec_to_dict(s) for s in specs]})
    _check_reports(results, specs)


def test_four_rank_tied_layouts_match_one_process(tmp_path):
    specs = _specs(FOUR_RANKS, 4)
    results = run_on_ranks(parity_rank, world_size=4, workdir=tmp_path, timeout_s=600,
                           kwargs={"spec_dicts": [spec_to_dict(s) for s in specs]})
    _check_reports(results, specs)
    pp4 = [row for rank_rows in results for row in rank_rows
           if row["layout"] == "tied_pp4"]
    assert [EMBEDDING in row["names"] for row in pp4] == [True, False, False, True]


# --- the round trip: Hugging Face in, checkpoint, Hugging Face out ----------------------------

ROUND_TRIP = {"tp": ["parallel=tp"], "pp": ["parallel=pp"]}


@pytest.fixture(scope="module")
def round_trip(tmp_path_factory):
    """The tied folder, the two specs, the one-process reference and every rank's reports
    from one 2-rank spawn."""
    from tests.support.hf_models import make_llama

    root = tmp_path_factory.mktemp("tied_round_trip")
    make_llama(root / "hf", tied=True)
    specs = {name: hf_spec(root / "hf", "cluster.procs_per_node=2", PARITY_LR,
                           "training.micro_batch_size=2", f"parallel.name=tied_{name}", *extra)
             for name, extra in ROUND_TRIP.items()}
    assert all(s.model.tie_embeddings for s in specs.values())
    (root / "out").mkdir()  # saves never create parents (a removed run dir stays removed)
    results = run_on_ranks(tied_round_trip_rank, world_size=2, workdir=root, timeout_s=400,
                           kwargs={"spec_dicts": {n: spec_to_dict(s) for n, s in specs.items()},
                                   "root": str(root / "out")})
    _, _, reference = reference_update(specs["tp"])  # the same global batch in one process
    return root / "out", specs, reference, results


def _saved(results: list[dict], name: str) -> dict[str, torch.Tensor]:
    """The layout's weights after its step, by name, merged over the ranks."""
    return {n: t for rank in results for n, t in rank[name]["params"].items()}


def test_both_layouts_step_as_one_process(round_trip):
    _, specs, reference, results = round_trip
    for name in specs:
        for param_name, tensor in _saved(results, name).items():
            torch.testing.assert_close(tensor, reference[param_name], atol=ATOL, rtol=RTOL,
                                       msg=lambda m, n=param_name: f"{name} {n}: {m}")
    pp_holders = [EMBEDDING in rank["pp"]["params"] for rank in results]
    assert pp_holders == [True, True]  # first stage and last stage
    first, last = (rank["pp"]["params"][EMBEDDING] for rank in results)
    assert torch.equal(first, last)  # the copies stay identical


def test_the_checkpoint_stores_the_tied_weight_once(round_trip):
    from torch.distributed.checkpoint import FileSystemReader

    _, specs, _, results = round_trip
    for name in specs:
        metadata = FileSystemReader(str(results[0][name]["checkpoint"])).read_metadata()
        for key in (f"model.{EMBEDDING}", f"optimizer.state.{EMBEDDING}.exp_avg"):
            tensor = metadata.state_dict_metadata[key]
            stored = [info.length for index, info in metadata.storage_data.items()
                      if index.fqn == key]
            assert len(stored) == len(tensor.chunks), (name, key)  # each chunk written once
            assert sum(c.sizes.numel() for c in tensor.chunks) == tensor.size.numel(), key


def test_the_checkpoint_loads_in_one_process_and_into_both_stages(round_trip):
    from training.checkpoint import load_checkpoint
    from training.hf_import import load_hf_model
    from training.optim import build_optimizer

    _, specs, _, results = round_trip
    for name, spec in specs.items():
        model = load_hf_model(spec.model.path, spec.model)
        optimizer = build_optimizer(model, optim=spec.optim)
        load_checkpoint(results[0][name]["checkpoint"], model=model, optimizer=optimizer,
                        degrees={"world_size": 1}, allow_reshard=True)
        saved = _saved(results, name)
        for param_name, param in model.named_parameters():
            assert torch.equal(param.detach(), saved[param_name]), (name, param_name)
    tp_saved = _saved(results, "tp")
    for rank in results:  # the tp checkpoint under pp: each stage's copy is the saved weight
        assert EMBEDDING in rank["loaded"]
        for param_name, tensor in rank["loaded"].items():
            assert torch.equal(tensor, tp_saved[param_name]), param_name


def test_the_export_loads_in_transformers_with_one_process_logits(round_trip):
    from safetensors import safe_open

    from tests.support.hf_models import hf_logits, tokens
    from training.model_builder import build_model

    transformers = pytest.importorskip("transformers")
    out, specs, reference, _ = round_trip
    model = build_model(specs["tp"].model, device=CPU, seed=0)
    model.load_state_dict(reference)
    ids = tokens()
    with torch.no_grad():
        expected = model(ids)
    for name in specs:
        folder = out / name / "export"
        with safe_open(str(folder / "model.safetensors"), framework="pt") as f:
            keys = set(f.keys())
        assert "lm_head.weight" not in keys and "model.embed_tokens.weight" in keys, name
        assert json.loads((folder / "config.json").read_text())["tie_word_embeddings"] is True
        hf = transformers.AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32)
        assert type(hf).__name__ == "LlamaForCausalLM"
        assert hf.lm_head.weight.data_ptr() == hf.model.embed_tokens.weight.data_ptr()
        torch.testing.assert_close(hf_logits(hf.eval(), ids), expected, atol=1e-5, rtol=0,
                                   msg=lambda m, n=name: f"{n}: {m}")
