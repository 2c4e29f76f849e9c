"""The compute term by shape, dtype and compile (parallel/cost/matmul_rate.py,
compute_time.py, elementwise.py) and the fit of its knee."""
from __future__ import annotations

import dataclasses
from functools import lru_cache

import pytest

from parallel.cost.calibrate import Sample, fit_compute, predict
from parallel.context_parallel import shard_positions
from parallel.cost.compute_time import attention_pairs, pass_tokens
from parallel.cost.matmul_rate import Gemm, MatmulRate, efficiency_of
from parallel.cost.memory import estimate_memory
from parallel.cost.plan import make_plan
from parallel.cost.step_time import estimate_time, hardware_of, step_parts
from tests.support.specs import cpu_spec

H100 = ("model=llama3_1b", "cluster=slurm", "cluster.gpu_name=H100", "training.device=cuda",
        "training.seq_len=4096", "training.grad_accum_steps=1", "cluster.calibration=none",
        "recompute=none")


@lru_cache(maxsize=None)
def spec(*overrides: str):
    return cpu_spec(*overrides)


def gpu(*overrides: str, nodes: int = 1):
    return spec(*H100, *overrides, f"cluster.nodes={nodes}")


def parts(s):
    return estimate_time(s, make_plan(s)).breakdown


def test_a_gemm_reaches_the_scale_when_large_and_half_of_it_at_the_knee():
    """t = max(2MNK / rate, bytes / HBM) + knee a call: a GEMM whose FLOPs take the knee's
    time reaches half the scale; a huge one nearly all of it. (Mutation tried: the knee
    counted once for forward + backward instead of a call each -> the half fails.)"""
    rate = MatmulRate(flops=500e12, fp8_flops=0.0, hbm_bytes_s=1e18, knee_s=4e-6)
    knee_flops = 500e12 * 4e-6  # 2 GFLOP
    side = round((knee_flops / 2) ** (1 / 3))
    half = Gemm(side, side, side)
    assert half.flops == pytest.approx(knee_flops, rel=1e-3)
    scale = 500e12 / 1e15
    assert efficiency_of(half, rate, peak=1e15, operand_bytes=2) == pytest.approx(
        scale * half.flops / (half.flops + knee_flops), rel=1e-9)
    assert efficiency_of(half, rate, peak=1e15, operand_bytes=2) == pytest.approx(scale / 2,
                                                                                 rel=1e-3)
    big = Gemm(16384, 16384, 16384)
    assert efficiency_of(big, rate, peak=1e15, operand_bytes=2) > 0.499
    thin = Gemm(8, 4096, 4096)  # memory-bound once HBM is finite
    slow = dataclasses.replace(rate, hbm_bytes_s=3e12)
    assert efficiency_of(thin, slow, peak=1e15, operand_bytes=2) < 0.05


def test_tp_and_a_small_micro_batch_lower_the_gemm_efficiency():
    """tp 8 splits every block GEMM's N or K by 8 and a short sequence of one micro-batch cuts
    M: the achieved GEMM efficiency falls below the scale (it was one 50% for all before)."""
    scale = hardware_of(gpu("parallel=fsdp")).matmul_efficiency
    large = parts(gpu("parallel=fsdp", "training.micro_batch_size=4"))
    small = parts(spec(*H100, "parallel=tp", "parallel.tp=8", "training.micro_batch_size=1",
                       "training.seq_len=256", "cluster.nodes=1"))
    assert large.gemm_efficiency > 0.97 * scale
    assert small.gemm_efficiency < 0.8 * scale
    assert small.gemm_efficiency < large.gemm_efficiency


def test_fp8_runs_the_block_linears_at_the_fp8_peak_where_the_device_has_one():
    """H100 has fp8 tensor cores (1979 TFLOP/s dense), A100 none; fp8 on H100 predicts more
    tokens/s than bf16, not the same; its casts are memory passes, fewer compiled."""
    assert hardware_of(gpu("parallel=fsdp")).fp8_flops == pytest.approx(1979e12)
    a100 = spec(*H100, "parallel=fsdp", "cluster.gpu_name=A100-SXM4-80GB", "cluster.nodes=1")
    assert hardware_of(a100).fp8_flops == 0.0
    bf16 = estimate_time(gpu("parallel=fsdp"), make_plan(gpu("parallel=fsdp")))
    fp8_spec = gpu("parallel=fsdp", "precision=fp8")
    fp8 = estimate_time(fp8_spec, make_plan(fp8_spec))
    assert fp8.tokens_per_s_per_device > 1.1 * bf16.tokens_per_s_per_device
    assert fp8.breakdown.gemm_efficiency > 1.4 * bf16.breakdown.gemm_efficiency  # bf16 peak
    compiled = parts(gpu("parallel=fsdp", "precision=fp8", "training.compile=true"))
    assert compiled.compute_fixed_s < fp8.breakdown.compute_fixed_s


def test_compile_fuses_elementwise_traffic_and_drops_saved_intermediates():
    """training.compile: less memory traffic (faster step) on a GPU, and without a checkpoint
    policy the blocks keep neither the norms' fp32 upcasts nor silu(gate); under the ops
    policy what is kept is the policy's, compiled or not."""
    eager, compiled = gpu("parallel=fsdp"), gpu("parallel=fsdp", "training.compile=true")
    assert parts(compiled).compute_s < parts(eager).compute_s
    m = eager.model
    per_token = 2 * 4 * m.dim + 2 * m.ffn_dim  # fp32 upcasts (FSDP: no SP), bf16 silu
    tokens = pass_tokens(eager)
    dropped = estimate_memory(eager).activations - estimate_memory(compiled).activations
    assert dropped == m.n_layers * tokens * per_token
    ops = ("parallel=fsdp", "recompute=selective")
    assert estimate_memory(gpu(*ops)).activations == \
        estimate_memory(gpu(*ops, "training.compile=true")).activations


def _causal_pairs_of_busiest_rank(*, seq_len: int, cp: int, balanced: bool) -> int:
    """Query-key pairs a causal kernel meets on the busiest cp rank, counted position by
    position from the sharding itself (a query at position p meets keys 0..p)."""
    return max(sum(p + 1 for p in shard_positions(seq_len=seq_len, cp=cp, cp_rank=r,
                                                  balanced=balanced)) for r in range(cp))


@pytest.mark.parametrize("balanced", [True, False])
def test_context_parallel_attention_counts_the_causal_pairs_of_the_busiest_rank(balanced):
    """cp > 1 on a GPU: each run of a rank's queries meets the keys up to its end under a
    lower-right causal bias (flash: the masked half skipped), so the kernel's pairs are the
    causal count of the busiest rank's positions (within the diagonal tiles' half); with
    document masking an explicit [t, T] mask makes the kernel compute every score, slower."""
    T, cp = 4096, 4
    two = spec(*H100, "parallel=cp", f"parallel.cp={cp}", "parallel.dp_shard=1",
               "parallel.zero=3", f"training.seq_len={T}", f"model.max_seq_len={T}",
               "cluster.nodes=1", f"cluster.procs_per_node={cp}",
               f"parallel.cp_balanced={str(balanced).lower()}")
    counted = _causal_pairs_of_busiest_rank(seq_len=T, cp=cp, balanced=balanced)
    assert attention_pairs(two, gpu=True) == pytest.approx(counted, rel=0.01)
    masked = dataclasses.replace(two, data=dataclasses.replace(two.data, document_mask=True))
    assert attention_pairs(masked, gpu=True) == T * T // cp
    assert parts(masked).compute_s > parts(two).compute_s


TRUTH = {"matmul_efficiency": 0.41, "layer_overhead_us": 700.0, "tp_overhead_us": 0.0,
         "collective_overhead_us": 0.0, "update_overhead_us": 30.0, "intra_node_gbps": 1.5,
         "intra_node_latency_us": 80.0, "matmul_knee_us": 30.0}
SMALL = ("model=tiny", "data=synthetic", "training.seq_len=64", "training.global_batch_size=8",
         "training.micro_batch_size=2", "training.grad_accum_steps=-1")


def test_the_fit_finds_the_knee_of_runs_made_with_one():
    """Runs predicted with a 30 us knee: the fit gives back the knee, the efficiency and the
    per-block overhead: runs of 2 and 8 blocks tell the knee (GEMM calls, the head's among
    them) from the overhead per block. (Mutation tried: all runs of one depth -> the knee is
    collinear with the overhead and the fit keeps the first candidate, fails.)"""
    samples = []
    for overrides, ranks in ((("parallel=single",), 1), (("parallel=ddp",), 2),
                             (("parallel=pp",), 2), (("parallel=single",
                                                      "model.n_layers=8"), 1)):
        s = spec(*SMALL, *overrides, f"cluster.procs_per_node={ranks}",
                 "cluster.calibration=none")
        samples.append(Sample(name=" ".join(overrides), spec=s, measured_s=predict(s, TRUTH)))
    base = {k: TRUTH[k] for k in ("intra_node_gbps", "intra_node_latency_us",
                                  "update_overhead_us")}
    fitted = fit_compute(samples, base=base)
    assert fitted["matmul_knee_us"] == 30.0
    assert fitted["matmul_efficiency"] == pytest.approx(0.41, rel=1e-6)
    assert fitted["layer_overhead_us"] == pytest.approx(700.0, rel=1e-6)
    cpu = samples[0].spec
    assert step_parts(cpu, make_plan(cpu), hardware_of(cpu)).compute_fixed_s == 0.0
