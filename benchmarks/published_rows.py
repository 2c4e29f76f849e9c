"""Published training runs, one row each, with the source it was read from: what
benchmarks/published_record.py plans and compares. Torch-free data, no logic.

A row is the overrides that express the run in meshrun (model shape, cluster, layout,
precision, recompute, batch), the published tokens/s per GPU and peak memory (None where
the source gives none), and `approx`: overrides meshrun cannot express, each with why; the
record drops them, plans the rest and marks the row approximate. SOURCES names each
source with its file and commit (or paper and table).
"""
from __future__ import annotations

from dataclasses import dataclass, field

TT_H100 = ("torchtitan benchmarks/llama3_h100_202412_torchtitan.md @31a17bf (pytorch/torchtitan; "
           "torch 1963fc8, torchao eab345c, torchtitan 9dec370, Dec 2024): Grand Teton, H100 "
           "96 GB HBM2e at 500 W, 400 Gb/s RDMA per GPU; TPS/GPU at step 90; memory = max over "
           "ranks of the reserved peak")
TT_A100 = ("torchtitan docs/performance.md @0413364 (pytorch/torchtitan): Llama 3 on 64 A100 "
           "80GB, FSDP2, local batch 1, seq 8192; WPS per GPU (no memory column)")
NEMO = ("NeMo docs/source/performance/performance_summary.md @070a0bb (NVIDIA/NeMo, container "
        "NeMo 24.07, DGX-H100, FP8, Megatron-Core; tokens/s/GPU, no memory column)")
MEGATRON = ("Megatron-LM 2021 weak-scaling table: Narayanan et al., 'Efficient Large-Scale "
            "Language Model Training on GPU Clusters Using Megatron-LM', SC'21, arXiv 2104.04473 "
            "Table 1, also the NVIDIA/Megatron-LM README (2021-22): GPT, vocab 51,200, seq 2048, "
            "A100 80GB on Selene, mixed precision, full activation recompute; published as "
            "achieved TFLOP/s per GPU, turned into tokens/s with the paper's own count "
            "96 l h^2 (1 + s/6h + V/16lh) FLOPs per token (recompute included)")
SOURCES = {"tt_h100": TT_H100, "tt_a100": TT_A100, "nemo": NEMO, "megatron": MEGATRON}


@dataclass(frozen=True)
class Row:
    source: str
    label: str
    overrides: tuple[str, ...]
    tokens_per_s: float | None
    memory_gib: float | None = None
    approx: tuple[tuple[str, ...], ...] = ()
    """(override or tuple of overrides, why meshrun cannot express it[, overrides planned
    instead]): dropped (and replaced) in order while the row does not resolve."""
    unmodelled: tuple[str, ...] = field(default=())
    """What the run used that meshrun neither expresses nor plans (named, not dropped)."""
    kept_outputs: bool = False
    """The run's torch pipelining kept every micro-batch's last-stage output until the step's
    end (PipelineStage.output_chunks, for the schedule to return them: torch before 2025's
    `return_outputs=False`, pytorch/pytorch#138504 and #159251). torchtitan's last stage
    outputs fp32 logits (`self.output(h).float()`), vocabulary-sharded under loss parallel.
    meshrun's runs pass return_outputs=False and hold none; the record adds them to the plan
    of such a row, says how much, and marks it approximate."""


H100 = ("cluster=slurm", "cluster.gpu_name=H100", "cluster.gpus_per_node=8")
TT_GPU = ("cluster.peak_tflops=835", "cluster.hbm_gbps=2400")
"""torchtitan's H100s as their page describes them: HBM2e at 2.4 TB/s, 500 W, peak "between
SXM and NVL" (unknown): the NVL's 835 TFLOP/s bf16 dense, the lower bound, is used."""
A100 = ("cluster=slurm", "cluster.gpu_name=A100 80GB", "cluster.gpus_per_node=8")
L8B = ("model=llama3_8b",)
L70B = ("model=llama3_70b",)
L405B = ("model=llama3_70b", "model.name=llama3_405b", "model.n_layers=126", "model.dim=16384",
         "model.n_heads=128", "model.ffn_dim=53248")
"""Llama 3.1 405B (Hugging Face config.json), on the 70B's vocabulary, heads and RoPE."""
SPLIT_126_8 = "parallel.pp_layer_split=[15,16,16,16,16,16,16,15]"
SPLIT_126_16 = "parallel.pp_layer_split=[8,8,8,8,8,8,8,8,8,8,8,8,8,8,7,7]"
COMPILE = ("training.compile=true", "compile with cp and full recompute is refused (its "
           "blocks would stay eager): planned eager")
"""Dropped only where meshrun refuses compile for the layout (conf/rules: context parallel's
eager attention under a whole-block checkpoint); elsewhere compile is planned."""
ZERO1 = "parallel.zero=1"
PP_FSDP = "parallel.zero=2"
"""torchtitan's FSDP under pipeline parallelism: reshard_after_forward = not pp_enabled ("do
not reshard after forward to avoid per-microbatch all-gathers", parallelize_llama.py
apply_fsdp): a stage's weights stay gathered through the step, meshrun's ZeRO-2."""
TT_OP_SAC = ("recompute=selective", "recompute.ops_matmuls=alternate")
"""torchtitan's selective op AC: its policy keeps mm, SDPA and reduce-scatter outputs except
every second mm of a block (torchtitan's `_custom_policy`, "Saves output of all compute ops,
except every second mm")."""


def _fsdp(n: int, batch: int, *extra: str) -> tuple[str, ...]:
    return (*H100, *TT_GPU, f"cluster.nodes={n // 8}", "parallel=fsdp", "training.seq_len=8192",
            f"training.micro_batch_size={batch}", "training.grad_accum_steps=1", *extra)


def _tt_8b() -> list[Row]:
    rows = []
    for gpus, table, (plain, comp, fp8) in ((8, "Table 1", ((5762, 82.4), (6667, 77.0),
                                                           (8532, 76.8))),
                                            (128, "Table 3", ((5605, 67.0), (6514, 62.0),
                                                              (8380, 61.8)))):
        base = (*L8B, *_fsdp(gpus, 2, *TT_OP_SAC, "precision=bf16"))
        rows += [Row("tt_h100", f"8B {gpus} H100 FSDP ({table})", base, *plain),
                 Row("tt_h100", f"8B {gpus} H100 FSDP+compile", (*base, COMPILE[0]), *comp),
                 Row("tt_h100", f"8B {gpus} H100 FSDP+compile+fp8",
                     (*base, COMPILE[0], "precision=fp8"), *fp8)]
    return rows


def _tt_cp() -> list[Row]:
    rows = []
    for cp, seq, tps, mem in ((1, 32768, 3890, 83.9), (2, 65536, 2540, 84.2),
                              (4, 131072, 1071, 84.0), (8, 262144, 548, 84.5)):
        rows.append(Row("tt_h100", f"8B 8 H100 FSDP {8 // cp} CP {cp} seq {seq // 1024}k "
                                   "(Table 2)",
                        (*L8B, *H100, *TT_GPU, "cluster.nodes=1", "parallel=fsdp",
                         f"parallel.cp={cp}",
                         f"training.seq_len={seq}", f"model.max_seq_len={max(seq, 131072)}",
                         "training.micro_batch_size=1", "training.grad_accum_steps=1",
                         "recompute=full", "precision=fp8", COMPILE[0]), tps, mem,
                        approx=(COMPILE,)))
    return rows


def _tt_3d() -> list[Row]:
    tp70 = (*L70B, *H100, *TT_GPU, "cluster.nodes=32", "parallel=fsdp_tp", "parallel.tp=8",
            "parallel.loss_parallel=true", "training.seq_len=8192",
            "training.micro_batch_size=16", "training.grad_accum_steps=1", "recompute=full",
            "precision=fp8", COMPILE[0])
    pp405 = (*L405B, *H100, *TT_GPU, "cluster.nodes=64", "parallel.dp_shard=8",
             "parallel.dp_replicate=1",
             "parallel.tp=8", "parallel.pp=8", PP_FSDP, "parallel.loss_parallel=true",
             "training.seq_len=8192", "training.micro_batch_size=32",
             "training.grad_accum_steps=1", "parallel.pp_microbatches=32", "recompute=full",
             "precision=fp8", COMPILE[0])
    rows = [Row("tt_h100", "70B 256 H100 FSDP 32 TP 8 (Table 4)", tp70, 829, 71.9,
                approx=(COMPILE,)),
            Row("tt_h100", "70B 256 H100 FSDP 32 TP 8 AsyncTP", tp70, 876, 67.6,
                approx=(COMPILE,), unmodelled=("AsyncTP",)),
            Row("tt_h100", "405B 512 H100 FSDP8 TP8 PP8 1F1B (Table 5)",
                (*pp405, "parallel.pp_schedule=1f1b", SPLIT_126_8), 100, 82.5,
                approx=(COMPILE,), unmodelled=("AsyncTP",), kept_outputs=True),
            Row("tt_h100", "405B 512 H100 FSDP8 TP8 PP8 interleaved",
                (*pp405, "parallel.pp_schedule=interleaved_1f1b", "parallel.pp_virtual_stages=2",
                 SPLIT_126_16), 128, 72.7, approx=(COMPILE,), unmodelled=("AsyncTP",),
                kept_outputs=True)]
    for cp, seq, tps, mem in ((1, 32768, 76, 75.3), (2, 65536, 47, 75.9),
                              (4, 131072, 31, 77.1), (8, 262144, 16, 84.9)):
        over = [o for o in pp405 if not o.startswith(("parallel.dp_shard", "training.seq_len",
                                                      "training.micro_batch_size",
                                                      "parallel.pp_microbatches"))]
        rows.append(Row("tt_h100", f"405B 512 H100 FSDP {8 // cp} CP {cp} TP8 PP8 seq "
                                   f"{seq // 1024}k (Table 6)",
                        (*over, f"parallel.dp_shard={8 // cp}", f"parallel.cp={cp}",
                         f"training.seq_len={seq}", f"model.max_seq_len={max(seq, 131072)}",
                         "training.micro_batch_size=8", "parallel.pp_microbatches=8",
                         "parallel.pp_schedule=1f1b", SPLIT_126_8), tps, mem,
                        approx=(COMPILE,), unmodelled=("AsyncTP",), kept_outputs=True))
    return rows


def _tt_a100() -> list[Row]:
    base = (*A100, "cluster.nodes=8", "parallel=fsdp", "training.seq_len=8192",
            "training.micro_batch_size=1", "training.grad_accum_steps=1", "precision=bf16")
    return [Row("tt_a100", "8B 64 A100 FSDP selective layer",
                (*L8B, *base, "recompute=full_every2"), 2904),
            Row("tt_a100", "8B 64 A100 FSDP selective op", (*L8B, *base, *TT_OP_SAC),
                2973),
            Row("tt_a100", "70B 64 A100 FSDP full AC", (*L70B, *base, "recompute=full"), 331)]


LLAMA2 = {"7b": ("model.n_layers=32", "model.dim=4096", "model.n_heads=32", "model.n_kv_heads=32",
                 "model.ffn_dim=11008"),
          "13b": ("model.n_layers=40", "model.dim=5120", "model.n_heads=40",
                  "model.n_kv_heads=40", "model.ffn_dim=13824"),
          "70b": ("model.n_layers=80", "model.dim=8192", "model.n_heads=64", "model.n_kv_heads=8",
                  "model.ffn_dim=28672")}
"""Llama 2 shapes (Hugging Face config.json): 32,000 vocabulary, RoPE base 10,000."""


def _llama2(size: str) -> tuple[str, ...]:
    return ("model=llama3_8b", f"model.name=llama2_{size}", *LLAMA2[size], "model.vocab_size=32000",
            "model.rope_theta=10000.0", "model.rope_scaling=none", "model.max_seq_len=4096")


def _nemo() -> list[Row]:
    def layout(gpus, gbs, seq, tp, pp, cp, vp):
        dp = gpus // (tp * pp * cp)
        over = [*H100, f"cluster.nodes={gpus // 8}", "parallel.dp_replicate=1",
                f"parallel.dp_shard={dp}", ZERO1, f"parallel.tp={tp}", f"parallel.pp={pp}",
                f"parallel.cp={cp}", f"training.seq_len={seq}", "recompute=none",
                f"training.global_batch_size={gbs}"]
        if pp > 1:
            per_rank = gbs // dp
            over += [f"training.micro_batch_size={per_rank}", "training.grad_accum_steps=1",
                     f"parallel.pp_microbatches={per_rank}",
                     "parallel.pp_schedule=" + ("interleaved_1f1b" if vp > 1 else "1f1b"),
                     f"parallel.pp_virtual_stages={vp}"]
        else:
            over += ["training.micro_batch_size=1", "training.grad_accum_steps=-1"]
        return tuple(over)

    return [Row("nemo", "Llama3 8B 8 H100 FP8 CP2", (*L8B, *layout(8, 128, 8192, 1, 1, 2, 1),
                                                   "precision=fp8"), 12036),
            Row("nemo", "Llama3 70B 64 H100 FP8 TP4 PP4 CP2 VP5",
                (*L70B, *layout(64, 128, 8192, 4, 4, 2, 5), "precision=fp8"), 1533),
            Row("nemo", "Llama2 7B 8 H100 FP8", (*_llama2("7b"), *layout(8, 128, 4096, 1, 1, 1, 1),
                                                 "precision=fp8"), 16847),
            Row("nemo", "Llama2 13B 16 H100 FP8 PP4 VP10",
                (*_llama2("13b"), *layout(16, 128, 4096, 1, 4, 1, 10), "precision=fp8"), 8646),
            Row("nemo", "Llama2 70B 64 H100 FP8 TP4 PP4 VP20",
                (*_llama2("70b"), *layout(64, 128, 4096, 4, 4, 1, 20), "precision=fp8"), 1707)]


# billions, heads, hidden, layers, tp, pp, GPUs, batch, achieved TFLOP/s per GPU
MEGATRON_TABLE = ((1.7, 24, 2304, 24, 1, 1, 32, 512, 137), (3.6, 32, 3072, 30, 2, 1, 64, 512, 138),
                  (7.5, 32, 4096, 36, 4, 1, 128, 512, 142),
                  (18.4, 48, 6144, 40, 8, 1, 256, 1024, 135),
                  (39.1, 64, 8192, 48, 8, 2, 512, 1536, 138),
                  (76.1, 80, 10240, 60, 8, 4, 1024, 1792, 140),
                  (145.6, 96, 12288, 80, 8, 8, 1536, 2304, 148),
                  (310.1, 128, 16384, 96, 8, 16, 1920, 2160, 155),
                  (529.6, 128, 20480, 105, 8, 35, 2520, 2520, 163),
                  (1008.0, 160, 25600, 128, 8, 64, 3072, 3072, 163))
SEQ_GPT, VOCAB_GPT = 2048, 51200
DDP = "parallel.zero=0"


def megatron_tokens_per_s(tflops: float, layers: int, hidden: int) -> float:
    per_token = 96 * layers * hidden ** 2 * (1 + SEQ_GPT / (6 * hidden)
                                             + VOCAB_GPT / (16 * layers * hidden))
    return tflops * 1e12 / per_token


def _megatron() -> list[Row]:
    rows = []
    for size, heads, h, layers, tp, pp, gpus, batch, tflops in MEGATRON_TABLE:
        dp = gpus // (tp * pp)
        ffn = (8 * h // 3 + 127) // 128 * 128  # SwiGLU of the GPT's 4h GELU MLP's parameters
        over = ["model=llama3_8b", f"model.name=gpt_{size:g}b", f"model.n_layers={layers}",
                f"model.dim={h}", f"model.n_heads={heads}", f"model.n_kv_heads={heads}",
                f"model.ffn_dim={ffn}", f"model.vocab_size={VOCAB_GPT}",
                f"model.max_seq_len={SEQ_GPT}", "model.rope_scaling=none",
                *A100, f"cluster.nodes={gpus // 8}", f"parallel.dp_replicate={dp}",
                "parallel.dp_shard=1", DDP, f"parallel.tp={tp}",
                f"parallel.pp={pp}", f"training.seq_len={SEQ_GPT}", "recompute=full",
                "precision=bf16", f"training.global_batch_size={batch}"]
        per_rank = batch // dp
        if pp > 1:
            over += [f"training.micro_batch_size={per_rank}", "training.grad_accum_steps=1",
                     f"parallel.pp_microbatches={per_rank}", "parallel.pp_schedule=1f1b"]
        else:
            over += ["training.micro_batch_size=1", "training.grad_accum_steps=-1"]
        rows.append(Row("megatron", f"GPT {size:g}B {gpus} A100 TP{tp} PP{pp}", tuple(over),
                        megatron_tokens_per_s(tflops, layers, h),
                        unmodelled=("GPT (GELU MLP, learned positions, tied embeddings) planned "
                                    "as a Llama shape of equal parameters",)))
    return rows


ROWS = (*_tt_8b(), *_tt_cp(), *_tt_3d(), *_tt_a100(), *_nemo(), *_megatron())
