"""Hugging Face import and export in one process: tiny random transformers Llama (llama3 RoPE
scaling, tied and untied) and Qwen2 (q/k/v biases, sharded safetensors) made here, loaded by
meshrun with equal logits, exported back with equal logits and a loadable tokenizer."""
from __future__ import annotations

import json
import os
import shutil
import stat

import pytest
import torch

from conf.errors import ConfigError
from parallel.cost.params import parameter_shapes
from conf.compose import compose_config
from conf.resolve import resolve
from tests.support.hf_models import (LLAMA3_ROPE, SHAPE, VOCAB, hf_logits, make_llama, make_qwen2,
                                     tokens)
from tests.support.specs import CPU_HOST, cpu_spec, hf_spec
from training.export import export_hf, hf_name, meshrun_name
from training.hf_import import HfWeightsError, load_hf_model
from training.models import model_family

LLAMA = model_family("llama")

transformers = pytest.importorskip("transformers")

CPU = torch.device("cpu")


@pytest.fixture(scope="module")
def saved_llama(tmp_path_factory):
    """A tied Llama folder for the tests that only read it (or a copy of it)."""
    folder = tmp_path_factory.mktemp("saved") / "llama"
    make_llama(folder, tied=True)
    return folder


def test_llama3_rope_frequencies_equal_transformers():
    from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS
    from conf.spec import Llama3RopeScaling
    from training.models.llama.model import rope_tables

    config = transformers.LlamaConfig(**SHAPE, rope_parameters=dict(LLAMA3_ROPE))
    inv_freq, _ = ROPE_INIT_FUNCTIONS["llama3"](config, CPU)
    scaling = Llama3RopeScaling(factor=8.0, low_freq_factor=1.0, high_freq_factor=4.0,
                                original_max_seq_len=64)
    cos, sin = rope_tables(head_dim=16, max_seq_len=128, theta=500000.0, scaling=scaling)
    angles = torch.outer(torch.arange(128).float(), inv_freq)
    torch.testing.assert_close(cos[:, :8], angles.cos(), atol=1e-6, rtol=0)
    torch.testing.assert_close(sin[:, 8:], angles.sin(), atol=1e-6, rtol=0)
    plain, _ = rope_tables(head_dim=16, max_seq_len=128, theta=500000.0)
    assert not torch.allclose(plain, cos, atol=1e-3)  # the scaling changes the tables


@pytest.mark.parametrize("tied", [False, True], ids=["untied", "tied"])
def test_llama_import_and_export_keep_logits(tmp_path, tied):
    reference = make_llama(tmp_path / "hf", tied=tied)
    spec = hf_spec(tmp_path / "hf")
    m = spec.model
    assert (m.rope_scaling, m.rope_scaling_factor, m.rope_original_max_seq_len) == ("llama3", 8.0, 64)
    assert (m.tie_embeddings, m.attention_bias, m.head_dim) == (tied, False, 16)
    ours = load_hf_model(m.path, m)
    ids = tokens()
    expected = hf_logits(reference, ids)
    with torch.no_grad():
        torch.testing.assert_close(ours(ids), expected, atol=1e-5, rtol=0)
    out = export_hf(ours.state_dict(), m, tmp_path / "export")
    again = transformers.AutoModelForCausalLM.from_pretrained(out, dtype=torch.float32).eval()
    assert type(again).__name__ == "LlamaForCausalLM"
    assert again.config.rope_parameters["rope_type"] == "llama3"
    torch.testing.assert_close(hf_logits(again, ids), expected, atol=1e-5, rtol=0)


def test_qwen2_sharded_import_and_export_keep_logits(tmp_path):
    reference = make_qwen2(tmp_path / "hf", max_shard_size="40KB")
    assert (tmp_path / "hf" / "model.safetensors.index.json").is_file()
    spec = hf_spec(tmp_path / "hf")
    assert spec.model.attention_bias and spec.model.rope_theta == 1e6
    ours = load_hf_model(spec.model.path, spec.model)
    names = [n for n, _ in ours.named_parameters()]
    assert [(n, tuple(p.shape)) for n, p in ours.named_parameters()] == parameter_shapes(spec.model)
    assert "layers.1.attention.wk.bias" in names
    ids = tokens()
    expected = hf_logits(reference, ids)
    with torch.no_grad():
        torch.testing.assert_close(ours(ids), expected, atol=1e-5, rtol=0)
    out = export_hf(ours.state_dict(), spec.model, tmp_path / "export")
    again = transformers.AutoModelForCausalLM.from_pretrained(out, dtype=torch.float32).eval()
    assert type(again).__name__ == "Qwen2ForCausalLM"
    torch.testing.assert_close(hf_logits(again, ids), expected, atol=1e-5, rtol=0)


def test_biases_start_at_zero_and_are_counted():
    from tests.support.specs import tiny_model_spec
    from training.model_builder import build_model

    spec = tiny_model_spec(attention_bias=True)
    model = build_model(spec, device=CPU, seed=0)
    biases = {n: p for n, p in model.named_parameters() if n.endswith(".bias")}
    assert sorted(biases) == sorted(f"layers.{i}.attention.{w}.bias" for i in range(2)
                                    for w in ("wq", "wk", "wv"))
    assert all(torch.count_nonzero(p) == 0 for p in biases.values())
    assert [(n, tuple(p.shape)) for n, p in model.named_parameters()] == parameter_shapes(spec)


def test_name_table_inverts():
    for name in ("layers.3.attention.wv.bias", "output.weight", "layers.0.feed_forward.w2.weight"):
        assert meshrun_name(hf_name(name, LLAMA), LLAMA) == name
    assert meshrun_name("model.layers.0.self_attn.o_proj.bias", LLAMA) is None


def test_tensors_the_model_cannot_hold_are_refused(tmp_path):
    from safetensors.torch import load_file, save_file

    make_llama(tmp_path / "hf", tied=False)
    spec = hf_spec(tmp_path / "hf")
    weights = load_file(tmp_path / "hf" / "model.safetensors")
    weights["model.layers.0.self_attn.o_proj.bias"] = torch.zeros(64)
    del weights["model.norm.weight"]
    save_file(weights, tmp_path / "hf" / "model.safetensors")
    with pytest.raises(HfWeightsError, match=r"o_proj\.bias is a tensor the model has no place "
                                             r"for.*model\.norm\.weight is missing"):
        load_hf_model(spec.model.path, spec.model)


def _edit_config(folder, **changes):
    path = folder / "config.json"
    config = json.loads(path.read_text())
    config.update(changes)
    path.write_text(json.dumps(config))


@pytest.mark.parametrize(("change", "message"), [
    ({"architectures": ["MistralForCausalLM"]}, "architectures=MistralForCausalLM is not supported"),
    ({"rope_parameters": {"rope_type": "yarn", "factor": 4.0, "rope_theta": 1e4}},
     'rope_type="yarn": is not modelled'),
    ({"hidden_act": "gelu"}, 'hidden_act="gelu": is not modelled'),
    ({"head_dim": 32}, "head_dim=32"),
])
def test_unsupported_configs_are_clear_config_errors(tmp_path, saved_llama, change, message):
    shutil.copytree(saved_llama, tmp_path / "hf")
    _edit_config(tmp_path / "hf", **change)
    with pytest.raises(ConfigError, match="model.path=") as err:
        hf_spec(tmp_path / "hf")
    assert message in str(err.value) and "fix:" in str(err.value)


def test_hf_option_needs_a_path_and_llama3_knobs_are_checked():
    with pytest.raises(ConfigError, match="model.path=''"):
        cpu_spec("model=hf", "data=synthetic")
    with pytest.raises(ConfigError) as err:
        cpu_spec("model=tiny", "model.rope_scaling=llama3", "model.rope_scaling_factor=0.5",
                 "model.rope_high_freq_factor=1.0")
    assert "model.rope_scaling_factor=0.5" in str(err.value)
    assert "model.rope_high_freq_factor=1.0: must exceed" in str(err.value)


def test_load_from_an_hf_dir_must_match_the_model(saved_llama):
    hf_spec(saved_llama, f"checkpoint.load_from={saved_llama}")  # the same shape: fine
    with pytest.raises(ConfigError, match=r"describes another model: n_layers=2 \(the run has "
                                          r"model.n_layers=4\)"):
        resolve(compose_config(["model=debug", "data=synthetic",
                                f"checkpoint.load_from={saved_llama}"]), host=CPU_HOST)


def test_export_writes_a_tokenizer_automodel_and_autotokenizer_load(tmp_path):
    from launcher.data.hf_tokenizer import train_bpe

    corpus = tmp_path / "corpus.txt"
    corpus.write_text("the quick brown fox jumps over the lazy dog\n" * 50)
    tok = train_bpe([corpus], vocab_size=VOCAB, out_dir=tmp_path / "tok")
    make_llama(tmp_path / "hf", tied=True)
    spec = hf_spec(tmp_path / "hf", f"data.tokenizer={tok}")
    ours = load_hf_model(spec.model.path, spec.model)
    saved = os.umask(0o022)
    try:
        out = export_hf(ours.state_dict(), spec.model, tmp_path / "export",
                        tokenizer=spec.data.tokenizer)
    finally:
        os.umask(saved)
    loaded = transformers.AutoTokenizer.from_pretrained(out)
    assert loaded("the lazy fox")["input_ids"] == \
        transformers.PreTrainedTokenizerFast(tokenizer_file=str(tok))("the lazy fox")["input_ids"]
    assert (loaded.bos_token, loaded.eos_token, loaded.pad_token) == ("<s>", "</s>", "<pad>")
    config = json.loads((out / "config.json").read_text())
    assert (config["bos_token_id"], config["eos_token_id"], config["pad_token_id"]) == (0, 1, 2)
    generation = transformers.GenerationConfig.from_pretrained(out)
    assert (generation.bos_token_id, generation.eos_token_id) == (0, 1)
    for path in out.iterdir():
        assert stat.S_IMODE(path.stat().st_mode) == 0o644, path.name
