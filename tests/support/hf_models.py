"""Small Hugging Face models saved to a folder, for the import/export tests: a Llama (llama3
RoPE, tied or not) and a Qwen2 (q/k/v biases), every weight random so a swapped or dropped
tensor shows, and their logits. transformers is imported when a model is made."""
from __future__ import annotations

import torch

VOCAB = 300
SHAPE = dict(vocab_size=VOCAB, hidden_size=64, intermediate_size=96, num_hidden_layers=2,
             num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=128,
             rms_norm_eps=1e-6)
# head_dim 16 at theta 5e5: wavelengths 6.3, 32, 167, ... with original 64 / factors 1 and 4
# fall in all three llama3 bands (kept < 16 < blended < 64 < divided by the factor).
LLAMA3_ROPE = {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
               "high_freq_factor": 4.0, "original_max_position_embeddings": 64,
               "rope_theta": 500000.0}


def _randomise(model: torch.nn.Module, seed: int) -> None:
    """Every parameter random (norms near 1, biases not 0), so a swapped or dropped tensor shows."""
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, param in model.named_parameters():
            noise = torch.randn(param.shape, generator=generator)
            param.copy_(1 + 0.2 * noise if "norm" in name else 0.05 * noise)


def make_llama(folder, *, tied: bool, seed: int = 0, **save):
    import transformers

    config = transformers.LlamaConfig(**SHAPE, rope_parameters=dict(LLAMA3_ROPE),
                                      tie_word_embeddings=tied)
    model = transformers.LlamaForCausalLM(config)
    _randomise(model, seed)
    model.save_pretrained(folder, **save)
    return model.eval()


def make_qwen2(folder, *, seed: int = 1, **save):
    import transformers

    config = transformers.Qwen2Config(**SHAPE, rope_parameters={"rope_type": "default",
                                                                "rope_theta": 1e6},
                                      tie_word_embeddings=False)
    model = transformers.Qwen2ForCausalLM(config)
    _randomise(model, seed)
    model.save_pretrained(folder, **save)
    return model.eval()


def tokens(seq: int = 40) -> torch.Tensor:
    return torch.randint(0, VOCAB, (2, seq), generator=torch.Generator().manual_seed(5))


def hf_logits(model, ids: torch.Tensor) -> torch.Tensor:
    with torch.no_grad():
        return model(ids).logits
