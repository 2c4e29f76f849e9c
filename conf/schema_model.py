"""The model section of the Hydra-facing schema (conf/schema.py says how the schema works):
a model's shape, its family and its mixture-of-experts knobs."""
from __future__ import annotations

from dataclasses import dataclass, field

from conf.choices import RopeScaling, RouterScore


@dataclass
class MoeConfig:
    """Mixture-of-experts feed-forward (model.family=moe or mixtral; 0 experts = dense)."""

    num_experts: int = 0
    """Routed experts per MoE block; 0 = no MoE (every block dense)."""
    top_k: int = 2
    """Experts each token is sent to (experts per token)."""
    num_shared_experts: int = 0
    """Experts every token goes through besides its routed ones (DeepSeek); one SwiGLU of
    num_shared_experts x expert_ffn_dim."""
    expert_ffn_dim: int = 0
    """Inner size of each expert's SwiGLU (moe_intermediate_size); 0 = model.ffn_dim."""
    first_dense_layers: int = 0
    """Blocks 0 .. first_dense_layers-1 keep a dense SwiGLU of model.ffn_dim; MoE after."""
    score: RouterScore = RouterScore.softmax
    """Router scores: softmax over all experts (Mixtral, Qwen3-MoE), or sigmoid per expert
    with a bias that balances the load without a loss (DeepSeek-V3, bias_update_rate)."""
    renormalize: bool = True
    """Divide each token's top-k scores by their sum (Mixtral; Qwen3 norm_topk_prob)."""
    route_scale: float = 1.0
    """Factor on the routed experts' weighted sum (DeepSeek-V3 routed_scaling_factor 2.5)."""
    bias_update_rate: float = 0.001
    """score=sigmoid: after each optimizer step every expert's selection bias moves by this
    toward the mean load (up if under-loaded, down if over-loaded); 0 = no balancing bias."""
    aux_loss_coef: float = 0.0
    """Load-balancing loss weight: coef x E x sum_i f_i P_i per MoE block, averaged over the
    blocks (f_i: share of tokens routed to expert i, P_i: its mean router probability; as
    transformers' Mixtral/Qwen3-MoE loss for one block). f and P are taken per forward, as in
    Megatron: a rank's micro-batch (a pipeline micro-batch under pp; whole sequences under cp)."""
    seq_aux_loss: bool = False
    """The balancing loss per sequence, averaged over the sequences (DeepSeek-V3's
    sequence-wise loss, on the batch loss's scale: top_k x DeepSeek's for one coefficient)."""
    z_loss_coef: float = 0.0
    """Router z-loss weight: coef x mean over tokens of logsumexp(router logits)^2 (ST-MoE)."""
    capacity_factor: float | None = None
    """Tokens an expert takes per batch: capacity_factor x tokens x top_k / num_experts
    (the rest are dropped: that copy adds nothing); null = dropless (no token dropped)."""


@dataclass
class ModelConfig:
    name: str = "debug"
    """Name of the model shape (the `model` group option)."""
    family: str = "llama"
    """Model family (architecture): llama (Llama 3, and Qwen2 with attention_bias), moe
    (mixture of experts, Qwen3-MoE names), mixtral (the same, Mixtral names), or the
    import path of a family module (training/models/__init__.py says what a family is)."""
    n_layers: int = 4
    """Number of transformer blocks."""
    dim: int = 128
    """Hidden size (d_model)."""
    n_heads: int = 4
    """Attention (query) heads."""
    n_kv_heads: int = 2
    """Key/value heads for grouped-query attention; -1 = n_heads (plain multi-head)."""
    ffn_dim: int = 384
    """Inner size of the SwiGLU feed-forward block."""
    vocab_size: int = 256
    """Vocabulary size (embedding rows). Byte-level data needs at least 256."""
    max_seq_len: int = 1024
    """Longest sequence the model is meant for (RoPE positions)."""
    rope_theta: float = 10000.0
    """RoPE base frequency."""
    tie_embeddings: bool = False
    """Share the token embedding with the output head."""
    norm_eps: float = 1e-5
    """RMSNorm epsilon."""
    init_std: float = 0.02
    """Standard deviation of the normal initialisation of weights."""
    attention_bias: bool = False
    """Learned biases on the q, k and v projections (Qwen2); none on the output projection."""
    rope_scaling: RopeScaling = RopeScaling.none
    """RoPE frequency scaling: none, or llama3 (Llama 3.1/3.2 long context: low frequencies
    divided by rope_scaling_factor, high ones kept, a smooth blend between)."""
    rope_scaling_factor: float = 8.0
    """rope_scaling=llama3: how much the low frequencies are slowed down (32 for Llama 3.2)."""
    rope_low_freq_factor: float = 1.0
    """rope_scaling=llama3: wavelengths above original_max / this are fully scaled."""
    rope_high_freq_factor: float = 4.0
    """rope_scaling=llama3: wavelengths below original_max / this are kept as they are."""
    rope_original_max_seq_len: int = 8192
    """rope_scaling=llama3: the context length the model was pre-trained with before scaling."""
    head_dim: int = 0
    """Width of each attention head; 0 = dim / n_heads (Qwen3 sets it apart from dim)."""
    qk_norm: bool = False
    """RMSNorm on each query and key head before RoPE (Qwen3)."""
    moe: MoeConfig = field(default_factory=MoeConfig)
    """Mixture-of-experts knobs (model.family=moe or mixtral)."""
    path: str = ""
    """A Hugging Face model folder (`model=hf`): resolve() reads the shape above from its
    config.json (Llama, Qwen2, Qwen3-MoE or Mixtral), and the run starts from its
    safetensors weights. A shape knob given on the command line must agree with config.json
    (else an error); max_seq_len, init_std and the model.moe training knobs (losses,
    capacity) given there replace config.json's."""
