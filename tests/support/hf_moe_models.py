"""Small Hugging Face mixture-of-experts models saved to a folder (Qwen3-MoE with a dense
first block, Mixtral), every weight random and the routers' large enough that each token's
top-k is decisive (no near-ties that rounding could flip)."""
from __future__ import annotations

import torch

from tests.support.hf_models import VOCAB

SHAPE = dict(vocab_size=VOCAB, hidden_size=64, num_hidden_layers=3, num_attention_heads=4,
             num_key_value_heads=2, max_position_embeddings=128, rms_norm_eps=1e-6,
             num_experts_per_tok=2, tie_word_embeddings=False)


def _randomise(model: torch.nn.Module, seed: int) -> None:
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, param in model.named_parameters():
            noise = torch.randn(param.shape, generator=generator)
            scale = 1.0 if name.endswith("gate.weight") else 0.05
            param.copy_(1 + 0.2 * noise if "norm" in name else scale * noise)


def make_qwen3_moe(folder, *, seed: int = 2, norm_topk_prob: bool = False):
    import transformers

    config = transformers.Qwen3MoeConfig(**SHAPE, head_dim=32, intermediate_size=96,
                                         moe_intermediate_size=48, num_experts=4,
                                         norm_topk_prob=norm_topk_prob, mlp_only_layers=[0])
    model = transformers.Qwen3MoeForCausalLM(config)
    _randomise(model, seed)
    model.save_pretrained(folder)
    return model.eval()


def make_mixtral(folder, *, seed: int = 3):
    import transformers

    config = transformers.MixtralConfig(**SHAPE, intermediate_size=48, num_local_experts=4)
    model = transformers.MixtralForCausalLM(config)
    _randomise(model, seed)
    model.save_pretrained(folder)
    return model.eval()
