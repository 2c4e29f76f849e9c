"""`meshrun plan --search` (parallel/cost/search*.py, launcher/plan/plan_search.py): the candidates
are exactly the layouts resolve() accepts in the search's domain, each costed as `meshrun
plan` costs it, ranked by predicted tokens/s; the sweep file it writes validates with its
best point first; bad input exits 2; no torch."""
from __future__ import annotations

import json
import subprocess
import sys
from collections import Counter
from dataclasses import replace
from pathlib import Path

import pytest

from conf.compose import compose_config
from conf.errors import ConfigError
from conf.resolve import resolve
from conf.rules.field_rules import divisors
from conf.schema import RecomputeConfig, RecomputeMode
from conf.degrees import DEGREES
from conf.spec import HostSpec, RecomputeSpec, spec_from_config
from launcher.cli import main
from launcher.plan.plan_search import neutral_layout, recompute_policies
from parallel.cost.memory import LayoutMemory, estimate_memory
from parallel.cost.search import FALLBACK_BASIS, SEARCH_LOSS_CHUNKS, search
from parallel.cost.search_space import (
    MIN_CP_TOKENS, enumerate_candidates, factorizations, pipeline_shapes,
)

REPO = Path(__file__).resolve().parents[2]
CLUSTER = ["cluster=slurm", "cluster.nodes=1", "cluster.gpus_per_node=8", "cluster.gpu_name=H100",
           "cluster.gpu_compute_capability=9.0", "data=synthetic"]
SMALL = ["model=debug", "model.max_seq_len=4096", "training.seq_len=4096", *CLUSTER]
HOST = HostSpec(gpu_name="", gpu_count=0, compute_capability=0.0, cpu_count=2)
POLICIES = {"none": RecomputeConfig(), "full": RecomputeConfig(mode=RecomputeMode.full)}


def _base(overrides):
    cfg = compose_config(overrides)
    return cfg, resolve(neutral_layout(cfg), host=HOST, check_paths=False)


def _key(parallel, micro, accum, recompute):
    return (*(getattr(parallel, n) for n in DEGREES), parallel.zero, parallel.sequence_parallel,
            parallel.loss_parallel, parallel.pp_schedule, parallel.pp_virtual_stages, parallel.pp_microbatches, micro,
            accum, recompute)


def _brute_force(cfg, base, global_batch_size):
    """Every point of the search's domain put through resolve() itself."""
    accepted = {}
    for degrees in factorizations(base.world_size, len(DEGREES)):
        given = dict(zip(DEGREES, degrees))
        if given["cp"] > 1 and base.training.seq_len < given["cp"] * MIN_CP_TOKENS:
            continue
        dp = given["dp_replicate"] * given["dp_shard"]
        per_rank = max(global_batch_size // dp, 1)
        for zero in range(4):
            for schedule, virtual in pipeline_shapes(given["pp"], cfg.parallel.pp_schedule):
                for micro in ([per_rank] if given["pp"] > 1 else divisors(per_rank)):
                    for name, policy in POLICIES.items():
                        point = replace(cfg, recompute=policy, parallel=replace(
                            cfg.parallel, **given, zero=zero, pp_schedule=schedule,
                            pp_virtual_stages=virtual, pp_layer_split=[],
                            sequence_parallel=given["tp"] > 1 or cfg.parallel.sequence_parallel,
                            loss_parallel=given["tp"] > 1 or cfg.parallel.loss_parallel,
                            pp_microbatches=micro if given["pp"] > 1 else -1),
                            training=replace(cfg.training, micro_batch_size=micro,
                                             grad_accum_steps=-1,
                                             global_batch_size=global_batch_size))
                        try:
                            spec = resolve(point, host=HOST, check_paths=False)
                        except ConfigError:
                            continue
                        t = spec.training
                        accepted[_key(spec.parallel, t.micro_batch_size, t.grad_accum_steps,
                                      name)] = spec
    return accepted


def test_candidates_are_exactly_what_resolve_accepts_and_resolve_to_the_same_spec():
    cfg, base = _base(SMALL)
    expected = _brute_force(cfg, base, global_batch_size=16)
    found = {_key(c.parallel, c.micro_batch_size, c.grad_accum_steps, c.recompute_name): c
             for c in enumerate_candidates(cfg, base, global_batch_size=16, policies=POLICIES,
                                           rejected=Counter())}
    assert len(expected) > 100  # pp, tp, cp, zero and batch choices all occur
    assert {k[:5] for k in expected} >= {(1, 1, 2, 2, 2), (1, 2, 1, 2, 2), (2, 4, 1, 1, 1)}
    assert set(found) == set(expected)
    for key, candidate in found.items():
        spec = candidate.spec(base)
        assert (spec.parallel, spec.training, spec.recompute) == (
            expected[key].parallel, expected[key].training, expected[key].recompute), key


def test_memory_of_every_candidate_is_what_the_plan_estimates():
    cfg, base = _base(["model=llama3_1b", "training.seq_len=2048", *CLUSTER])
    candidates = list(enumerate_candidates(cfg, base, global_batch_size=32,
                                           policies=POLICIES, rejected=Counter()))
    assert len(candidates) > 50
    for candidate in candidates[::23]:  # tied: tp and pp candidates too (482 of them)
        spec = candidate.spec(base)
        layout = LayoutMemory(model=base.model, parallel=candidate.parallel,
                              training=spec.training, precision=base.precision,
                              recompute=candidate.recompute,
                              document_mask=base.data.document_mask)  # as search() asks it
        assert layout.fullest() == estimate_memory(spec), candidate


def test_ranking_drops_what_does_not_fit_and_orders_by_predicted_tokens_per_s():
    cfg, base = _base(["model=llama3_8b", "training.seq_len=8192", *CLUSTER])
    result = search(cfg, base, global_batch_size=16, policies=POLICIES, top=400)
    assert result.does_not_fit > 0 and result.fits > 0
    assert result.fits + result.does_not_fit == result.enumerated
    assert len(result.top) == min(400, result.fits)
    for ranked in result.top:
        assert ranked.plan.verdict.fits is True
        assert ranked.plan.memory == estimate_memory(ranked.spec)
    keys = [(-r.prediction.tokens_per_s_per_device, r.plan.memory.total) for r in result.top]
    assert keys == sorted(keys)
    candidates = list(enumerate_candidates(cfg, base, global_batch_size=16, policies=POLICIES,
                                           rejected=Counter()))
    totals = [estimate_memory(c.spec(base)).total for c in candidates]
    chunked = [estimate_memory(c.with_loss_chunks(SEARCH_LOSS_CHUNKS).spec(base)).total
               if c.parallel.tp == c.parallel.pp == 1 else total  # the head in row blocks
               for c, total in zip(candidates, totals)]
    misfits = [total for total, rows in zip(totals, chunked)
               if total > result.usable_bytes and rows > result.usable_bytes]
    assert len(misfits) == result.does_not_fit
    assert min(misfits) == \
        result.smallest_misfit_bytes


def test_recompute_policies_are_the_group_options():
    policies = recompute_policies()
    assert {"none", "full", "selective", "full_every2", "offload"} <= set(policies)
    assert policies["full_every2"].every_n_layers == 2


def test_json_keys_and_the_sweep_file_validates_with_the_best_point_first(tmp_path, capsys):
    sweep = tmp_path / "best.yaml"
    argv = ["plan", "--search", "--json", "--top", "3", "--global-batch-tokens", "65536",
            "--write-sweep", str(sweep), "model=debug", "training.seq_len=1024", *CLUSTER]
    assert main(argv) == 0
    out = json.loads(capsys.readouterr().out)
    assert set(out) >= {"schema", "model", "world_size", "global_batch_tokens", "counts",
                        "dropped", "time_basis", "top"}
    assert out["global_batch_size"] == 64 and len(out["top"]) == 3
    assert set(out["top"][0]) == {"rank", "overrides", "layout", "memory_bytes", "fits",
                                  "margin_bytes", "step_s", "tokens_per_s_per_device", "mfu",
                                  "why", "knobs"}
    assert main(["sweep", "-f", str(sweep), "--dry-run"]) == 0
    from sweeps.expand import expand
    from sweeps.spec_file import load_sweep_file

    points = expand(load_sweep_file(sweep))
    assert len(points) == 3
    for point, ranked in zip(points, out["top"]):  # in rank order: the best first
        spec = resolve(compose_config(list(point.overrides)), host=HOST, check_paths=False)
        layout = dict(ranked["layout"])
        policy = recompute_policies()[layout.pop("recompute")]
        training = {n: layout.pop(n) for n in TRAINING_KEYS}
        assert {n: getattr(spec.parallel, n) for n in layout} == layout
        assert {n: getattr(spec.training, n) for n in TRAINING_KEYS} == training
        assert spec.training.global_batch_size * spec.training.seq_len == 65536
        assert spec.recompute == spec_from_config(RecomputeSpec, policy)
        assert estimate_memory(spec).total == ranked["memory_bytes"]


TRAINING_KEYS = ("micro_batch_size", "grad_accum_steps")


@pytest.mark.parametrize("extra, key", [
    (["--global-batch-tokens", "1000"], "--global-batch-tokens"),
    ([], "--global-batch-tokens"),
    (["--top", "0", "--global-batch-tokens", "65536"], "--top"),
])
def test_bad_input_exits_2_naming_key_and_fix(extra, key, capsys):
    assert main(["plan", "--search", *extra, "model=debug", "training.seq_len=1024",
                 *CLUSTER]) == 2
    err = capsys.readouterr()
    assert key in err.err + err.out and "Traceback" not in err.err


def test_the_search_imports_no_torch():
    code = ("import sys; from launcher.cli import main; "
            "rc = main(['plan', '--search', '--top', '2', '--global-batch-tokens', '65536', "
            f"*{['model=debug', 'training.seq_len=1024', *CLUSTER]!r}]); "
            "print('TORCH' if 'torch' in sys.modules else 'NO-TORCH', rc)")
    out = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True,
                         text=True, check=True).stdout
    assert out.strip().endswith("NO-TORCH 0")


def test_without_a_time_model_the_ranking_says_so_and_drops_nothing():
    """A GPU the catalogue does not know: estimate_time has no answer and there is no memory
    verdict; the fallback is labelled, and every layout the rules accept is kept."""
    unknown = [o if not o.startswith("cluster.gpu_name=") else "cluster.gpu_name=Mystery X1"
               for o in CLUSTER]
    cfg, base = _base(["model=debug", "training.seq_len=128", *unknown])
    result = search(cfg, base, global_batch_size=8, policies=POLICIES, top=3)
    assert base.training.device == "cuda" and result.basis == FALLBACK_BASIS
    assert result.does_not_fit == 0 and result.fits == result.enumerated > 0
    assert all(r.prediction.step_s is None for r in result.top)
    assert "no time model" in result.top[1].why
