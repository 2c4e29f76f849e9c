"""The Mixtral family: the MoE family's module under Mixtral's Hugging Face names and
config.json (MixtralForCausalLM). Torch-free."""
from __future__ import annotations

from training.models.moe import moe_family, moe_hf

FAMILY = moe_family(name="mixtral", architecture=moe_hf.MIXTRAL, hf_names=moe_hf.MIXTRAL_NAMES,
                    read=moe_hf.read_mixtral_config, write=moe_hf.write_mixtral_config)
