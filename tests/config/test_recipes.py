"""Every shipped model has a recipe (`+experiment=<name>`, conf/experiment/) that composes and
resolves on this machine's default cluster and on the Slurm cluster it was published for,
with the sequence length, tokens per step, peak LR, warmup and schedule its source gives
(the source is the comment at the top of each recipe file)."""
from __future__ import annotations

from pathlib import Path

import pytest

from conf.compose import compose_config
from conf.overrides import group_options
from conf.resolve import HF_MODEL_OPTION, resolve
from conf.spec import HostSpec

CPU = HostSpec(gpu_name="", gpu_count=0, compute_capability=0.0, cpu_count=8)
EXPERIMENTS = Path(__file__).resolve().parents[2] / "conf" / "experiment"

# model option -> (recipe, seq_len, tokens per step, peak lr, warmup steps, schedule)
RECIPES = {
    "llama3_1b": ("llama3_1b", 8192, 524_288, 3e-4, 200, "linear"),
    "llama3_3b": ("llama3_3b", 8192, 524_288, 3e-4, 200, "linear"),
    "llama3_8b": ("llama3_8b", 8192, 524_288, 3e-4, 200, "linear"),
    "llama3_70b": ("llama3_70b", 8192, 524_288, 1.5e-4, 200, "linear"),
    "qwen2_5_0_5b": ("qwen2_5_0_5b", 4096, 131_072, 3e-4, 200, "linear"),
    "qwen2_5_1_5b": ("qwen2_5_1_5b", 4096, 131_072, 3e-4, 200, "linear"),
    "qwen2_5_7b": ("qwen2_5_7b", 4096, 262_144, 3e-4, 200, "linear"),
    "qwen2_5_32b": ("qwen2_5_32b", 4096, 65_536, 8e-4, 600, "linear"),
    "debug": ("debug", 128, 4096, 3e-3, 10, "cosine"),
    "tiny": ("smoke", 64, 1024, 3e-3, 2, "cosine"),
    "qwen3_moe_30b_a3b": ("qwen3_moe_30b_a3b", 4096, 262_144, 3e-4, 200, "linear"),
    "mixtral_8x7b": ("mixtral_8x7b", 32768, 524_288, 3e-4, 200, "linear"),
    "deepseek_v3_671b": ("deepseek_v3_671b", 4096, 62_914_560, 2.2e-4, 2000, "wsd"),
    "tiny_moe": ("smoke_moe", 64, 1024, 3e-3, 2, "cosine"),
}
FINETUNE = "finetune"  # model=hf's recipe; it sets no model of its own
PUBLISHED_CLUSTER = {"llama3_8b": 8, "llama3_70b": 8, "llama3_1b": 8, "llama3_3b": 8,
                     "qwen2_5_7b": 8}  # the nodes of 8 GPUs their source ran on; else 1


def test_every_model_has_a_recipe():
    models = set(group_options("model")) - {HF_MODEL_OPTION}
    assert set(RECIPES) == models
    recipes = {name for name, *_ in RECIPES.values()} | {FINETUNE}
    assert recipes <= set(group_options("experiment"))


@pytest.mark.parametrize("model", sorted(RECIPES))
def test_recipe_resolves_with_its_published_numbers(model: str):
    recipe, seq, tokens, lr, warmup, schedule = RECIPES[model]
    spec = resolve(compose_config([f"+experiment={recipe}", "logging=disabled"]), host=CPU,
                   check_paths=False)
    t = spec.training
    assert spec.model.name == model
    assert (t.seq_len, t.global_batch_size * t.seq_len) == (seq, tokens)
    assert spec.optim.lr == pytest.approx(lr)
    assert (spec.schedule.warmup_steps, spec.schedule.kind.value) == (warmup, schedule)
    assert spec.schedule.warmup_steps < t.steps


@pytest.mark.parametrize("model", sorted(PUBLISHED_CLUSTER))
def test_recipe_plans_on_the_cluster_it_was_published_for(model: str):
    from parallel.cost.plan import make_plan

    recipe = RECIPES[model][0]
    nodes = PUBLISHED_CLUSTER[model]
    spec = resolve(compose_config([f"+experiment={recipe}", "logging=disabled", "cluster=slurm",
                                   f"cluster.nodes={nodes}"]), host=CPU, check_paths=False)
    assert spec.world_size == 8 * nodes
    assert make_plan(spec).verdict.fits


def test_finetune_recipe_on_a_shipped_model():
    spec = resolve(compose_config([f"+experiment={FINETUNE}", "model=llama3_1b",
                                   "logging=disabled"]), host=CPU, check_paths=False)
    assert (spec.optim.lr, spec.schedule.kind.value) == (2e-5, "constant")
    assert spec.model.name == "llama3_1b"


@pytest.mark.parametrize("recipe", sorted({r for r, *_ in RECIPES.values()} - {"smoke", "smoke_moe", "debug"}))
def test_recipe_names_its_source(recipe: str):
    head = (EXPERIMENTS / f"{recipe}.yaml").read_text().split("defaults:")[0]
    assert "@" in head and ("torchtitan" in head or "arXiv" in head), head
