"""What every model family tells the rest of meshrun: the `ModelFamily` protocol. Torch-free.

A family fills one frozen `ModelFamily` in its folder's torch-free module (training/models/llama
is the first). The cost model, the parallel passes, init, export and the Hugging Face import ask
it for names instead of spelling them; only the family's own folder spells its submodules.

The contract its torch module keeps (training/models/llama/model.py is the example):
- built from a `ModelSpec` (`module_class(spec)`), keeping it as `.spec`;
- its blocks in `BLOCKS`, an `nn.ModuleDict` keyed by the global block index "0", "1", ... (so
  a pipeline stage drops blocks without renumbering); parameter names `layers.{i}.<path>`;
- every top-level module named in `first_stage` / `last_stage` may be None (a pipeline stage
  dropped it): `forward(tokens)` then takes or gives hidden states [B, T, dim]; with tied
  embeddings the last stage keeps the embedding for the head's weight (`stage_holds`) and
  still takes hidden states (embed only integer token ids);
- its `head` module exists whether or not the embedding is tied: tied, it is a weightless
  `TiedHead` (training/loss.py) called with the embedding's weight;
- `forward(tokens, *, doc_ids=None, doc_positions=None, targets=None, loss_chunks=1)`: logits,
  or with `targets` the sum of their token cross entropies;
- `rope_positions` and `document_mask` attributes (context parallelism sets them), a `context`
  attribute on each block's `attention` submodule, and `reset_rope_tables()` (called after
  materialising; a family without RoPE tables does nothing there).
"""
from __future__ import annotations

import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from functools import lru_cache
from typing import TYPE_CHECKING

from conf.choices import RecomputeTarget

if TYPE_CHECKING:
    from conf.errors import ProblemList
    from conf.spec import ModelSpec

Shapes = tuple[tuple[str, tuple[int, ...]], ...]

BLOCKS = "layers"
"""The module holding every family's blocks; block parameters are named `layers.{i}.<path>`."""
_BLOCK_PARAM = re.compile(r"layers\.(\d+)\.(.+)")


@lru_cache(maxsize=1 << 16)
def block_index(param_name: str) -> int | None:
    """The block a parameter belongs to (`layers.{i}.…` -> i), or None outside the blocks.
    Memoised: the cost model asks it of every parameter of every candidate layout."""
    match = _BLOCK_PARAM.fullmatch(param_name)
    return int(match.group(1)) if match else None


@lru_cache(maxsize=1 << 16)
def block_path(param_name: str) -> str | None:
    """A block parameter's name inside its block (`layers.3.x.weight` -> `x.weight`), or None."""
    match = _BLOCK_PARAM.fullmatch(param_name)
    return match.group(2) if match else None


def block_param(index: int | str, path: str) -> str:
    """The full name of parameter `path` of block `index`."""
    return f"{BLOCKS}.{index}.{path}"


@dataclass(frozen=True, slots=True, kw_only=True)
class TpPlan:
    """Which modules tensor parallelism splits (Megatron pairs), read by the TP pass
    (parallel/tensor_parallel.py) and by the cost model (parallel/tp_plan.py `tp_split_dim`)."""

    column: tuple[str, ...]
    """Block submodules split by output features (dim 0 of an nn.Linear weight, and its bias)."""
    row: tuple[str, ...]
    """Block submodules split by input features (dim 1; partial sums reduced)."""
    embedding: str
    """The top-level token embedding: vocabulary rows split over tp."""
    head: str
    """The top-level output head: vocabulary columns (the logits) split over tp."""
    sequence_norms: tuple[str, ...]
    """Block submodules sharded over the sequence under sequence parallel (the norms)."""
    final_norm: str
    """The top-level norm sharded over the sequence under sequence parallel."""
    gathered_inputs: tuple[str, ...]
    """Block submodules whose (sequence-sharded) input is all-gathered under sequence parallel."""
    head_norms: tuple[str, ...] = ()
    """Block submodules normalising each head of a column-parallel output (Qwen3's q/k
    norms, input [B, T, heads, head_dim]): their input is split over the heads (dim 2), their
    weight replicated and its gradient summed over tp."""
    token_local: tuple[str, ...] = ()
    """Block submodules whose weights every tp rank holds whole (the MoE feed-forward). Under
    sequence parallel each takes its rank's share of the sequence as a plain tensor (its
    `shard_tokens(group)`, if it has one, is given the tp group) and returns one, and their
    gradients are summed over tp (parallel/tp_replicated.py); without sequence parallel
    every rank computes them on the whole sequence."""


@dataclass(frozen=True, slots=True, kw_only=True)
class FsdpUnits:
    """The FSDP units outside the blocks (each block is one unit of its own)."""

    resharded: tuple[str, ...]
    """Top-level modules, each its own unit, re-sharded after forward like the blocks."""
    gathered: tuple[str, ...]
    """Top-level modules forming one unit never re-sharded after forward (backward starts
    with them, so a re-shard would be gathered again at once)."""


@dataclass(frozen=True, slots=True, kw_only=True)
class RecomputeSubmodules:
    """What a selective recompute target re-runs in each block: `method` of `submodules`."""

    submodules: tuple[str, ...]
    """Block submodules ("" = the block itself)."""
    method: str = "forward"
    """The method run under checkpoint (forward, or a part of it the module names)."""


@dataclass(frozen=True, slots=True, kw_only=True, eq=False)
class ModelFamily:
    """Everything that knows a family's architecture, without torch (see the module doc).
    Compared (and hashed) by identity: one object per family."""

    name: str
    module_class: str
    """Import path of the torch module class, "package.module:Class" (imported on demand)."""
    parameter_shapes: Callable[[ModelSpec], Shapes]
    """(name, shape) of every parameter of the whole model, in `module.parameters()` order."""
    check: Callable[[ModelSpec, ProblemList], None]
    """Adds a problem for each model knob this family does not compute (resolve())."""
    embedding: str
    """The top-level token embedding module (a lookup: no matmul, no autocast copy)."""
    head: str
    """The top-level output head module (a weightless `TiedHead` when embeddings are tied)."""
    attention: str
    """The block submodule whose `context` attribute context parallelism sets."""
    first_stage: tuple[str, ...]
    """Top-level modules only the first pipeline stage holds."""
    last_stage: tuple[str, ...]
    """Top-level modules only the last pipeline stage holds."""
    tp: TpPlan
    fsdp_untied: FsdpUnits
    fsdp_tied: FsdpUnits
    recompute: Mapping[RecomputeTarget, RecomputeSubmodules]
    """Block submodules per module target (ops is a policy over the whole block)."""
    init_ones: tuple[str, ...]
    """Parameter-name suffixes initialised to 1 (norm scales); biases start at 0."""
    residual_outputs: tuple[str, ...]
    """Parameter-name suffixes of the residual branches' outputs: N(0, init_std/sqrt(2L))."""
    hf_architectures: tuple[str, ...]
    """The Hugging Face classes this family computes exactly (config.json `architectures`)."""
    hf_names: Mapping[str, str]
    """Our parameter name -> the Hugging Face one; "{i}" stands for the block index."""
    read_hf_config: Callable[[dict], tuple[dict[str, object], list[str]]]
    """config.json -> (ModelConfig knob -> value, refusals: settings this family cannot model)."""
    hf_key: Callable[[str], str]
    """The config.json key a knob is read from (for messages)."""
    write_hf_config: Callable[[ModelSpec, str], dict]
    """(model, dtype name) -> config.json (without the tokenizer's special-token ids)."""
    hf_config_for_tokenizer: Callable[[dict, dict | None], dict] = lambda config, tok: config
    """(config.json, the run's tokenizer.json or None for a tiktoken file) -> the config.json
    under which transformers' AutoTokenizer loads that tokenizer as it is (some Hugging Face
    classes impose their own tokenizer pipeline; a family then writes an equal class)."""
    active_share: Callable[[ModelSpec, str | None], float] = lambda model, path: 1.0
    """(model, a parameter's block path or None) -> the share of it one token uses (a routed
    expert weight: top_k / num_experts); the cost model's active parameters."""
    hf_zero_tensors: Callable[[ModelSpec, dict], Mapping[str, tuple[int, ...]]] = (
        lambda model, config: {})
    """(model, config.json) -> Hugging Face tensors config.json's class holds and our module
    does not (e.g. a zero o_proj bias): the export writes them as zeros; on import they must
    be all zero and are not loaded."""

    experts: str = ""
    """The block submodule of the routed experts, a GroupedExperts (3-D weights w1, w2, w3,
    the expert on dim 0, called as `experts(x_sorted, counts)`), that expert parallelism
    shards over the ep ranks (parallel/expert_parallel.py); "" = a dense family."""
    routed_experts: Callable[[ModelSpec], int] = lambda model: 0
    """Routed experts in each MoE block of `model` (0 = dense): parallel.ep must divide it."""
    routed_per_token: Callable[[ModelSpec], int] = lambda model: 0
    """Routed experts each token is sent to (top-k; 0 = dense): the copies expert
    parallelism's all-to-all moves (parallel/cost/comm.py)."""
    fixed_matmul_order: bool = False
    """Each block runs the same matmuls in the same order every step: q, k, v, out, gate,
    up, down (parallel/cost/matmul_rate.py `block_gemms`), so recompute.ops_matmuls=alternate
    keeps a known half. False where routing decides the calls (experts)."""

    def is_expert_param(self, param_name: str) -> bool:
        """Whether `param_name` is a routed-expert weight (sharded over ep)."""
        path = block_path(param_name)
        return bool(self.experts) and path is not None and path.startswith(f"{self.experts}.")

    def stage_holds(self, module: str, *, first: bool, last: bool, tied: bool) -> bool:
        """Whether a pipeline stage holds top-level module `module` (outside the blocks): the
        first stage the `first_stage` modules, the last the `last_stage` ones, and with tied
        embeddings the last stage the embedding too - a copy whose weight the head uses,
        its gradient summed with the first stage's (parallel/tied_embeddings.py). Read by the
        stage split (parallel/pipeline.py) and the cost model (parallel/cost/params.py)."""
        return (first and module in self.first_stage or last and module in self.last_stage
                or last and tied and module == self.embedding)

    def fsdp_units(self, *, tied: bool) -> FsdpUnits:
        return self.fsdp_tied if tied else self.fsdp_untied

    @property
    def embedding_param(self) -> str:
        return f"{self.embedding}.weight"

    def in_recomputed_submodule(self, target: RecomputeTarget, param_name: str) -> bool:
        """Whether block parameter `param_name` belongs to a submodule `target` re-runs."""
        path = block_path(param_name)
        parts = self.recompute[target].submodules if target in self.recompute else ()
        return path is not None and any(not sub or path.startswith(f"{sub}.") for sub in parts)
