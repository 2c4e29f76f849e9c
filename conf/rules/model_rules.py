"""Rules on the model shape (heads, RoPE scaling) and on the precision against the device."""
from __future__ import annotations

from conf.errors import ProblemList
from conf.rules.field_rules import check_positive, divisors
from conf.schema import DeviceKind, Precision, RopeScaling
from conf.spec import HostSpec, ModelSpec

FP8_MIN_CC = 8.9
BF16_MIN_CC = 8.0


def check_model(m: ModelSpec, problems: ProblemList) -> None:
    check_positive(problems, "model", m, ("n_layers", "dim", "n_heads", "n_kv_heads",
                                          "ffn_dim", "vocab_size", "max_seq_len", "rope_theta",
                                          "norm_eps", "init_std"))
    if m.dim > 0 and m.n_heads > 0 and m.dim % m.n_heads and m.head_dim == m.dim // m.n_heads:
        valid = ", ".join(map(str, divisors(m.dim)[:12]))
        problems.add("model.n_heads", m.n_heads, f"must divide model.dim={m.dim}",
                     f"pick a divisor of {m.dim} (e.g. {valid})")
    elif m.n_heads > 0 and m.head_dim % 2 and m.head_dim == m.dim // m.n_heads:
        problems.add("model.dim", m.dim,
                     f"head dim dim/n_heads={m.head_dim} must be even for RoPE",
                     "change model.dim or model.n_heads")
    if m.rope_scaling is RopeScaling.llama3:
        _check_llama3_rope(m, problems)
    if m.n_heads > 0 and m.n_kv_heads > 0 and m.n_heads % m.n_kv_heads:
        valid = ", ".join(map(str, divisors(m.n_heads)))
        problems.add("model.n_kv_heads", m.n_kv_heads,
                     f"must divide model.n_heads={m.n_heads} (grouped-query attention)",
                     f"use one of {valid}")


def _check_llama3_rope(m: ModelSpec, problems: ProblemList) -> None:
    if m.rope_scaling_factor < 1:
        problems.add("model.rope_scaling_factor", m.rope_scaling_factor,
                     "must be >= 1 (it divides the low RoPE frequencies)", "e.g. 8 or 32")
    check_positive(problems, "model", m, ("rope_low_freq_factor", "rope_original_max_seq_len"))
    if m.rope_high_freq_factor <= m.rope_low_freq_factor:
        problems.add("model.rope_high_freq_factor", m.rope_high_freq_factor,
                     f"must exceed model.rope_low_freq_factor={m.rope_low_freq_factor} "
                     "(the blend between them divides by the difference)", "e.g. 4 with 1")


def check_precision(name: Precision, device: DeviceKind, host: HostSpec,
                    problems: ProblemList) -> None:
    cuda = device is DeviceKind.cuda
    if cuda and host.gpu_count and not host.compute_capability:
        return  # a GPU model nobody described (cluster.gpu_compute_capability=0): no judgement
    if name is Precision.fp8 and (not cuda or host.compute_capability < FP8_MIN_CC):
        if not cuda or host.gpu_count == 0:
            where = "CPU" if not cuda else "a machine with no CUDA GPU"
        else:
            where = f"{host.gpu_name} (cc {host.compute_capability})"
        problems.add("precision", "fp8",
                     f"needs a CUDA GPU of compute capability >= {FP8_MIN_CC}; this run is on {where}",
                     "use precision=bf16 (or fp32 on CPU)")
    if name is Precision.bf16 and cuda and host.compute_capability < BF16_MIN_CC:
        problems.add("precision", "bf16",
                     f"needs compute capability >= {BF16_MIN_CC}; {host.gpu_name} has "
                     f"{host.compute_capability}", "use precision=fp16 or fp32")
