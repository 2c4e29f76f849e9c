"""The model-family seam (training/models/): a second, test-only family (tests/support/toy_family,
GPT-2-style: LayerNorm with biases, fused q/k/v, GELU MLP) is its folder plus its name, and
resolves, plans, builds, recomputes and trains a step like the shipped Llama family. Its
two-rank layouts: tests/distributed/test_toy_family_parity.py."""
from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
import torch

from conf.errors import ConfigError
from parallel.cost.flops import flops_per_token
from parallel.cost.params import param_counts, parameter_shapes, tp_local_shape
from parallel.cost.plan import make_plan
from tests.support.specs import cpu_spec
from tests.support.toy_family import NAME as TOY
from training.model_builder import build_model, count_params
from training.models import family_of, model_family

REPO = Path(__file__).resolve().parents[2]
TOY_MODEL = ("model=tiny", f"model.family={TOY}", "model.n_kv_heads=-1", "data=synthetic",
             "training.seq_len=32", "training.micro_batch_size=2")
CPU = torch.device("cpu")


def test_the_toy_family_resolves_and_refuses_what_it_does_not_compute():
    spec = cpu_spec(*TOY_MODEL)
    assert family_of(spec.model).name == "toy"
    assert cpu_spec("model=tiny").model.family == "llama"
    with pytest.raises(ConfigError) as refused:
        cpu_spec(*TOY_MODEL[:2], "model.n_kv_heads=2", "recompute=selective",
                 "recompute.targets=[swiglu]")
    message = str(refused.value)
    assert "model.n_kv_heads=2" in message and "nothing to re-run for swiglu" in message
    with pytest.raises(ConfigError, match="model.family=nope: is not a model family"):
        cpu_spec("model.family=nope")


@pytest.mark.parametrize("name", ["../x", ".relative.path", "a..b", "no_such.module", "conf.spec"])
def test_a_family_named_by_a_path_that_is_not_a_family_module_is_a_config_error(name):
    """A relative or malformed path, a missing module, a module without FAMILY: the one
    message, never a traceback from importlib."""
    with pytest.raises(ConfigError, match="is not a model family"):
        cpu_spec(f"model.family={name}")


@pytest.mark.parametrize("tied", [False, True])
def test_the_cost_model_counts_the_toy_table_as_the_built_module(tied):
    spec = cpu_spec(*TOY_MODEL, f"model.tie_embeddings={str(tied).lower()}")
    model = build_model(spec.model, device=torch.device("meta"), seed=0)
    assert [(n, tuple(p.shape)) for n, p in model.named_parameters()] == \
        list(parameter_shapes(spec.model))
    total, embedding = count_params(model)
    assert (param_counts(spec.model).total, param_counts(spec.model).embedding) == \
        (total, embedding)
    plan = make_plan(spec)
    assert plan.params.total == total and plan.memory.total > 0
    assert flops_per_token(spec.model, 32) > 6 * (total - embedding)


def test_the_toy_tp_table_splits_whole_heads():
    spec = cpu_spec(*TOY_MODEL)
    shapes = dict(parameter_shapes(spec.model))
    qkv = shapes["layers.0.attn.c_attn.weight"]
    assert tp_local_shape("layers.0.attn.c_attn.weight", qkv, 2, TOY) == (qkv[0] // 2, qkv[1])
    assert tp_local_shape("layers.0.attn.c_attn.bias", (qkv[0],), 2, TOY) == (qkv[0] // 2,)
    assert tp_local_shape("layers.0.mlp.c_proj.weight", shapes["layers.0.mlp.c_proj.weight"],
                          2, TOY)[1] == spec.model.ffn_dim // 2
    assert tp_local_shape("layers.0.mlp.c_proj.bias", (spec.model.dim,), 2, TOY) == \
        (spec.model.dim,)
    assert tp_local_shape("wte.weight", shapes["wte.weight"], 2, TOY)[0] == \
        spec.model.vocab_size // 2


def _one_step(spec):
    """(loss, grads, model) of one AdamW step in one process, under the spec's recompute."""
    from parallel.recompute import apply_recompute
    from training.data.build import build_train_batches
    from training.optim import build_optimizer
    from training.parallel_model import ParallelModel
    from training.step import clip_and_step, forward_backward

    model = build_model(spec.model, device=CPU, seed=spec.training.seed)
    apply_recompute(model, recompute=spec.recompute)
    layout = ParallelModel.single(model)
    optimizer = build_optimizer(model, optim=spec.optim,
                                state_dtype=spec.precision.optimizer_state_dtype)
    batches = build_train_batches(spec.data, spec.training, dp_rank=0, dp_size=1).next_step()
    loss = forward_backward(layout, batches, device=CPU,
                            autocast=torch.autocast("cpu", enabled=False))
    grads = {n: p.grad.detach().clone() for n, p in model.named_parameters()}
    clip_and_step(layout, [optimizer], grad_clip=spec.optim.grad_clip)
    return float(loss.local_loss_sum) / loss.global_tokens, grads, model


def test_the_toy_family_trains_a_step_and_recompute_keeps_its_gradients():
    one = (*TOY_MODEL, "cluster.procs_per_node=1")
    loss, grads, model = _one_step(cpu_spec(*one))
    assert 4.0 < loss < 7.0  # about ln(256) from the initialisation
    assert all(torch.isfinite(g).all() and g.abs().sum() > 0 for g in grads.values())
    fresh = build_model(cpu_spec(*one).model, device=CPU, seed=0)
    for name, param in fresh.named_parameters():  # init by the family's names
        if name.endswith(model_family(TOY).init_ones):
            assert torch.all(param == 1), name
        elif name.endswith(".bias"):
            assert torch.all(param == 0), name
        else:
            assert 0.005 < param.std() < 0.03, name
    swaps = {"[attention,ffn,norm]": {"RecomputeCoreToyAttention", "RecomputeToyMLP",
                                      "RecomputeLayerNorm"},
             "[ops]": {"RecomputeToyBlock"}}
    for targets, classes in swaps.items():
        again, recomputed, model = _one_step(cpu_spec(*one, "recompute=selective",
                                                      f"recompute.targets={targets}"))
        assert classes <= {type(m).__name__ for m in model.modules()}
        assert again == pytest.approx(loss, abs=1e-6)
        for name, grad in grads.items():
            torch.testing.assert_close(recomputed[name], grad, atol=1e-6, rtol=1e-5)


def test_the_family_facts_import_no_torch():
    code = ("import sys; import training.models as m, tests.support.toy_family; "
            "m.model_family('llama'); m.model_family('tests.support.toy_family'); "
            "import conf.hf_model_config, parallel.tp_plan, parallel.cost.params; "
            "print('torch' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True,
                         text=True, check=True)
    assert out.stdout.strip() == "False"


@pytest.mark.parametrize("overrides", [("model=tiny",), ("model=qwen2_5_0_5b",),
                                       ("model=llama3_1b",)])
def test_llama_config_json_reads_back_as_the_knobs_it_was_written_from(overrides):
    """The family's config.json write and read are one pair: every knob survives the trip."""
    from conf.hf_model_config import SHAPE_KNOBS, USER_WINS

    spec = cpu_spec(*overrides, "cluster.procs_per_node=1")
    family = family_of(spec.model)
    knobs, refusals = family.read_hf_config(family.write_hf_config(spec.model, "bfloat16"))
    assert refusals == []
    rope = ("rope_scaling_factor", "rope_low_freq_factor", "rope_high_freq_factor",
            "rope_original_max_seq_len")  # read only when the frequencies are scaled
    expected = {*SHAPE_KNOBS, *USER_WINS} - {"family"} - (
        set() if spec.model.llama3_rope else set(rope))
    assert set(knobs) == expected
    for name in expected:
        assert knobs[name] == getattr(spec.model, name), name
