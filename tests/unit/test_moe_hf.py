"""Mixture-of-experts models in and out of Hugging Face, against transformers itself: a random
tiny Qwen3-MoE (q/k norms, head_dim apart from hidden_size, a dense first block, top-k not
renormalised) and a tiny Mixtral (top-k renormalised), saved by save_pretrained (one tensor
per expert). meshrun's loss on a batch equals transformers' (fp32, one process); the export
loads in AutoModelForCausalLM with no missing or unexpected key and gives the same loss."""
from __future__ import annotations

import pytest
import torch

from conf.compose import compose_config
from conf.hf_model_config import explicit_model_keys
from conf.resolve import resolve
from tests.support.hf_models import tokens
from tests.support.hf_moe_models import make_mixtral, make_qwen3_moe
from tests.support.specs import CPU_HOST

REL = 1e-4


def meshrun_model(folder):
    from training.hf_import import load_hf_model

    spec = resolve(compose_config(["model=hf", f"model.path={folder}", "data=synthetic",
                                   "training.seq_len=32"]), host=CPU_HOST)
    return spec.model, load_hf_model(folder, spec.model)


def meshrun_loss(module, ids: torch.Tensor) -> float:
    with torch.no_grad():
        total = module(ids[:, :-1], targets=ids[:, 1:])
    return float(total) / ids[:, 1:].numel()


def hf_loss(model, ids: torch.Tensor) -> float:
    with torch.no_grad():
        return float(model(input_ids=ids, labels=ids).loss)


@pytest.mark.parametrize(("make", "architecture", "renormalize"),
                         [(make_qwen3_moe, "Qwen3MoeForCausalLM", False),
                          (make_mixtral, "MixtralForCausalLM", True)])
def test_moe_import_and_export_match_transformers(tmp_path, make, architecture, renormalize):
    import transformers

    from training.export import export_hf

    hf = make(tmp_path / "hf")
    spec, module = meshrun_model(tmp_path / "hf")
    assert spec.moe.num_experts == 4 and spec.moe.top_k == 2
    assert spec.moe.renormalize is renormalize
    ids = tokens(seq=33)
    expected = hf_loss(hf, ids)
    assert meshrun_loss(module, ids) == pytest.approx(expected, rel=REL)

    out = export_hf(module.state_dict(), spec, tmp_path / "export")
    again, info = transformers.AutoModelForCausalLM.from_pretrained(
        out, output_loading_info=True, dtype=torch.float32)
    assert type(again).__name__ == architecture
    assert info["missing_keys"] == set() or not info["missing_keys"]
    assert not info["unexpected_keys"] and not info["mismatched_keys"]
    assert hf_loss(again.eval(), ids) == pytest.approx(expected, rel=REL)


def test_moe_training_knobs_override_config_json_and_shape_knobs_must_agree(tmp_path):
    from conf.errors import ConfigError

    make_mixtral(tmp_path / "hf")
    base = ["model=hf", f"model.path={tmp_path / 'hf'}", "data=synthetic"]
    explicit = ["model.moe.capacity_factor=1.25", "model.moe.aux_loss_coef=0.02"]
    spec = resolve(compose_config([*base, *explicit]), host=CPU_HOST,
                   explicit=explicit_model_keys(explicit)).model
    assert (spec.moe.capacity_factor, spec.moe.aux_loss_coef, spec.moe.top_k) == (1.25, 0.02, 2)
    with pytest.raises(ConfigError) as err:
        resolve(compose_config([*base, "model.moe.top_k=3"]), host=CPU_HOST,
                explicit=explicit_model_keys(["model.moe.top_k=3"]))
    assert [p.key for p in err.value.problems] == ["model.moe.top_k"]
