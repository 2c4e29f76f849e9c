"""`plan --search --rank-of OVERRIDES` (launcher.plan.rank_of): a layout's rank among the
search's fitting layouts and the terms that decided it; the search turns loss parallel on
under tp."""
from __future__ import annotations

from conf.compose import compose_config
from conf.resolve import resolve
from launcher.plan.plan_search import neutral_layout, point_overrides, recompute_policies
from launcher.plan.rank_of import rank_of, target_spec
from parallel.cost.search import search
from parallel.cost.step_time import estimate_time
from parallel.cost.plan import make_plan

BASE = ["model=llama3_1b", "cluster=slurm", "cluster.gpu_name=H100", "precision=bf16",
        "training.seq_len=2048", "logging=disabled"]
BATCH = 32


def _search(also_above=None):
    cfg = compose_config(BASE)
    base = resolve(neutral_layout(cfg), host=_host(), check_paths=False)
    return base, search(cfg, base, global_batch_size=BATCH, policies=recompute_policies(),
                        top=3, also_above=also_above)


def _host():
    from launcher.hardware import probe_host
    return probe_host()


def test_the_best_layout_ranks_first_and_a_slower_one_is_counted_exactly():
    base, result = _search()
    best = result.top[0]
    spec = target_spec(BASE, point_overrides(best.candidate), host=base.host,
                       global_batch_size=BATCH)
    assert rank_of(spec, [], result).rank == 1
    slow = ["parallel=fsdp_tp", "parallel.tp=8", "recompute=full",
            "training.micro_batch_size=4"]
    spec = target_spec(BASE, slow, host=base.host, global_batch_size=BATCH)
    tps = estimate_time(spec, make_plan(spec)).tokens_per_s_per_device
    _, full = _search(also_above=tps)
    told = rank_of(spec, slow, full)
    assert told.rank == 1 + sum(t > tps for t in full.predicted_tps) > 3
    assert "slower than #1" in told.why and "compute" in told.why
    assert told.spec.parallel.loss_parallel is False  # not given: the base's value


def test_search_turns_loss_parallel_on_under_tp():
    from collections import Counter

    from parallel.cost.search_space import enumerate_candidates

    cfg = compose_config(BASE)
    base = resolve(neutral_layout(cfg), host=_host(), check_paths=False)
    found = list(enumerate_candidates(cfg, base, global_batch_size=BATCH,
                                      policies=recompute_policies(), rejected=Counter()))
    assert {c.parallel.tp for c in found} >= {1, 2, 8}
    assert all(c.parallel.loss_parallel == (c.parallel.tp > 1) for c in found)
    assert "parallel.loss_parallel=true" in point_overrides(
        next(c for c in found if c.parallel.tp > 1))


def test_a_layout_that_does_not_fit_says_what_it_needs():
    base, result = _search()
    huge = ["parallel=ddp", "recompute=none", "training.micro_batch_size=32",
            "training.grad_accum_steps=1", "cluster.nodes=1"]
    spec = target_spec([*BASE, "training.seq_len=8192"], huge, host=base.host,
                       global_batch_size=8 * 32)
    told = rank_of(spec, huge, result)
    assert told.rank is None and told.why.startswith("does not fit: needs")
    assert "is dropped" in told.line and told.as_json()["fits"] is False


def test_knob_variants_turn_on_only_what_the_base_leaves_off():
    from launcher.plan.knob_refine import COMPILE, FP8, knob_variants
    from tests.support.specs import cpu_spec

    gpu = ["model=llama3_1b", "cluster=slurm", "cluster.gpu_name=H100", "precision=bf16"]
    assert knob_variants(cpu_spec(*gpu)) == [COMPILE, FP8, (*COMPILE, *FP8)]
    assert knob_variants(cpu_spec(*gpu, "training.compile=true")) == [FP8]
    assert knob_variants(cpu_spec("model=debug")) == [COMPILE]  # CPU: no fp8


def test_refinement_adds_no_row_for_a_knob_that_changes_no_prediction():
    """A variant is kept only when the plan predicts it faster or smaller than its layout;
    every row kept beside its layout does, and the ranking stays by tokens/s."""
    from launcher.plan.knob_refine import refine

    base, result = _search()
    refined = refine(result, BASE, base, neutral=neutral_layout,
                     policies=recompute_policies(), top=3)
    by_layout = {id(r.candidate): r for r in result.top}
    for r in refined.top:
        if r.extra:
            plain = by_layout[id(r.candidate)]
            assert (r.prediction.tokens_per_s_per_device
                    > plain.prediction.tokens_per_s_per_device
                    or r.plan.memory.total < plain.plan.memory.total)
    speeds = [r.prediction.tokens_per_s_per_device for r in refined.top]
    assert speeds == sorted(speeds, reverse=True) and len(refined.top) == 3


def test_the_cli_prints_the_rank_in_json_and_refuses_a_bad_layout(capsys):
    import json

    from launcher.cli import main

    argv = ["plan", "--search", *BASE, "--global-batch-tokens", str(BATCH * 2048), "--top", "2",
            "--json", "--rank-of", "parallel=fsdp_tp parallel.tp=2"]
    assert main(argv) == 0
    out = json.loads(capsys.readouterr().out)["rank_of"]
    assert out["overrides"] == ["parallel=fsdp_tp", "parallel.tp=2"] and out["fits"] is True
    assert out["rank"] > 1 and "slower than #1" in out["why"]
    assert main([*argv[:-1], "parallel.tp=3"]) == 2  # 3 does not divide the 8 GPUs
    assert "parallel.tp" in capsys.readouterr().err


def test_a_layout_that_fits_only_with_the_loss_in_row_blocks_gets_them():
    """Qwen2.5 0.5B (152k vocabulary) at 8k tokens on two 24 GB L4s: the logits' transient
    is what does not fit, so the search gives such layouts training.loss_chunks."""
    from dataclasses import replace

    from parallel.cost.search import SEARCH_LOSS_CHUNKS

    over = ["model=qwen2_5_0_5b", "cluster=slurm", "cluster.gpu_name=L4",
            "cluster.gpus_per_node=2", "training.seq_len=8192", "logging=disabled"]
    cfg = compose_config(over)
    base = resolve(neutral_layout(cfg), host=_host(), check_paths=False)
    result = search(cfg, base, global_batch_size=8, policies=recompute_policies(), top=3)
    chunked = [r for r in result.top if r.candidate.loss_chunks]
    assert chunked, [r.why for r in result.top]
    for r in chunked:
        assert r.spec.training.loss_chunks == SEARCH_LOSS_CHUNKS
        assert f"training.loss_chunks={SEARCH_LOSS_CHUNKS}" in point_overrides(r.candidate)
        assert r.plan.verdict.fits and r.plan == make_plan(r.spec)
        whole = replace(r.spec, training=replace(r.spec.training, loss_chunks=1))
        assert make_plan(whole).verdict.fits is False


def test_a_variant_is_the_spec_resolve_gives_for_its_overrides():
    from launcher.plan.knob_refine import COMPILE, FP8, fp8_precision, variant_spec

    base, result = _search()
    fp8 = fp8_precision(BASE, base, neutral_layout)
    for r in result.top:
        knobs = (*COMPILE, *FP8)
        spec = variant_spec(r.spec, knobs, fp8=fp8,
                            recompute=recompute_policies()[r.candidate.recompute_name])
        every = [*BASE, *point_overrides(r.candidate), *knobs,
                 f"training.global_batch_size={BATCH}"]
        assert spec == resolve(compose_config(every), host=base.host, check_paths=False)
