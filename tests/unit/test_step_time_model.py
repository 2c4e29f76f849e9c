"""The step-time model's formulas (parallel/cost/comm.py, step_time.py) and its calibration
(parallel/cost/calibrate.py, `meshrun plan --calibrate`). Torch-free."""
from __future__ import annotations

import dataclasses
import json
from functools import lru_cache

import pytest

from conf.errors import ConfigError
from conf.run_dir.spec_io import write_spec
from parallel.cost.calibrate import Sample, calibrate, fit_compute, fit_link, predict
from parallel.cost.calibrate_store import CONSTANTS, SCHEMA, load_entry
from parallel.cost.comm import Collective, Link, axis_is_intra_node, collective_s, exposed_s
from parallel.cost.plan import make_plan
from parallel.cost.params import parameter_shapes
from parallel.cost.step_time import (bubble_factor, core_share, estimate_time, hardware_of,
                                     optimizer_tensors, recompute_flops_per_token, step_parts)
from tests.support.run_outputs import written_run_dir
from tests.support.specs import cpu_spec

SMALL = ("model=tiny", "model.n_layers=4", "data=synthetic", "training.seq_len=64",
         "training.global_batch_size=8", "training.micro_batch_size=2",
         "training.grad_accum_steps=-1")
GPU = ("model=llama3_8b", "cluster=slurm", "cluster.gpu_name=H100", "training.device=cuda",
       "parallel=fsdp", "precision=bf16", "training.seq_len=8192", "training.micro_batch_size=1",
       "training.grad_accum_steps=1", "cluster.calibration=none")


@lru_cache(maxsize=None)
def spec(*overrides: str):
    return cpu_spec(*overrides)


def small(*overrides: str, ranks: int = 2):
    return spec(*SMALL, *overrides, f"cluster.procs_per_node={ranks}", "cluster.calibration=none")


# --- ring volumes and link choice ----------------------------------------------------------

def test_ring_formulas():
    """all-gather/reduce-scatter (n-1)/n V/B + (n-1) alpha; all-reduce twice that; p2p V/B +
    alpha; a framed (not bare) call adds the call overhead once. (Mutations tried: all-reduce
    with one pass instead of two -> fails; the call overhead charged to bare calls -> fails.)"""
    bw = Link(name="x", gbps=1.0, latency_s=0.0)
    volume = 8e9
    assert collective_s("all_gather", n=4, size_bytes=volume, link=bw) == pytest.approx(6.0)
    assert collective_s("reduce_scatter", n=4, size_bytes=volume, link=bw) == pytest.approx(6.0)
    assert collective_s("all_reduce", n=4, size_bytes=volume, link=bw) == pytest.approx(12.0)
    assert collective_s("p2p", n=2, size_bytes=volume, link=bw) == pytest.approx(8.0)
    call = Link(name="x", gbps=1.0, latency_s=0.0, call_overhead_s=0.5)
    framed = Collective(axis="fsdp", op="all_gather", group=4, size_bytes=volume, calls=3,
                        link=call, why="")
    assert framed.seconds == pytest.approx(3 * (6.0 + 0.5))
    assert dataclasses.replace(framed, bare=True).seconds == pytest.approx(3 * 6.0)
    lat = Link(name="x", gbps=1e30, latency_s=1.0)
    assert collective_s("all_gather", n=4, size_bytes=volume, link=lat) == pytest.approx(3.0)
    assert collective_s("all_reduce", n=4, size_bytes=volume, link=lat) == pytest.approx(6.0)
    assert collective_s("all_reduce", n=1, size_bytes=volume, link=lat) == 0.0


@pytest.mark.parametrize(("degrees", "axes", "per_node", "intra"), [
    ({"pp": 1, "dp_replicate": 1, "dp_shard": 8, "cp": 1, "tp": 1}, ("dp_shard",), 8, True),
    ({"pp": 1, "dp_replicate": 1, "dp_shard": 16, "cp": 1, "tp": 1}, ("dp_shard",), 8, False),
    ({"pp": 2, "dp_replicate": 1, "dp_shard": 4, "cp": 1, "tp": 2}, ("tp",), 8, True),
    ({"pp": 2, "dp_replicate": 1, "dp_shard": 4, "cp": 1, "tp": 2}, ("dp_shard",), 8, True),
    ({"pp": 2, "dp_replicate": 1, "dp_shard": 4, "cp": 1, "tp": 2}, ("pp",), 8, False),
    ({"pp": 1, "dp_replicate": 4, "dp_shard": 8, "cp": 1, "tp": 1}, ("dp_replicate",), 8, False),
    ({"pp": 1, "dp_replicate": 1, "dp_shard": 2, "cp": 1, "tp": 4}, ("dp_shard",), 4, False),
])
def test_the_link_of_an_axis_follows_the_mesh_order(degrees, axes, per_node, intra):
    """A group spans stride x size consecutive ranks (tp fastest). (Mutation tried: ignoring
    the stride -> the pp and dp_shard-behind-tp=4 cases fail.)"""
    assert axis_is_intra_node(degrees, axes, per_node) is intra


def test_fsdp_over_nodes_uses_infiniband_and_zero_stages_differ():
    one_node = estimate_time(spec(*GPU), make_plan(spec(*GPU)))
    two = spec(*GPU, "cluster.nodes=2")
    two_nodes = estimate_time(two, make_plan(two))
    assert {c.link.name for c in one_node.collectives} == {"intra-node"}
    assert {c.link.name for c in two_nodes.collectives} == {"inter-node"}
    gathers = {z: next(c.calls for c in estimate_time(s, make_plan(s)).collectives
                       if c.op == "all_gather")
               for z, s in ((3, spec(*GPU)), (2, spec(*GPU, "parallel.zero=2")))}
    assert not spec(*GPU).model.tie_embeddings
    units = spec(*GPU).model.n_layers + 2  # every block, the embedding, norm + head
    # zero 3 gathers again in backward, but the head unit (never re-sharded after forward)
    assert gathers == {3: 2 * units - 1, 2: units}


def _calls(s) -> dict[tuple[str, str], int]:
    out: dict[tuple[str, str], int] = {}
    for c in estimate_time(s, make_plan(s)).collectives:
        out[c.axis, c.op] = out.get((c.axis, c.op), 0) + c.calls
    return out


def test_fsdp_reduces_once_a_step_and_gathers_every_micro_batch():
    """The loop syncs gradients on the step's last micro-batch only (gradient_sync), so with
    4 micro-batches zero 3 gathers each unit 2 x 4 times and reduce-scatters it once; HSDP's
    replica all-reduce follows the reduce-scatter. (Mutation tried: reduce-scatter per
    micro-batch -> fails.)"""
    z3 = small("parallel=zero3", "training.global_batch_size=16")
    units = 4 + (1 if z3.model.tie_embeddings else 2)
    assert z3.training.grad_accum_steps == 4
    calls = _calls(z3)
    assert calls[("fsdp", "all_gather")] == (2 * units - 1) * 4
    assert calls[("fsdp", "reduce_scatter")] == units
    hsdp = _calls(small("parallel=hsdp", "training.global_batch_size=16", ranks=4))
    assert hsdp[("hsdp", "all_reduce")] == hsdp[("fsdp", "reduce_scatter")] == units


def test_context_parallel_moves_k_and_v_in_separate_calls():
    """Per block and micro-batch: K and V gathered, their gradients reduce-scattered, one call
    each; the bookkeeping all-reduces (token count, gradient norm) are there once a step.
    (Mutation tried: one call for K and V together -> fails.)"""
    s = small("parallel=cp")
    micro = s.training.grad_accum_steps
    calls = _calls(s)
    assert calls[("cp", "all_gather")] == calls[("cp", "reduce_scatter")] == 2 * 4 * micro
    assert calls[("step", "all_reduce")] == 1  # the token count (no axis splits parameters)
    assert _calls(small("parallel=zero3"))[("step", "all_reduce")] == 2  # + the norm's sum


# --- bubble, overlap, recompute, cores ----------------------------------------------------

@pytest.mark.parametrize(("schedule", "virtual", "expected"), [
    ("gpipe", 1, 3 / 4), ("1f1b", 1, 3 / 4), ("interleaved_1f1b", 2, 3 / 8)])
def test_bubble_by_schedule(schedule, virtual, expected):
    """(pp-1)/(v m): m = 4 micro-batches over pp = 4. (Mutation tried: dropping /v -> the
    interleaved case fails.)"""
    s = spec(*SMALL, "parallel=pp", "parallel.pp=4", f"parallel.pp_schedule={schedule}",
             f"parallel.pp_virtual_stages={virtual}", "parallel.pp_microbatches=4",
             "cluster.procs_per_node=4", "model.n_layers=8", "training.micro_batch_size=4")
    assert bubble_factor(s) == pytest.approx(expected)
    assert bubble_factor(small("parallel=single", ranks=1)) == 0.0


def _fake(axis: str, seconds: float) -> Collective:
    link = Link(name="intra-node", gbps=1.0, latency_s=0.0)
    return Collective(axis=axis, op="p2p", group=2, size_bytes=seconds * 1e9, calls=1,
                      link=link, why="")


def test_overlap_rule():
    """Data-parallel traffic hides under compute except 1/L of it; TP is exposed; no overlap
    on CPU. (Mutation tried: not adding the first/last block's share -> fails.)"""
    fsdp, tp = _fake("fsdp", 8.0), _fake("tp", 1.0)
    assert exposed_s([fsdp, tp], compute_s=100.0, layers=4, overlaps=True) == pytest.approx(3.0)
    assert exposed_s([fsdp], compute_s=2.0, layers=4, overlaps=True) == pytest.approx(6.0)
    assert exposed_s([fsdp, tp], compute_s=100.0, layers=4, overlaps=False) == pytest.approx(9.0)


def test_full_recompute_reruns_each_block_forward():
    """Full recompute re-runs 2 x block parameters + the attention core per token per layer;
    every 2nd layer halves it; ops re-runs no matmul. (Mutation tried: counting forward +
    backward (x3) -> fails.)"""
    s = small("parallel=single", "recompute=full", ranks=1)
    m = s.model
    q, kv = m.n_heads * m.head_dim, m.n_kv_heads * m.head_dim
    block = 2 * (2 * m.dim * q + 2 * m.dim * kv + 3 * m.dim * m.ffn_dim) + 4 * q * 64
    assert recompute_flops_per_token(s) == pytest.approx(m.n_layers * block)
    every2 = small("parallel=single", "recompute=full", "recompute.every_n_layers=2", ranks=1)
    assert recompute_flops_per_token(every2) == pytest.approx(m.n_layers * block / 2)
    assert recompute_flops_per_token(small("parallel=single", "recompute=selective",
                                           ranks=1)) == 0


def test_ranks_beyond_the_cores_share_them():
    """8 ranks on 2 cores: each gets a quarter core, so the step's compute is what 2 ranks on
    the 2 cores take, not a quarter of it. (Mutation tried: core_share = 1 -> fails.)"""
    two, eight = small("parallel=ddp", ranks=2), small("parallel=3d", ranks=8)
    assert hardware_of(two).core_share == 1.0 and hardware_of(eight).core_share == 0.25
    c2 = estimate_time(two, make_plan(two)).breakdown.compute_s
    c8 = estimate_time(eight, make_plan(eight)).breakdown.compute_s
    assert c8 == pytest.approx(c2)


def test_core_share_and_the_collectives_of_ranks_that_share_cores():
    """N ranks on C < N cores each get C / N of a core; a CPU collective's every term
    (bandwidth, alpha, call overhead) stretches by N / C. (Mutations tried: core share
    max(1, C/N) -> fails; the call overhead not stretched -> fails.)"""
    assert core_share(cpu_count=2, ranks=8) == 0.25
    assert core_share(cpu_count=2, ranks=1) == 1.0
    assert core_share(cpu_count=4, ranks=3) == 1.0
    knob = ("cluster.collective_overhead_us=1000", "cluster.intra_node_latency_us=40",
            "cluster.intra_node_gbps=2")
    one = hardware_of(small("parallel=ddp", *knob, ranks=2))
    four = hardware_of(small("parallel=3d", *knob, ranks=8))
    assert one.intra.call_overhead_s == pytest.approx(1e-3)
    assert four.intra.call_overhead_s == pytest.approx(4e-3)
    assert four.intra.latency_s == pytest.approx(160e-6)
    assert four.intra.gbps == pytest.approx(0.5)


# --- overrides and the calibration file ---------------------------------------------------

def test_cluster_knobs_override_the_catalogue_and_the_calibration(tmp_path):
    base = hardware_of(spec(*GPU))
    assert base.intra.gbps == 450.0 and base.sources["intra_node_gbps"] == "catalogue"
    assert base.peak.flops == 989e12
    path = tmp_path / "cal.json"
    path.write_text(json.dumps({"schema": SCHEMA, "devices": {"H100": {
        "matmul_efficiency": 0.3, "intra_node_gbps": 200.0}}}))
    calibrated = spec(*GPU[:-1], f"cluster.calibration={path}")
    hw = hardware_of(calibrated)
    assert (hw.matmul_efficiency, hw.intra.gbps) == (0.3, 200.0)
    assert hw.sources["matmul_efficiency"] == "calibration"
    knob = spec(*GPU[:-1], f"cluster.calibration={path}", "cluster.intra_node_gbps=100",
                "cluster.peak_tflops=500", "cluster.matmul_efficiency=0.6")
    hw = hardware_of(knob)
    assert (hw.intra.gbps, hw.peak.flops, hw.matmul_efficiency) == (100.0, 500e12, 0.6)
    assert hw.sources["intra_node_gbps"] == "cluster"
    slow = estimate_time(knob, make_plan(knob)).step_s
    assert slow > estimate_time(spec(*GPU), make_plan(spec(*GPU))).step_s


def test_bad_knobs_and_files_are_named():
    with pytest.raises(ConfigError, match="cluster.inter_node_gbps=-1"):
        cpu_spec(*GPU, "cluster.inter_node_gbps=-1")
    with pytest.raises(ConfigError, match="cluster.matmul_efficiency=1.5"):
        cpu_spec(*GPU, "cluster.matmul_efficiency=1.5")
    with pytest.raises(ConfigError, match="cluster.calibration=/nonexistent.json"):
        load_entry(spec(*GPU[:-1], "cluster.calibration=/nonexistent.json"))


def test_the_optimizer_pays_per_parameter_tensor_it_steps():
    """optimizer_s = (AdamW bytes / HBM + tensors stepped x update_overhead) / core share:
    every tensor of the model under ddp, about half of them under zero 1 over 2 ranks (the
    owner with the most), a pipeline stage's under pp. This is what single, ddp and zero1 on
    a CPU differ by beyond the matmuls: each ddp rank runs the whole update with half the
    micro-batches. (Mutations tried: the per-tensor term dropped -> fails; zero 1 counted
    with every tensor -> fails.)"""
    ddp, zero1, pp = (small(f"parallel={name}") for name in ("ddp", "zero1", "pp"))
    everything = len(parameter_shapes(ddp.model))
    assert optimizer_tensors(ddp) == everything
    assert everything / 2 <= optimizer_tensors(zero1) < everything
    assert optimizer_tensors(pp) < everything
    for s in (ddp, zero1, pp):
        plan = make_plan(s)
        assert hardware_of(s, calibration={}).update_overhead_s == pytest.approx(34e-6)
        hw = dataclasses.replace(hardware_of(s, calibration={}), update_overhead_s=0.0)
        per_tensor = dataclasses.replace(hw, update_overhead_s=1e-3)
        extra = step_parts(s, plan, per_tensor).optimizer_s - step_parts(s, plan, hw).optimizer_s
        assert extra == pytest.approx(optimizer_tensors(s) * 1e-3 / hw.core_share)
        assert estimate_time(s, plan, hardware=per_tensor).step_s - estimate_time(
            s, plan, hardware=hw).step_s == pytest.approx(extra)


# --- the fit ------------------------------------------------------------------------------

TRUTH = {"matmul_efficiency": 0.37, "layer_overhead_us": 900.0, "tp_overhead_us": 2500.0,
         "collective_overhead_us": 1500.0, "update_overhead_us": 40.0, "intra_node_gbps": 1.5,
         "intra_node_latency_us": 80.0}
LAYOUTS = (("parallel=single",), ("parallel=ddp",), ("parallel=zero3",), ("parallel=tp",),
           ("parallel=pp",), ("parallel=3d",), ("parallel=zero1",))


def _samples():
    out = []
    for overrides in LAYOUTS:
        ranks = 1 if overrides == ("parallel=single",) else 8 if overrides == ("parallel=3d",) \
            else 2
        s = small(*overrides, ranks=ranks)
        out.append(Sample(name=overrides[0], spec=s, measured_s=predict(s, TRUTH)))
    return out


def test_the_fit_recovers_known_constants():
    """Runs made by the model with TRUTH give TRUTH back. (Mutations tried: leaving the
    bubble out of the features -> the pipeline runs pull the fit off, fails; counting the
    collective calls without the core share -> the 8-rank run pulls it off, fails; the
    optimizer's time left out of the fixed part C -> fails.)"""
    links = {k: TRUTH[k] for k in ("intra_node_gbps", "intra_node_latency_us",
                                   "update_overhead_us")}
    fitted = fit_compute(_samples(), base=links)
    assert fitted["matmul_efficiency"] == pytest.approx(0.37, rel=1e-6)
    assert fitted["layer_overhead_us"] == pytest.approx(900.0, rel=1e-6)
    assert fitted["tp_overhead_us"] == pytest.approx(2500.0, rel=1e-6)
    assert fitted["collective_overhead_us"] == pytest.approx(1500.0, rel=1e-6)
    assert "update_overhead_us" not in fitted  # measured, not fitted (calibrate.py)


def test_the_fit_sets_an_overhead_the_runs_cannot_see_to_zero():
    """No tp run: the tp overhead is not identifiable and comes out 0, the rest exact."""
    no_tp = [s for s in _samples() if s.spec.parallel.tp == 1]
    links = {k: TRUTH[k] for k in ("intra_node_gbps", "intra_node_latency_us",
                                   "update_overhead_us")}
    fitted = fit_compute(no_tp, base=links)
    assert fitted["tp_overhead_us"] == 0.0
    assert fitted["matmul_efficiency"] == pytest.approx(0.37, rel=1e-6)


def test_the_link_fit_recovers_alpha_and_beta():
    n, gbps, alpha = 4, 3.0, 40e-6
    rows = [{"size_bytes": s, "time_ms": 1e3 * (2 * (n - 1) * alpha
                                                  + 2 * (n - 1) / n * s / (gbps * 1e9))}
            for s in (4096, 65536, 1 << 20, 16 << 20)]
    got_gbps, got_us = fit_link(rows, world_size=n)
    assert got_gbps == pytest.approx(gbps, rel=1e-6) and got_us == pytest.approx(40.0, rel=1e-6)
    report = {"world_size": n, "bandwidth": rows, "ranks_by_host": {"a": [0, 1], "b": [2, 3]}}
    result = calibrate(_samples()[:2], preflights=[report])
    assert result.constants["inter_node_gbps"] == pytest.approx(gbps, rel=1e-6)


# --- the command --------------------------------------------------------------------------

def _run_dir(root, name, s, step_s):
    rows = [{"kind": "train", "step": i, "step_time_s": step_s} for i in range(1, 8)]
    return written_run_dir(root, name, s, rows)


def test_calibrate_command_fits_stores_and_later_plans_use_it(tmp_path, capsys):
    from launcher.cli import main

    dirs = [_run_dir(tmp_path, s.name, s.spec, s.measured_s) for s in _samples()[:4]]
    out = tmp_path / "cal.json"
    code = main(["plan", "--calibration-out", str(out), "--calibrate", *map(str, dirs)])
    assert code == 0
    printed = capsys.readouterr().out
    assert "median absolute error" in printed and "parallel=ddp" in printed
    entry = json.loads(out.read_text())["devices"]["CPU core"]
    assert set(CONSTANTS) >= {k for k in entry if k not in ("runs", "median_abs_error")}
    later = dataclasses.replace(small("parallel=ddp"), cluster=dataclasses.replace(
        small("parallel=ddp").cluster, calibration=str(out)))
    assert hardware_of(later).matmul_efficiency == pytest.approx(entry["matmul_efficiency"])


def test_calibrate_command_rejects_bad_input_with_exit_2(tmp_path, capsys):
    from launcher.cli import main

    assert main(["plan", "--calibrate", str(tmp_path / "missing")]) == 2
    empty = tmp_path / "empty"
    empty.mkdir()
    write_spec(small("parallel=ddp"), empty / "spec.json")
    out = tmp_path / "cal.json"
    assert main(["plan", "--calibration-out", str(out), "--calibrate", str(empty)]) == 2
    err = capsys.readouterr().err
    assert "--calibrate" in err and "Traceback" not in err and not out.exists()


def test_calibrate_refuses_runs_whose_step_times_are_not_finite(tmp_path, capsys):
    """NaN, inf, 0 and negative step times are no measurement: a run of only those gives
    nothing to fit (exit 2, no file), and mixed in they are left out of the median."""
    from launcher.cli import main

    bad = _run_dir(tmp_path, "nan-times", small("parallel=ddp"), float("nan"))
    rows = [{"kind": "train", "step": i, "step_time_s": v}
            for i, v in enumerate([float("inf"), 0.0, -1.0, float("nan")], start=1)]
    (bad / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    out = tmp_path / "cal.json"
    assert main(["plan", "--calibration-out", str(out), "--calibrate", str(bad)]) == 2
    err = capsys.readouterr().err
    assert "finite, positive step_time_s" in err and "Traceback" not in err
    assert not out.exists()
    mixed = _run_dir(tmp_path, "mixed", small("parallel=ddp"), 0.25)
    with (mixed / "metrics.jsonl").open("a") as f:
        f.write(json.dumps({"kind": "train", "step": 9, "step_time_s": float("nan")}) + "\n")
    from parallel.cost.calibrate import read_run
    assert read_run(mixed).measured_s == pytest.approx(0.25)


def test_a_calibration_file_holding_nan_is_refused(tmp_path):
    path = tmp_path / "cal.json"
    path.write_text(json.dumps({"schema": SCHEMA, "devices": {"CPU core": {
        "matmul_efficiency": float("nan")}}}))
    with pytest.raises(ConfigError, match="not a finite number"):
        load_entry(spec(*GPU[:-1], f"cluster.calibration={path}"))
