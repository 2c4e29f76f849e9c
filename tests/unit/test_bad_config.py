"""The bad-config corpus: every override set here must be refused with one ConfigError whose
message names the key, the value, the rule and the fix (ARCHITECTURE.md, "Errors a person can
act on"). Each case runs the real path: `compose_config` (Hydra) then `resolve` on a given host.

Hosts are built directly as HostSpec objects, so the corpus runs the same on any machine.
"""
from __future__ import annotations

from dataclasses import dataclass

import pytest

from conf.compose import compose_config
from conf.errors import ConfigError
from conf.gpu_generations import known_compute_capability
from conf.resolve import resolve
from conf.spec import HostSpec

CPU = HostSpec(gpu_name="", gpu_count=0, compute_capability=0.0, cpu_count=8)
A100 = HostSpec(gpu_name="NVIDIA A100-SXM4-80GB", gpu_count=8, compute_capability=8.0,
                cpu_count=64)
V100 = HostSpec(gpu_name="Tesla V100-SXM2-32GB", gpu_count=4, compute_capability=7.0,
                cpu_count=32)
H100 = HostSpec(gpu_name="NVIDIA H100 80GB HBM3", gpu_count=8, compute_capability=9.0,
                cpu_count=96)
TMP = "{tmp}"  # replaced by the test's tmp_path in overrides and expected text


@dataclass(frozen=True)
class Case:
    id: str
    overrides: tuple[str, ...]
    expect: tuple[str, ...]
    """Substrings the error message must contain: key, value, a word of the rule and of the fix."""
    host: HostSpec = CPU
    problems: int | None = 1
    """How many problems the one ConfigError must list; None: not pinned (see the reply notes)."""


def case(id: str, overrides: str, *expect: str, host: HostSpec = CPU,
         problems: int | None = 1) -> Case:
    return Case(id, tuple(overrides.split()), expect, host, problems)


CASES = [
    # ---- overrides that cannot compose (checked before Hydra runs) ----
    case("unknown-model-option", "model=llama4",
         "model=llama4", "unknown model option", "choose one of", "debug", "llama3_8b",
         "qwen2_5_7b", "tiny"),
    case("unknown-precision-option", "precision=int4",
         "precision=int4", "unknown precision option", "auto", "bf16", "fp16", "fp32", "fp8"),
    case("unknown-schedule-option", "schedule=exp",
         "schedule=exp", "unknown schedule option", "constant", "cosine", "linear", "wsd"),
    case("unknown-key-did-you-mean", "model.n_layer=3",
         "model.n_layer=3", "unknown key 'model.n_layer'", "did you mean", "model.n_layers"),
    case("unknown-key-typo-in-section", "training.stpes=10",
         "training.stpes=10", "unknown key", "did you mean", "training.steps"),
    case("unknown-section-did-you-mean", "trainng.steps=10",
         "trainng.steps=10", "unknown key 'trainng'", "did you mean", "training"),
    case("wrong-type-int", "training.steps=abc",
         "training.steps=abc", "must be an integer", "int"),
    case("wrong-type-int-given-float", "training.seq_len=1.5",
         "training.seq_len=1.5", "must be an integer", "int"),
    case("wrong-type-float", "optim.lr=fast",
         "optim.lr=fast", "must be a number", "float"),
    case("wrong-type-bool", "training.compile=maybe",
         "training.compile=maybe", "must be true or false", "bool"),
    case("wrong-type-enum", "schedule.decay_shape=sqrt",
         "schedule.decay_shape=sqrt", "must be one of", "one_minus_sqrt", "DecayShape"),
    case("wrong-type-enum-case", "logging.wandb_mode=ONLINE",
         "logging.wandb_mode=ONLINE", "must be one of", "offline", "online", "disabled"),
    case("section-given-a-value", "training=fast",
         "training=fast", "is a config section", "training.steps=..."),
    case("sweep-given-to-run", "training.steps=100,200",
         "training.steps", "100,200", "is a sweep", "meshrun sweep"),
    case("sweep-range-given-to-run", "optim.lr=range(1,3)",
         "optim.lr", "is a sweep", "single value"),
    case("plus-adds-unknown-key", "+model.moe_experts=8",
         "model.moe_experts=8", "cannot add key 'model.moe_experts'", "schema is fixed",
         "without '+'"),
    case("bad-override-syntax", "a=b=c",
         "a=b=c", "is not valid override syntax", "key=value"),
    case("bad-interpolation", "training.steps=${nope}",
         "Interpolation key 'nope' not found", "training.steps", "conf/schema.py"),
    case("all-override-problems-at-once",
         "model=llama4 training.steps=abc trainng.seed=1 optim.lr=1e-3,1e-4",
         "model=llama4", "training.steps=abc", "trainng", "optim.lr", problems=4),
    # ---- parallel layout and world size ----
    case("world-size-not-product-of-degrees", "parallel.dp_replicate=3 cluster.procs_per_node=2",
         "dp_replicate(3)", "=3 != world size 2", "cluster.procs_per_node=2",
         "multiply to the world size"),
    case("tp-divides-heads", "model=tiny parallel=tp cluster.procs_per_node=3",
         "parallel.tp=3", "must divide model.n_heads=4", "must divide model.vocab_size=256",
         "use parallel.tp in 1, 2", "divisible by 3 (tp(3) for sequence parallel)", problems=4),
    case("pp-stages-divide-layers",
         "model=tiny parallel=pp parallel.pp_schedule=interleaved_1f1b "
         "parallel.pp_virtual_stages=2 cluster.procs_per_node=2",
         "parallel.pp=2", "4 stages must divide model.n_layers=2", "pp_layer_split", problems=1),
    case("pp-schedule-unknown", "parallel=pp parallel.pp_schedule=zigzag cluster.procs_per_node=2",
         "parallel.pp_schedule=zigzag", "not a pipeline schedule", "gpipe, 1f1b", problems=1),
    case("zero1-needs-shard-axis", "parallel.zero=1",
         "parallel.zero=1", "parallel.dp_shard, which is 1", "parallel.dp_shard=-1", problems=1),
    case("cp-seq-len", "parallel=cp training.seq_len=62 cluster.procs_per_node=2",
         "training.seq_len=62", "divisible by 4", "2 x cp(2)", "training.seq_len=60", problems=1),
    case("recompute-target-unknown", "recompute=selective recompute.targets=[mlp]",
         "recompute.targets=['mlp']", "unknown target(s) mlp", "swiglu", problems=1),
    case("two-auto-degrees", "parallel.dp_replicate=-1 parallel.cp=-1",
         "parallel", "at most one degree may be -1", "set all but one", problems=1),
    case("zero-degree", "parallel.dp_replicate=0",
         "parallel.dp_replicate=0", "must be positive, or -1", "degree >= 1", problems=1),
    case("several-nodes", "cluster.nodes=2",
         "cluster.nodes=2", "exactly one node", "cluster=slurm or cluster=nodes"),
    case("nodes-without-rendezvous-host", "cluster=nodes",
         "cluster.rdzv_host", "needs the rendezvous host", "cluster.rdzv_host="),
    case("negative-max-restarts", "training.max_restarts=-1",
         "training.max_restarts=-1", "must be >= 0", "e.g. 2"),
    case("slurm-signal-syntax", "cluster=slurm cluster.gpus_per_node=0 cluster.warning_signal=USR1",
         "cluster.warning_signal=USR1", "SIGNAL@SECONDS", "USR1@120"),
    case("slurm-signal-after-the-limit",
         "cluster=slurm cluster.gpus_per_node=0 cluster.time_limit_min=1 cluster.warning_signal=USR1@90",
         "cluster.warning_signal=USR1@90", "at once", "shorter than the time limit"),
    case("slurm-extra-sbatch-not-an-option",
         "cluster=slurm cluster.gpus_per_node=0 cluster.extra_sbatch=[reservation]",
         "cluster.extra_sbatch=reservation", "long sbatch option", "--name=value"),
    case("procs-per-node-zero", "cluster.procs_per_node=0",
         "cluster.procs_per_node=0", "must be positive", "value >= 1"),
    case("procs-per-node-above-gpu-count", "cluster.procs_per_node=16",
         "cluster.procs_per_node=16", "exceeds the 8 GPU(s)", "cluster.procs_per_node<=8",
         host=A100),
    # ---- batch arithmetic ----
    case("global-batch-not-micro-x-accum-x-dp",
         "training.global_batch_size=100 training.grad_accum_steps=2 "
         "training.micro_batch_size=16 cluster.procs_per_node=2",
         "training.global_batch_size=100", "micro_batch_size(16)", "grad_accum_steps(2)",
         "dp(2)=64", "grad_accum_steps=-1"),
    case("global-batch-not-multiple-of-micro-x-dp",
         "training.global_batch_size=100 training.micro_batch_size=16 cluster.procs_per_node=2",
         "training.global_batch_size=100", "must be a multiple of", "=32",
         "use a multiple of 32", "96"),
    case("grad-accum-zero", "training.grad_accum_steps=0",
         "training.grad_accum_steps=0", "must be positive, or -1", "value > 0"),
    # ---- model shape ----
    case("heads-do-not-divide-dim", "model.n_heads=6 model.n_kv_heads=3",
         "model.n_heads=6", "must divide model.dim=128", "divisor of 128", "64"),
    case("kv-heads-do-not-divide-heads", "model.n_kv_heads=3",
         "model.n_kv_heads=3", "must divide model.n_heads=4", "grouped-query",
         "use one of 1, 2, 4"),
    case("odd-head-dim", "model.dim=120 model.n_heads=8 model.n_kv_heads=8",
         "model.dim=120", "head dim dim/n_heads=15", "even", "RoPE", "model.n_heads"),
    case("seq-len-above-max-seq-len", "training.seq_len=4096",
         "training.seq_len=4096", "exceeds model.max_seq_len=1024", "debug",
         "training.seq_len<=1024"),
    case("vocab-too-small-for-bytes", "model.vocab_size=100",
         "model.vocab_size=100", "256 token ids", "model.vocab_size>=256"),
    # ---- non-positive sizes ----
    case("steps-zero", "training.steps=0",
         "training.steps=0", "must be positive", "value > 0"),
    case("seq-len-negative", "training.seq_len=-8",
         "training.seq_len=-8", "must be positive", "value > 0"),
    case("micro-batch-zero", "training.micro_batch_size=0",
         "training.micro_batch_size=0", "must be positive", "value > 0"),
    case("n-layers-zero", "model.n_layers=0",
         "model.n_layers=0", "must be positive", "value > 0"),
    case("ffn-dim-negative", "model.ffn_dim=-1",
         "model.ffn_dim=-1", "must be positive", "value > 0"),
    case("lr-zero", "optim.lr=0",
         "optim.lr=0", "must be positive", "value > 0"),
    case("lr-negative", "optim.lr=-1e-3",
         "optim.lr=-0.001", "must be positive", "value > 0"),
    case("beta2-one", "optim.beta2=1.0",
         "optim.beta2=1.0", "within [0, 1)", "0.95"),
    case("keep-last-zero", "checkpoint.keep_last=0",
         "checkpoint.keep_last=0", "must be >= 1", "keep at least 1"),
    # ---- non-finite floats (nan passes `value <= 0`) and missing ranges ----
    case("lr-inf", "optim.lr=inf", "optim.lr=inf", "must be a finite number", "default 0.003"),
    case("lr-overflows-to-inf", "optim.lr=1e999", "optim.lr=inf", "finite number"),
    case("lr-nan", "optim.lr=nan", "optim.lr=nan", "finite number", "finite value"),
    case("weight-decay-nan", "optim.weight_decay=nan", "optim.weight_decay=nan", "finite"),
    case("grad-clip-nan", "optim.grad_clip=nan", "optim.grad_clip=nan", "finite"),
    case("grad-clip-inf", "optim.grad_clip=inf", "optim.grad_clip=inf", "finite", "default 1.0"),
    case("beta1-nan-one-problem", "optim.beta1=nan", "optim.beta1=nan", "finite"),
    case("eps-nan", "optim.eps=nan", "optim.eps=nan", "finite"),
    case("eps-zero", "optim.eps=0", "optim.eps=0.0", "must be positive"),
    case("norm-eps-nan", "model.norm_eps=nan", "model.norm_eps=nan", "finite"),
    case("init-std-inf", "model.init_std=inf", "model.init_std=inf", "finite"),
    case("rope-theta-nan", "model.rope_theta=nan", "model.rope_theta=nan", "finite"),
    case("min-lr-ratio-nan", "schedule.min_lr_ratio=nan", "schedule.min_lr_ratio=nan", "finite"),
    case("wsd-decay-fraction-inf", "schedule=wsd schedule.decay_fraction=inf",
         "schedule.decay_fraction=inf", "finite"),
    case("loss-scale-nan", "precision.loss_scale_init=nan", "precision.loss_scale_init=nan",
         "finite"),
    case("loss-scale-zero", "precision.loss_scale_init=0", "precision.loss_scale_init=0.0",
         "must be positive", "65536"),
    case("cpu-peak-flops-inf", "training.cpu_peak_flops=inf", "training.cpu_peak_flops=inf",
         "finite"),
    case("hang-timeout-zero", "training.hang_timeout_s=0", "training.hang_timeout_s=0",
         "must be > 0 seconds, or -1", "hang_timeout_s=600"),
    case("hang-timeout-nan", "training.hang_timeout_s=nan", "training.hang_timeout_s=nan",
         "finite"),
    case("compute-capability-nan", "cluster.gpu_compute_capability=nan",
         "cluster.gpu_compute_capability=nan", "finite"),
    case("seed-negative", "training.seed=-1", "training.seed=-1", "must be within [0,",
         "non-negative seed"),
    case("many-non-finite-at-once", "optim.lr=inf optim.weight_decay=nan model.norm_eps=-inf",
         "optim.lr=inf", "optim.weight_decay=nan", "model.norm_eps=-inf", problems=3),
    # ---- schedule ----
    case("warmup-longer-than-run", "training.steps=100 schedule.warmup_steps=150",
         "schedule.warmup_steps=150", "exceeds training.steps=100",
         "set schedule.warmup_steps=10 (or -1 for auto)", "training.steps to at least 150"),
    case("warmup-negative", "schedule.warmup_steps=-5",
         "schedule.warmup_steps=-5", "must be >= 0", "value >= 0"),
    case("wsd-warmup-plus-decay-exceed-steps",
         "schedule=wsd training.steps=100 schedule.warmup_steps=90",
         "schedule.decay_fraction=0.2", "warmup (90) + decay (20)",
         "exceed training.steps=100", "shorten warmup", "schedule.warmup_steps=80"),
    case("wsd-decay-fraction-zero", "schedule=wsd schedule.decay_fraction=0",
         "schedule.decay_fraction=0.0", "within (0, 1]", "last 20%"),
    case("min-lr-ratio-above-one", "schedule.min_lr_ratio=1.5",
         "schedule.min_lr_ratio=1.5", "within [0, 1]", "tenth of the peak"),
    case("min-lr-ratio-negative", "schedule.min_lr_ratio=-0.1",
         "schedule.min_lr_ratio=-0.1", "within [0, 1]", "tenth of the peak"),
    case("stop-at-step-beyond-steps", "training.steps=100 training.stop_at_step=150",
         "training.stop_at_step=150", "within [0, training.steps=100]", "step within the run"),
    # ---- precision and device against the host ----
    case("fp8-on-cpu", "precision=fp8",
         "precision=fp8", "compute capability >= 8.9", "CPU", "precision=bf16"),
    case("fp8-on-a100", "precision=fp8",
         "precision=fp8", "compute capability >= 8.9", "A100", "cc 8.0", "precision=bf16",
         host=A100),
    case("fp8-on-a100-slurm-cluster", "cluster=slurm cluster.gpu_name=A100 precision=fp8",
         "precision=fp8", "compute capability >= 8.9", "A100", "cc 8.0", "precision=bf16"),
    case("ops-alternate-with-experts", "model=tiny_moe recompute=selective_alternate",
         "recompute.ops_matmuls=alternate", "model.family=moe routes tokens",
         "recompute.ops_matmuls=all"),
    case("moe-capacity-under-sequence-parallel",
         "model=tiny_moe model.moe.capacity_factor=1.25 parallel=tp cluster.procs_per_node=2",
         "model.moe.capacity_factor=1.25", "parallel.tp=2 and sequence parallel",
         "its share of the sequence", "capacity_factor=null",
         "parallel.sequence_parallel=false"),
    case("bf16-on-v100", "precision=bf16",
         "precision=bf16", "compute capability >= 8.0", "V100", "7.0", "precision=fp16",
         host=V100),
    case("cuda-without-gpu", "training.device=cuda",
         "training.device=cuda", "needs a CUDA GPU", "this machine has none",
         "training.device=auto or cpu"),
    # ---- data and checkpoint paths ----
    case("data-files-glob-matches-nothing",
         f"data=files data.train_files={TMP}/train-*.npy data.val_files={TMP}/val-*.npy",
         f"data.train_files={TMP}/train-*.npy", f"data.val_files={TMP}/val-*.npy",
         "matches no file", "check the path or glob", problems=2),
    case("data-files-without-path", "data=files",
         "data.train_files", "data.val_files", "is required with data=files",
         "set data.train_files=/path/or/glob", problems=2),
    case("data-files-unknown-dtype",
         f"data=files data.train_files={TMP}/x.bin data.val_files={TMP}/x.bin data.dtype=float8",
         "data.dtype=float8", "unknown token dtype", "uint16", problems=3),
    case("resume-from-not-a-run-dir", f"checkpoint.resume_from={TMP}",
         f"checkpoint.resume_from={TMP}", "not a meshrun run dir", "no spec.json",
         "meshrun run"),
    # ---- numbers within bounds that mean something (int64, context, cores) ----
    case("steps-beyond-int64", "training.steps=9223372036854775808",
         "training.steps=9223372036854775808", "about 2^63", "signed 64-bit", "default 120"),
    case("steps-2-to-the-80", "training.steps=1208925819614629174706176",
         "training.steps=1208925819614629174706176", "about 2^80", "signed 64-bit"),
    case("negative-int-beyond-int64", "training.seed=-9223372036854775809",
         "training.seed=-9223372036854775809", "signed 64-bit"),
    case("token-count-overflows-int64", "training.steps=922337203685477580",
         "training.steps=922337203685477580", "int64 token counter", "training.steps<="),
    case("seq-len-2-to-the-40",
         "model.max_seq_len=1099511627776 training.seq_len=1099511627776",
         "training.seq_len=1099511627776", "model.max_seq_len=1099511627776", "2^24",
         "longer than any context", problems=2),
    case("cpu-ranks-far-beyond-cores", "cluster.procs_per_node=4096",
         "cluster.procs_per_node=4096", "8 core(s)", "at most 32",
         "cluster.procs_per_node<=32"),
    case("negative-gpus-per-node",
         "cluster=slurm cluster.gpus_per_node=-8 cluster.gpu_name=H100",
         "cluster.gpus_per_node=-8", "must be >= 0", "e.g. 8"),
    case("runs-dir-on-proc", "runs_dir=/proc/meshrun-runs",
         "runs_dir=/proc/meshrun-runs", "proc file system", "on a disk"),
    case("cache-dir-on-sysfs", "data.cache_dir=/sys/meshrun",
         "data.cache_dir=/sys/meshrun", "sysfs", "on a disk"),
    case("mixture-weight-nan", "data.weights=[nan,1.0]",
         "data.weights=[nan, 1.0]", "finite", "found nan", "[0.7,0.3]"),
    case("mixture-weight-inf", "data.weights=[1.0,inf]",
         "data.weights=[1.0, inf]", "finite", "found inf"),
    # ---- several problems at once: all reported in one error ----
    case("many-problems-at-once",
         "training.steps=300 model.n_kv_heads=3 training.seq_len=4096 "
         "schedule.warmup_steps=400 schedule.min_lr_ratio=2 optim.lr=0 "
         "training.stop_at_step=500 precision=fp8 "
         "parallel.dp_replicate=3 cluster.procs_per_node=2",
         "Invalid run config (8 problems)", "model.n_kv_heads=3", "training.seq_len=4096",
         "schedule.warmup_steps=400", "schedule.min_lr_ratio=2.0", "optim.lr=0.0",
         "training.stop_at_step=500", "precision=fp8", "!= world size 2", problems=8),
]


def _fill(text: str, tmp_path) -> str:
    return text.replace(TMP, str(tmp_path))


def _error_for(overrides: list[str], host: HostSpec) -> ConfigError:
    with pytest.raises(ConfigError) as info:
        resolve(compose_config(overrides), host=host)
    return info.value


@pytest.mark.parametrize("c", CASES, ids=[c.id for c in CASES])
def test_bad_config_is_refused_with_an_actionable_message(c: Case, tmp_path):
    err = _error_for([_fill(o, tmp_path) for o in c.overrides], c.host)
    message = str(err)
    missing = [s for s in (_fill(e, tmp_path) for e in c.expect) if s not in message]
    assert not missing, f"message lacks {missing}:\n{message}"
    if c.problems is not None:
        assert len(err.problems) == c.problems, message
        assert f"({c.problems} problem" in message.splitlines()[0]
    assert all(p.fix for p in err.problems), f"a problem without a fix:\n{message}"
    assert "Traceback" not in message


def test_corpus_is_large_and_ids_unique():
    assert len(CASES) >= 30
    assert len({c.id for c in CASES}) == len(CASES)


@pytest.mark.parametrize("host,overrides", [
    (CPU, []),
    (CPU, ["model=tiny", "parallel=single", "schedule=wsd", "precision=fp32"]),
    (A100, ["model=llama3_8b", "training.seq_len=8192", "training.micro_batch_size=1",
            "training.global_batch_size=64"]),
    (H100, ["precision=fp8", "recompute=selective"]),
    (V100, ["precision=fp16"]),
    (CPU, ["model=tiny", "parallel.dp_replicate=2", "parallel.tp=2", "cluster.procs_per_node=4"]),
    (H100, ["parallel=fsdp_tp", "parallel.tp=2", "precision=fp8"]),
], ids=["cpu-defaults", "cpu-tiny-single-wsd", "a100-llama3-8b", "h100-fp8", "v100-fp16",
        "ddp-with-tp", "h100-fp8-with-tp"])
def test_valid_config_raises_nothing(host: HostSpec, overrides: list[str]):
    spec = resolve(compose_config(overrides), host=host)
    assert spec.world_size == spec.parallel.world_size
    assert (spec.training.global_batch_size == spec.training.micro_batch_size
            * spec.training.grad_accum_steps * spec.parallel.dp)


def test_auto_precision_picks_per_host():
    cfg = compose_config([])
    assert resolve(cfg, host=CPU).precision.name == "fp32"
    assert resolve(cfg, host=A100).precision.name == "bf16"
    assert resolve(cfg, host=V100).precision.name == "fp16"


def test_cuda_without_gpu_reports_only_the_device():
    """No second problem about procs_per_node (a value the user never set, 'fix: <=0')."""
    err = _error_for(["training.device=cuda"], CPU)
    assert "<=0" not in str(err)
    assert [p.key for p in err.problems] == ["training.device"]


def test_every_float_knob_is_finite_checked_without_being_named():
    """The finite check walks the schema: a float field nobody listed is covered too."""
    from dataclasses import dataclass, field

    from conf.errors import ProblemList
    from conf.rules.field_rules import finite_floats

    @dataclass
    class NewSection:
        brand_new_ratio: float = 0.5
        count: int = 3

    @dataclass
    class Cfg:
        new: NewSection = field(default_factory=NewSection)

    problems = ProblemList()
    fixed = finite_floats(Cfg(new=NewSection(brand_new_ratio=float("nan"))), problems)
    assert [p.key for p in problems.items] == ["new.brand_new_ratio"]
    assert fixed.new.brand_new_ratio == 0.5 and fixed.new.count == 3


def test_fp8_with_cuda_on_a_gpu_less_host_names_no_empty_gpu():
    err = _error_for(["precision=fp8", "training.device=cuda"], CPU)
    assert " on  (cc 0.0)" not in str(err)
    assert "no CUDA GPU" in str(err)


def test_a_cluster_gpu_model_gives_its_compute_capability():
    """cluster.gpu_compute_capability=0 (slurm's default) takes the named model's, so the
    precision rules judge the GPUs the job will get; an unknown model is not judged."""
    assert known_compute_capability("A100 80GB") == 8.0
    assert known_compute_capability("NVIDIA H100 80GB HBM3") == 9.0
    assert known_compute_capability("MI300X") == 0.0
    spec = resolve(compose_config(["cluster=slurm", "cluster.gpu_name=MI300X",
                                   "precision=bf16"]), host=CPU)
    assert spec.host.compute_capability == 0.0
    explicit = resolve(compose_config(["cluster=slurm", "cluster.gpu_name=A100",
                                       "cluster.gpu_compute_capability=9.0",
                                       "precision=fp8"]), host=CPU)
    assert explicit.host.compute_capability == 9.0
