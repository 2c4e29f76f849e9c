"""Every shipped config composes and resolves, and the published model shapes have the published
parameter counts (Hugging Face config.json / model cards)."""
from __future__ import annotations

import pytest

from conf.compose import compose_config
from conf.overrides import GROUPS, group_options
from conf.resolve import HF_MODEL_OPTION, resolve
from conf.spec import HostSpec, ModelSpec, RunSpec
from parallel.cost.flops import FLOPS_CONVENTION, flops_per_token
from parallel.cost.params import param_counts

CPU = HostSpec(gpu_name="", gpu_count=0, compute_capability=0.0, cpu_count=8)
A100 = HostSpec(gpu_name="NVIDIA A100-SXM4-80GB", gpu_count=8, compute_capability=8.0,
                cpu_count=64)
H100 = HostSpec(gpu_name="NVIDIA H100 80GB HBM3", gpu_count=8, compute_capability=9.0,
                cpu_count=96)

# n_layers, dim, n_heads, n_kv_heads, ffn_dim, vocab_size, max_seq_len, rope_theta, tied
SHAPES = {
    "debug": (4, 128, 4, 2, 384, 256, 1024, 10000.0, False),
    "tiny": (2, 64, 4, 2, 128, 256, 256, 10000.0, False),
    "llama3_1b": (16, 2048, 32, 8, 8192, 128256, 131072, 500000.0, True),
    "llama3_3b": (28, 3072, 24, 8, 8192, 128256, 131072, 500000.0, True),
    "llama3_8b": (32, 4096, 32, 8, 14336, 128256, 131072, 500000.0, False),
    "llama3_70b": (80, 8192, 64, 8, 28672, 128256, 131072, 500000.0, False),
    "qwen2_5_0_5b": (24, 896, 14, 2, 4864, 151936, 32768, 1000000.0, True),
    "qwen2_5_1_5b": (28, 1536, 12, 2, 8960, 151936, 32768, 1000000.0, True),
    "qwen2_5_7b": (28, 3584, 28, 4, 18944, 152064, 131072, 1000000.0, False),
    "qwen2_5_32b": (64, 5120, 40, 8, 27648, 152064, 131072, 1000000.0, False),
    "tiny_moe": (3, 64, 4, 2, 128, 256, 256, 10000.0, False),
    "qwen3_moe_30b_a3b": (48, 2048, 32, 4, 6144, 151936, 40960, 1000000.0, False),
    "mixtral_8x7b": (32, 4096, 32, 8, 14336, 32000, 32768, 1000000.0, False),
    "deepseek_v3_671b": (61, 7168, 128, 64, 18432, 129280, 163840, 10000.0, False),
}
EXTRA_OVERRIDES = {"deepseek_v3_671b": ["checkpoint.export_safetensors=false"]}
"""Shapes Hugging Face cannot load as exported (see the option's yaml)."""
SHAPE_FIELDS = ("n_layers", "dim", "n_heads", "n_kv_heads", "ffn_dim", "vocab_size",
                "max_seq_len", "rope_theta", "tie_embeddings")

# Published totals, exact (safetensors of the Hugging Face checkpoints).
PUBLISHED_PARAMS = {
    "llama3_1b": 1_235_814_400,    # Llama 3.2 1B  ~1.236B
    "llama3_3b": 3_212_749_824,    # Llama 3.2 3B  ~3.213B
    "llama3_8b": 8_030_261_248,    # Llama 3.1 8B  ~8.030B
    "llama3_70b": 70_553_706_496,  # Llama 3.1 70B ~70.55B
    "qwen2_5_0_5b": 494_032_768,   # Qwen2.5 0.5B  ~0.494B
    "qwen2_5_1_5b": 1_543_714_304,  # Qwen2.5 1.5B ~1.544B
    "qwen2_5_7b": 7_615_616_512,   # Qwen2.5 7B    ~7.616B
    "qwen2_5_32b": 32_763_876_352,  # Qwen2.5 32B  ~32.76B
}
REL_TOL = 0.005


@pytest.fixture(scope="module")
def model_specs() -> dict[str, RunSpec]:
    """Each shipped model composed once with every other group at its default, on a CPU host."""
    return {name: resolve(compose_config([f"model={name}", *EXTRA_OVERRIDES.get(name, [])]),
                          host=CPU)
            for name in shipped_shapes()}


def shipped_shapes() -> list[str]:
    """Model options with a shape of their own (model=hf reads one from a folder: its tests
    are tests/unit/test_hf_import.py)."""
    return [name for name in group_options("model") if name != HF_MODEL_OPTION]


def qkv_bias_params(m: ModelSpec) -> int:
    """Qwen2.5 has biases on q, k and v (not on o)."""
    return m.n_layers * (m.n_heads * m.head_dim + 2 * m.n_kv_heads * m.head_dim)


def test_every_model_option_has_a_row_here():
    assert set(shipped_shapes()) == set(SHAPES)
    assert HF_MODEL_OPTION in group_options("model")
    assert set(PUBLISHED_PARAMS) <= set(SHAPES)


@pytest.mark.parametrize("name", sorted(SHAPES))
def test_model_resolves_to_its_shape(name: str, model_specs):
    spec = model_specs[name]
    got = tuple(getattr(spec.model, f) for f in SHAPE_FIELDS)
    assert dict(zip(SHAPE_FIELDS, got)) == dict(zip(SHAPE_FIELDS, SHAPES[name]))
    assert spec.model.name == name
    assert spec.name == name  # config.yaml: name defaults to ${model.name}
    assert spec.model.dim % spec.model.n_heads == 0
    assert spec.model.n_heads % spec.model.n_kv_heads == 0
    assert spec.model.head_dim % 2 == 0
    assert spec.precision.name == "fp32" and spec.training.device == "cpu"


@pytest.mark.parametrize("name", sorted(PUBLISHED_PARAMS))
def test_param_count_matches_published(name: str, model_specs):
    model = model_specs[name].model
    # The formula is exact, Qwen's q/k/v biases (model.attention_bias) included.
    assert param_counts(model).total == PUBLISHED_PARAMS[name]
    assert model.attention_bias is name.startswith("qwen")


def test_qwen_biases_are_counted():
    """Without its q/k/v biases a Qwen2.5 would be short by exactly their count."""
    for name in ("qwen2_5_0_5b", "qwen2_5_1_5b", "qwen2_5_7b", "qwen2_5_32b"):
        m = ModelSpec(name=name, **dict(zip(SHAPE_FIELDS, SHAPES[name])), norm_eps=1e-6,
                      init_std=0.02)
        assert param_counts(m).total + qkv_bias_params(m) == PUBLISHED_PARAMS[name]


@pytest.mark.parametrize(("name", "factor"), [("llama3_1b", 32.0), ("llama3_3b", 32.0),
                                              ("llama3_8b", 8.0), ("llama3_70b", 8.0)])
def test_llama3_models_scale_rope_as_published(name: str, factor: float, model_specs):
    rope = model_specs[name].model.llama3_rope
    assert (rope.factor, rope.low_freq_factor, rope.high_freq_factor,
            rope.original_max_seq_len) == (factor, 1.0, 4.0, 8192)


def test_tied_models_count_the_embedding_once(model_specs):
    tied = model_specs["llama3_1b"].model
    counts = param_counts(tied)
    assert counts.embedding == 128256 * 2048
    # 16 blocks + final norm + one shared embedding/output matrix
    block = 2048 * 2048 * 2 + 2048 * 512 * 2 + 3 * 2048 * 8192 + 2 * 2048
    assert counts.total == 16 * block + 2048 + 128256 * 2048


def test_flops_per_token_llama3_8b_at_8192():
    model = resolve(compose_config(["model=llama3_8b", "training.seq_len=8192"]),
                    host=CPU).model
    # N excludes the token embedding (128256 x 4096) but keeps the untied output head.
    n = 8_030_261_248 - 128_256 * 4_096
    assert n == 7_504_924_672
    layers, heads, head_dim, seq = 32, 32, 128, 8192
    attention = 12 * layers * heads * head_dim * seq
    assert attention == 12_884_901_888
    want = 6 * n + attention
    assert want == 57_914_449_920
    assert flops_per_token(model, 8192) == want
    assert "6N + 12*L*H*Q*T" in FLOPS_CONVENTION


def test_flops_per_token_counts_the_tied_output_head():
    """Llama 3.2 1B ties its head to the embedding; the head's matmul still runs."""
    model = resolve(compose_config(["model=llama3_1b", "training.seq_len=8192"]),
                    host=CPU).model
    block = 2048 * 2048 * 2 + 2048 * 512 * 2 + 3 * 2048 * 8192 + 2 * 2048
    n = 16 * block + 2048 + 128256 * 2048  # blocks, final norm, the (shared) head
    assert flops_per_token(model, 8192) == 6 * n + 12 * 16 * 32 * 64 * 8192


# Every option of every non-model group, composed once (models are covered above). The
# defaults (auto, ddp, none, cosine, adamw, stdlib, local, offline) are composed by every model.
DEFAULTS = {"precision": "auto", "parallel": "ddp", "recompute": "none", "schedule": "cosine",
            "optim": "adamw", "data": "stdlib", "cluster": "local", "logging": "offline"}
OPTIONS = [(g, o) for g in GROUPS if g != "model" for o in group_options(g) if DEFAULTS[g] != o]


def test_defaults_table_matches_config_yaml(model_specs):
    spec = model_specs["debug"]
    assert spec.parallel.name == DEFAULTS["parallel"]
    assert spec.recompute.mode.value == DEFAULTS["recompute"]
    assert spec.schedule.kind.value == DEFAULTS["schedule"]
    assert spec.optim.name == DEFAULTS["optim"]
    assert spec.data.kind.value == DEFAULTS["data"]
    assert spec.cluster.kind == DEFAULTS["cluster"]
    assert spec.logging.wandb_mode.value == DEFAULTS["logging"]
    assert set(DEFAULTS) == set(GROUPS) - {"model"}


def _recompute_option(spec: RunSpec) -> str:
    """The recompute file a spec came from: the mode, plus what makes the variant."""
    r = spec.recompute
    if r.every_n_layers > 1:
        return f"{r.mode.value}_every{r.every_n_layers}"
    if r.mode.value == "selective" and r.targets != ("ops",):
        return f"selective_{'_'.join(r.targets)}"
    if r.mode.value == "selective" and r.ops_matmuls.value != "all":
        return f"selective_{r.ops_matmuls.value}"
    return r.mode.value


def _chosen(spec: RunSpec, group: str) -> str:
    return {
        "precision": spec.precision.name, "parallel": spec.parallel.name,
        "recompute": _recompute_option(spec), "schedule": spec.schedule.kind.value,
        "optim": spec.optim.name, "data": spec.data.kind.value, "cluster": spec.cluster.kind,
        "logging": spec.logging.wandb_mode.value,
    }[group]


@pytest.mark.parametrize("group,option", OPTIONS, ids=[f"{g}={o}" for g, o in OPTIONS])
def test_every_group_option_composes(group: str, option: str, tmp_path):
    overrides = [f"{group}={option}"]
    host = H100 if (group, option) == ("precision", "fp8") else CPU
    if (group, option) == ("data", "files"):
        for split in ("train", "val"):
            (tmp_path / f"{split}-000.bin").write_bytes(b"\5\0" * 300)  # 300 uint16 ids
        overrides += [f"data.train_files={tmp_path}/train-*.bin",
                      f"data.val_files={tmp_path}/val-*.bin"]
    if (group, option) == ("cluster", "nodes"):
        overrides += ["cluster.rdzv_host=10.0.0.1"]  # required: node 0's address
    if group == "parallel" and option in PRESET_WORLD:
        overrides += [f"cluster.procs_per_node={PRESET_WORLD[option][0]}"]
    if group == "parallel":
        overrides += PRESET_MODEL.get(option, [])
    spec = resolve(compose_config(overrides), host=host)
    assert _chosen(spec, group) == option
    if (group, option) == ("data", "files"):
        assert spec.data.train_files == (str(tmp_path / "train-000.bin"),)
        assert spec.data.val_files == (str(tmp_path / "val-000.bin"),)


# Layout presets that need more than the CPU default of 2 processes: (world, degrees it yields).
PRESET_WORLD = {
    "hsdp": (4, dict(dp_replicate=2, dp_shard=2, zero=3)),
    "fsdp_tp": (4, dict(dp_shard=2, tp=2, zero=3)),
    "3d": (8, dict(pp=2, dp_shard=2, tp=2, zero=3)),
    "4d": (16, dict(pp=2, dp_shard=2, cp=2, tp=2, zero=3)),
}
TWO_RANK_PRESETS = {
    "zero1": dict(dp_shard=2, zero=1), "zero2": dict(dp_shard=2, zero=2),
    "zero3": dict(dp_shard=2, zero=3), "fsdp": dict(dp_shard=2, zero=3),
    "tp": dict(tp=2), "pp": dict(pp=2), "cp": dict(cp=2), "ep": dict(dp_shard=2, zero=3, ep=2),
}
PRESET_MODEL = {"ep": ["model=tiny_moe"]}
"""Layout presets for one kind of model (expert parallelism: a mixture-of-experts model)."""


@pytest.mark.parametrize("preset", [*TWO_RANK_PRESETS, *PRESET_WORLD])
def test_layout_presets_give_the_degrees_they_claim(preset: str):
    world, degrees = PRESET_WORLD.get(preset, (2, TWO_RANK_PRESETS.get(preset)))
    spec = resolve(compose_config([f"parallel={preset}", f"cluster.procs_per_node={world}",
                                   *PRESET_MODEL.get(preset, [])]), host=CPU)
    got = {k: getattr(spec.parallel, k) for k in degrees}
    assert got == degrees
    assert spec.parallel.world_size == spec.world_size == world


@pytest.mark.parametrize("parallel,host,world", [
    ("ddp", CPU, 2), ("ddp", A100, 8), ("single", CPU, 1), ("single", A100, 1),
], ids=["ddp-cpu", "ddp-8gpu", "single-cpu", "single-8gpu"])
def test_parallel_options_claim_their_world_size(parallel: str, host: HostSpec, world: int):
    spec = resolve(compose_config([f"parallel={parallel}"]), host=host)
    assert spec.world_size == spec.parallel.world_size == spec.parallel.dp == world
