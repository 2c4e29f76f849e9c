"""The Llama-style model: meta build, RoPE tables, seeding, GQA, and Hugging Face parity."""
from __future__ import annotations

import json

import pytest
import torch

from tests.support.specs import tiny_model_spec
from training.export import export_hf, hf_name
from training.model_builder import build_model, count_params
from training.models import model_family

LLAMA = model_family("llama")

CPU = torch.device("cpu")


def _tokens(*, batch: int = 2, seq: int = 16, vocab: int = 256, seed: int = 0) -> torch.Tensor:
    return torch.randint(0, vocab, (batch, seq), generator=torch.Generator().manual_seed(seed))


def _reference_rope(*, head_dim: int, max_seq_len: int, theta: float):
    """cos/sin written out element by element from the RoPE definition (HF half-split layout)."""
    cos = torch.empty(max_seq_len, head_dim, dtype=torch.float64)
    sin = torch.empty_like(cos)
    half = head_dim // 2
    for pos in range(max_seq_len):
        for i in range(half):
            angle = pos * theta ** (-2.0 * i / head_dim)
            cos[pos, i] = cos[pos, i + half] = torch.tensor(angle).cos()
            sin[pos, i] = sin[pos, i + half] = torch.tensor(angle).sin()
    return cos.float(), sin.float()


def test_rope_buffers_are_computed_after_meta_build():
    spec = tiny_model_spec(max_seq_len=48, rope_theta=500000.0)
    model = build_model(spec, device=CPU, seed=0)
    cos, sin = _reference_rope(head_dim=spec.head_dim, max_seq_len=48, theta=500000.0)
    assert model.rope_cos.shape == (48, spec.head_dim)
    assert torch.isfinite(model.rope_cos).all() and torch.isfinite(model.rope_sin).all()
    torch.testing.assert_close(model.rope_cos, cos, atol=1e-5, rtol=0)
    torch.testing.assert_close(model.rope_sin, sin, atol=1e-5, rtol=0)
    assert "rope_cos" not in model.state_dict()  # non-persistent: never checkpointed


def test_every_parameter_is_initialised():
    spec = tiny_model_spec()
    model = build_model(spec, device=CPU, seed=0)
    for name, param in model.named_parameters():
        assert torch.isfinite(param).all(), name
        if name.endswith("norm.weight"):
            assert torch.equal(param, torch.ones_like(param)), name
        else:
            assert 0.2 * spec.init_std < param.std() < 1.5 * spec.init_std, name


def test_same_seed_gives_identical_weights_and_different_seed_does_not():
    spec = tiny_model_spec()
    first = build_model(spec, device=CPU, seed=7).state_dict()
    again = build_model(spec, device=CPU, seed=7).state_dict()
    other = build_model(spec, device=CPU, seed=8).state_dict()
    assert all(torch.equal(first[key], again[key]) for key in first)
    assert not torch.equal(first["layers.0.attention.wq.weight"],
                           other["layers.0.attention.wq.weight"])


def test_build_does_not_disturb_global_rng():
    torch.manual_seed(123)
    expected = torch.rand(3)
    torch.manual_seed(123)
    build_model(tiny_model_spec(), device=CPU, seed=0)
    torch.testing.assert_close(torch.rand(3), expected)


def test_state_dict_keys():
    untied = build_model(tiny_model_spec(n_layers=1), device=CPU, seed=0).state_dict()
    block = [f"layers.0.{name}.weight" for name in (
        "attention_norm", "attention.wq", "attention.wk", "attention.wv", "attention.wo",
        "ffn_norm", "feed_forward.w1", "feed_forward.w2", "feed_forward.w3")]
    assert sorted(untied) == sorted(["tok_embeddings.weight", *block, "norm.weight",
                                     "output.weight"])
    tied = build_model(tiny_model_spec(n_layers=1, tie_embeddings=True), device=CPU, seed=0)
    assert "output.weight" not in tied.state_dict()


def test_forward_shape_and_causality():
    spec = tiny_model_spec()
    model = build_model(spec, device=CPU, seed=0)
    tokens = _tokens(seq=16)
    logits = model(tokens)
    assert logits.shape == (2, 16, spec.vocab_size)
    changed = tokens.clone()
    changed[:, 10:] = (changed[:, 10:] + 1) % spec.vocab_size
    torch.testing.assert_close(model(changed)[:, :10], logits[:, :10])
    assert not torch.allclose(model(changed)[:, 10:], logits[:, 10:])


def test_grouped_query_attention_equals_multi_head_with_repeated_kv():
    gqa_spec = tiny_model_spec(n_heads=4, n_kv_heads=2)
    gqa = build_model(gqa_spec, device=CPU, seed=0)
    mha = build_model(tiny_model_spec(n_heads=4, n_kv_heads=4), device=CPU, seed=1)
    state = gqa.state_dict()
    group = gqa_spec.n_heads // gqa_spec.n_kv_heads
    for key in list(state):
        if key.endswith(("attention.wk.weight", "attention.wv.weight")):
            per_head = state[key].view(gqa_spec.n_kv_heads, gqa_spec.head_dim, gqa_spec.dim)
            state[key] = per_head.repeat_interleave(group, dim=0).reshape(-1, gqa_spec.dim)
    mha.load_state_dict(state)
    tokens = _tokens()
    torch.testing.assert_close(gqa(tokens), mha(tokens), atol=1e-6, rtol=1e-5)


def test_count_params_counts_tied_weights_once():
    spec = tiny_model_spec()
    kv_dim = spec.n_kv_heads * spec.head_dim
    per_layer = 2 * spec.dim + 2 * spec.dim * spec.dim + 2 * spec.dim * kv_dim \
        + 3 * spec.dim * spec.ffn_dim
    embedding = spec.vocab_size * spec.dim
    body = spec.n_layers * per_layer + spec.dim
    untied = build_model(spec, device=CPU, seed=0)
    tied = build_model(tiny_model_spec(tie_embeddings=True), device=CPU, seed=0)
    assert count_params(untied) == (body + 2 * embedding, embedding)
    assert count_params(tied) == (body + embedding, embedding)


def test_meta_model_can_be_counted_without_memory():
    from training.models.llama.model import Transformer

    with torch.device("meta"):
        model = Transformer(tiny_model_spec())
    assert count_params(model)[0] > 0


def test_hf_name_mapping():
    assert hf_name("layers.11.feed_forward.w3.weight", LLAMA) == "model.layers.11.mlp.up_proj.weight"
    assert hf_name("output.weight", LLAMA) == "lm_head.weight"
    with pytest.raises(KeyError):
        hf_name("layers.0.attention.wqkv.weight", LLAMA)


@pytest.mark.parametrize("tied", [False, True], ids=["untied", "tied"])
def test_export_loads_in_transformers_with_identical_logits(tmp_path, tied):
    transformers = pytest.importorskip("transformers")
    spec = tiny_model_spec(tie_embeddings=tied, rope_theta=20000.0, norm_eps=1e-6)
    model = build_model(spec, device=CPU, seed=3)
    # Break the symmetry of the ones-initialised norms so a swapped norm would be caught.
    with torch.no_grad():
        for name, param in model.named_parameters():
            if name.endswith("norm.weight"):
                param.uniform_(0.5, 1.5)
    out_dir = export_hf(model.state_dict(), spec, tmp_path / "hf")

    config = json.loads((out_dir / "config.json").read_text())
    assert config["tie_word_embeddings"] is tied and config["num_key_value_heads"] == 2
    hf_model, info = transformers.LlamaForCausalLM.from_pretrained(
        out_dir, output_loading_info=True, attn_implementation="eager", dtype=torch.float32
    )
    assert not any(info[kind] for kind in ("missing_keys", "unexpected_keys", "mismatched_keys"))
    hf_model.eval()
    tokens = _tokens(seq=40)
    with torch.no_grad():
        expected = hf_model(tokens).logits
        actual = model(tokens)
    torch.testing.assert_close(actual, expected, atol=1e-5, rtol=0)


@pytest.mark.parametrize(("umask", "mode"), [(0o022, 0o644), (0o027, 0o640)])
def test_export_files_are_readable_as_the_umask_allows(tmp_path, umask, mode):
    """safetensors alone writes 0600: teammates and inference jobs could not read the export."""
    import os
    import stat

    spec = tiny_model_spec()
    model = build_model(spec, device=CPU, seed=3)
    saved = os.umask(umask)
    try:
        out_dir = export_hf(model.state_dict(), spec, tmp_path / "hf")
    finally:
        os.umask(saved)
    for name in ("model.safetensors", "config.json"):
        assert stat.S_IMODE((out_dir / name).stat().st_mode) == mode, name
