"""Mixture-of-experts models in and out of Hugging Face, against transformers itself: a random
tiny Qwen3-MoE (q/k norms, head_dim apart from hidden_size, a dense first block, top-k not
renormalised) and a tiny Mixtral (top-k renormalised), saved by save_pretrained (one tensor
per expert). meshrun's loss on a batch equals transformers' (fp32, one process); the export
loads in AutoModelForCausalLM with no missing or unexpected key and gives the same loss."""
from __future__ import annotations

import pytest
import torch

from conf.compose import compose_config
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
