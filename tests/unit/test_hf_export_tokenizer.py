"""An export with the run's own tokenizer loads in transformers (AutoTokenizer and
AutoModelForCausalLM) with the ids the run trained on, digits included, for a Llama and a
Qwen2-shaped model: transformers imposes Qwen2Tokenizer's pipeline (one digit per piece) on every
`model_type: qwen2` folder, so a Qwen2-shaped model with another tokenizer is exported as the
equal LlamaForCausalLM with attention_bias (a zero o_proj bias), which meshrun imports back."""
from __future__ import annotations

import json
import logging

import pytest
import torch

from conf.errors import ConfigError
from launcher.data.hf_tokenizer import load_tokenizer, train_bpe
from tests.support.hf_models import VOCAB, make_llama, make_qwen2
from tests.support.specs import hf_spec
from training.export import export_hf
from training.hf_import import load_hf_model
from training.models.llama.hf import is_qwen2_tokenizer

transformers = pytest.importorskip("transformers")

TEXT = "the fox paid 12345 for 2026 dogs and 7 cats"


@pytest.fixture(scope="module")
def tokenizer(tmp_path_factory):
    folder = tmp_path_factory.mktemp("tok")
    corpus = folder / "corpus.txt"
    corpus.write_text("the quick brown fox paid 12345 for 2026 lazy dogs 987 cats\n" * 50)
    return train_bpe([corpus], vocab_size=VOCAB, out_dir=folder / "tok")


def _loss(model, ids: torch.Tensor) -> float:
    with torch.no_grad():
        return float(model(ids, labels=ids).loss)


@pytest.mark.parametrize(("make", "exported_class"), [
    (lambda d: make_llama(d, tied=False), "LlamaForCausalLM"),
    (make_qwen2, "LlamaForCausalLM"),  # a Qwen2 shape with a non-Qwen2 tokenizer
], ids=["llama", "qwen2"])
def test_export_keeps_the_training_ids_and_the_loss(tmp_path, tokenizer, make, exported_class,
                                                    caplog):
    reference = make(tmp_path / "hf")
    spec = hf_spec(tmp_path / "hf", f"data.tokenizer={tokenizer}")
    with caplog.at_level(logging.INFO, logger="meshrun.hf_import"):
        ours = load_hf_model(spec.model.path, spec.model)
    loaded_lines = [r.getMessage() for r in caplog.records
                    if "loaded Hugging Face" in r.getMessage()]
    count, numel = len(list(ours.parameters())), sum(p.numel() for p in ours.parameters())
    assert len(loaded_lines) == 1 and loaded_lines[0].startswith(
        f"loaded Hugging Face weights from {spec.model.path}: {count} tensors, {numel:,} "
        f"parameters, {numel * 4 / 2**20:,.1f} MiB (F32) in 1 file(s)"), loaded_lines
    out = export_hf(ours.state_dict(), spec.model, tmp_path / "export", tokenizer=str(tokenizer))
    trained = load_tokenizer(tokenizer).encode(TEXT)
    assert len(trained) < len(TEXT.replace(" ", "")) - 6  # the tokenizer merges digits
    loaded = transformers.AutoTokenizer.from_pretrained(out)
    assert loaded(TEXT, add_special_tokens=False)["input_ids"] == trained
    again = transformers.AutoModelForCausalLM.from_pretrained(out, dtype=torch.float32).eval()
    assert type(again).__name__ == exported_class
    ids = torch.tensor([trained])
    assert _loss(again, ids) == pytest.approx(_loss(reference, ids), abs=1e-5)
    back = hf_spec(out)  # meshrun reads its own export back: the same model
    assert back.model.attention_bias == spec.model.attention_bias
    with torch.no_grad():
        torch.testing.assert_close(load_hf_model(out, back.model)(ids), ours(ids), atol=1e-5,
                                   rtol=0)


def test_only_a_qwen2_pipeline_keeps_the_qwen2_class(tokenizer):
    ours = json.loads(tokenizer.read_text())
    assert not is_qwen2_tokenizer(ours) and not is_qwen2_tokenizer(None)
    qwen = transformers.Qwen2Tokenizer(vocab={"a": 0, "b": 1, "ab": 2}, merges=[("a", "b")])
    assert is_qwen2_tokenizer(json.loads(qwen.backend_tokenizer.to_str()))


def test_a_llama_with_attention_bias_loads_only_when_its_o_proj_bias_is_zero(tmp_path):
    """The class the Qwen2-shaped export becomes, as a user might bring it: q/k/v biases and
    an o_proj bias. A zero o_proj bias is the same function (imported, equal logits); any other
    is refused before launch, naming the tensor."""
    from tests.support.hf_models import SHAPE, hf_logits, tokens
    from tests.support.specs import checked_hf_spec as checked_spec

    model = transformers.LlamaForCausalLM(transformers.LlamaConfig(**SHAPE, attention_bias=True))
    with torch.no_grad():
        for name, param in model.named_parameters():
            param.normal_(0, 0.05 if "norm" not in name else 1.0)
    model.save_pretrained(tmp_path / "biased")
    with pytest.raises(ConfigError, match=r"o_proj\.bias is not all zero"):
        checked_spec(tmp_path / "biased")
    with torch.no_grad():
        for layer in model.model.layers:
            layer.self_attn.o_proj.bias.zero_()
    model.save_pretrained(tmp_path / "zero")
    spec = checked_spec(tmp_path / "zero")
    assert spec.model.attention_bias
    ours = load_hf_model(spec.model.path, spec.model)
    with torch.no_grad():
        torch.testing.assert_close(ours(tokens()), hf_logits(model.eval(), tokens()), atol=1e-5,
                                   rtol=0)
