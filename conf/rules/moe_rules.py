"""Rules on the mixture-of-experts knobs (model.moe) and the attention head knobs MoE shapes
use (head_dim, qk_norm); the resolved MoeSpec."""
from __future__ import annotations

from collections.abc import Collection
from dataclasses import replace

from conf.errors import ProblemList
from conf.schema import MoeConfig, RouterScore
from conf.schema import CheckpointConfig
from conf.spec import ModelSpec, MoeSpec, ParallelSpec, spec_from_config
from training.models import UnknownFamily, family_of

MOE_FAMILIES = ("moe", "mixtral")
"""The families that compute model.moe (training/models/moe)."""


USER_WINS = ("aux_loss_coef",)
"""model.moe knobs config.json gives that a command-line override replaces (training
choices); the other knobs it gives are the shape, and an override must agree with them."""


def moe_config(config: MoeConfig, knobs: dict, *, explicit: Collection[str], path: str,
               problems: ProblemList) -> MoeConfig:
    """`config` with the knobs a Hugging Face config.json gave (score as a name); an explicit
    override wins for USER_WINS, and must agree with config.json for the rest."""
    if "score" in knobs:
        knobs = {**knobs, "score": RouterScore(knobs["score"])}
    out = {}
    for name, value in knobs.items():
        if f"model.moe.{name}" not in explicit:
            out[name] = value
        elif name not in USER_WINS and getattr(config, name) != value:
            problems.add(f"model.moe.{name}", getattr(config, name),
                         f"conflicts with {value} in {path}/config.json: with model.path the "
                         "shape comes from that file",
                         f"drop model.moe.{name}= or set it to {value}")
    return replace(config, **out)


def moe_spec(config: MoeConfig) -> MoeSpec:
    return spec_from_config(MoeSpec, config)


def check_moe(model: ModelSpec, *, parallel: ParallelSpec, checkpoint: CheckpointConfig,
              problems: ProblemList) -> None:
    """Every impossible model.moe combination, each with its fix."""
    moe = model.moe
    if model.head_dim % 2 and model.head_dim != model.dim // max(model.n_heads, 1):
        problems.add("model.head_dim", model.head_dim, "must be even for RoPE",
                     "e.g. 64 or 128")
    if moe.num_experts < 0:
        problems.add("model.moe.num_experts", moe.num_experts, "must be >= 0",
                     "0 = dense, else the number of routed experts")
    if not moe.enabled:
        return
    if model.family not in MOE_FAMILIES:
        problems.add("model.moe.num_experts", moe.num_experts,
                     f"model.family={model.family} has no mixture-of-experts blocks",
                     f"use model.family=moe (or mixtral), or model.moe.num_experts=0")
    if moe.capacity_factor is not None and parallel.tp > 1 and parallel.sequence_parallel:
        problems.add("model.moe.capacity_factor", moe.capacity_factor,
                     f"with parallel.tp={parallel.tp} and sequence parallel each tp rank routes "
                     "its share of the sequence, so the capacity would cap each share apart "
                     "(other tokens dropped than one process drops)",
                     "set model.moe.capacity_factor=null (dropless), or "
                     "parallel.sequence_parallel=false")
    _check_routing(model, problems)
    _check_losses(model, problems)
    if checkpoint.export_safetensors:
        _check_export(model, problems)


def _check_routing(model: ModelSpec, problems: ProblemList) -> None:
    moe = model.moe
    if not 1 <= moe.top_k <= moe.num_experts:
        problems.add("model.moe.top_k", moe.top_k,
                     f"must be from 1 to model.moe.num_experts={moe.num_experts}",
                     f"use model.moe.top_k<={moe.num_experts}, or more experts")
    for name in ("num_shared_experts", "expert_ffn_dim"):
        if getattr(moe, name) < 0:
            problems.add(f"model.moe.{name}", getattr(moe, name), "must be >= 0", "e.g. 0")
    if not 0 <= moe.first_dense_layers < model.n_layers:
        problems.add("model.moe.first_dense_layers", moe.first_dense_layers,
                     f"must be from 0 to model.n_layers-1={model.n_layers - 1} (else no "
                     "block has experts)", "e.g. 0 (Mixtral, Qwen3) or 3 (DeepSeek-V3)")
    if moe.capacity_factor is not None and moe.capacity_factor <= 0:
        problems.add("model.moe.capacity_factor", moe.capacity_factor,
                     "must be positive (or null: dropless)", "e.g. 1.25, or null")
    if moe.route_scale <= 0:
        problems.add("model.moe.route_scale", moe.route_scale, "must be positive", "e.g. 1")
    if moe.bias_update_rate < 0:
        problems.add("model.moe.bias_update_rate", moe.bias_update_rate, "must be >= 0",
                     "e.g. 0.001, or 0 for no balancing bias")
    if moe.score is RouterScore.softmax and moe.top_k == 1 and moe.renormalize:
        problems.add("model.moe.renormalize", True,
                     "with top_k=1 every token's one weight becomes 1: the router gets no "
                     "gradient from the language loss",
                     "set model.moe.renormalize=false (Switch), or top_k>=2")


def _check_losses(model: ModelSpec, problems: ProblemList) -> None:
    moe = model.moe
    for name in ("aux_loss_coef", "z_loss_coef"):
        value = getattr(moe, name)
        if value < 0:
            problems.add(f"model.moe.{name}", value, "must be >= 0", "e.g. 0.001, or 0 (off)")
    if moe.seq_aux_loss and moe.aux_loss_coef == 0:
        problems.add("model.moe.seq_aux_loss", True, "needs model.moe.aux_loss_coef > 0",
                     "set model.moe.aux_loss_coef (e.g. 0.0001)")


def _check_export(model: ModelSpec, problems: ProblemList) -> None:
    """The export writes a Hugging Face class that computes this model, or refuses up front."""
    try:
        family = family_of(model)
    except UnknownFamily:
        return  # family_rules names it
    from training.models.moe.moe_hf import export_refusals

    if family.name not in MOE_FAMILIES:
        return
    for key, value, rule in export_refusals(model, family=family.name):
        problems.add(key, value, f"{rule}: the safetensors export would not load as "
                     f"{family.hf_architectures[0]}", "set checkpoint.export_safetensors=false, "
                     "or a model Hugging Face computes")
