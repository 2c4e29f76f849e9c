"""Parameter shapes and counts, and where each parameter lives under a layout. Torch-free.

`parameter_shapes` (the model family's table, training/models/) is the one source of the
model's parameters: the count, the FLOPs and the memory per rank all derive from it
(tests/unit/test_cost_model.py checks it against the built model). Placement rules mirror what
the parallel passes do:
- pipeline: a rank holds the blocks of its stages; stage 0 the family's `first_stage` modules
  (the embedding), the last stage its `last_stage` ones (final norm and output head), and a
  copy of the embedding too when it is tied (`ModelFamily.stage_holds`;
  parallel.dims.pipeline_stage_ids, conf.rules.split_rules.stage_split);
- tensor parallel: the dim parallel/tp_plan.py names is split over tp; norms whole;
- FSDP (zero 2/3) splits dim 0 of each (tp-local) tensor over dp_shard x cp in chunks of
  ceil(rows / n), as fully_shard does.
"""
from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache

from conf.rules.split_rules import stage_split
from conf.spec import ModelSpec, RunSpec
from parallel.dims import pipeline_stage_ids
from parallel.tp_plan import tp_split_dim
from training.models import family_of
from training.models.family import block_index, block_path


def parameter_shapes(model: ModelSpec) -> list[tuple[str, tuple[int, ...]]]:
    """(name, shape) of every parameter, in `Transformer.parameters()` order."""
    return list(_parameter_shapes(model))


@lru_cache(maxsize=16)
def _parameter_shapes(model: ModelSpec) -> tuple[tuple[str, tuple[int, ...]], ...]:
    """Cached per model: `meshrun plan --search` asks for thousands of layouts."""
    return tuple(family_of(model).parameter_shapes(model))


def embedding_param(model: ModelSpec) -> str:
    """The token embedding's weight (a lookup: no matmul, no autocast copy of its own)."""
    return family_of(model).embedding_param


def numel(shape: tuple[int, ...]) -> int:
    n = 1
    for size in shape:
        n *= size
    return n


@dataclass(frozen=True, slots=True, kw_only=True)
class ParamCounts:
    total: int
    embedding: int
    """Token-embedding parameters (the output head counts here too only when tied)."""
    active: int
    """Parameters one token uses (embedding and head included): equal to total for a dense
    model; with experts, each routed expert weight counts top_k / num_experts of itself."""

    @property
    def non_embedding(self) -> int:
        return self.total - self.embedding


@lru_cache(maxsize=16)
def param_counts(model: ModelSpec) -> ParamCounts:
    shapes, embedding = parameter_shapes(model), embedding_param(model)
    share = family_of(model).active_share
    active = sum(numel(shape) * share(model, block_path(name)) for name, shape in shapes)
    return ParamCounts(total=sum(numel(shape) for _, shape in shapes),
                       embedding=sum(numel(shape) for name, shape in shapes if name == embedding),
                       active=round(active))


def held_parameters(spec: RunSpec, pp_rank: int) -> list[tuple[str, tuple[int, ...]]]:
    """The full-size parameters a pipeline rank's stages hold, in order."""
    p = spec.parallel
    if p.pp == 1:
        return parameter_shapes(spec.model)
    return list(_stage_parameters(spec.model, p.pp, p.pp_virtual_stages,
                                  tuple(stage_split(p, spec.model.n_layers)), pp_rank))


@lru_cache(maxsize=1024)
def _stage_parameters(model: ModelSpec, pp: int, virtual_stages: int, split: tuple[int, ...],
                      pp_rank: int) -> tuple[tuple[str, tuple[int, ...]], ...]:
    """held_parameters, cached by what it reads (the search asks per layout and rank)."""
    starts = [sum(split[:s]) for s in range(len(split))]
    last_stage = len(split) - 1
    family = family_of(model)
    held = []
    for stage in pipeline_stage_ids(pp=pp, virtual_stages=virtual_stages, pp_rank=pp_rank):
        blocks = range(starts[stage], starts[stage] + split[stage])
        for name, shape in _parameter_shapes(model):
            block, top = block_index(name), name.split(".")[0]
            if (block in blocks if block is not None
                    else family.stage_holds(top, first=stage == 0, last=stage == last_stage,
                                            tied=model.tie_embeddings)):
                held.append((name, shape))
    return tuple(held)


def held_layers(spec: RunSpec, pp_rank: int) -> list[int]:
    """Block indices pipeline rank `pp_rank` holds (every block without pipelining)."""
    p = spec.parallel
    if p.pp == 1:
        return list(range(spec.model.n_layers))
    return list(_stage_layers(spec.model, p.pp, p.pp_virtual_stages,
                              tuple(stage_split(p, spec.model.n_layers)), pp_rank))


@lru_cache(maxsize=1024)
def _stage_layers(model: ModelSpec, pp: int, virtual_stages: int, split: tuple[int, ...],
                  pp_rank: int) -> tuple[int, ...]:
    held = _stage_parameters(model, pp, virtual_stages, split, pp_rank)
    return tuple(sorted({block_index(name) for name, _ in held} - {None}))


@lru_cache(maxsize=4096)
def tp_local_shape(name: str, shape: tuple[int, ...], tp: int, family: str) -> tuple[int, ...]:
    """The shape of parameter `name` of a `family` model (ModelSpec.family) on one tp rank."""
    dim = tp_split_dim(name, family)
    if tp == 1 or dim is None or dim >= len(shape):
        return shape
    return (*shape[:dim], shape[dim] // tp, *shape[dim + 1:])


def fsdp_local_numel(shape: tuple[int, ...], *, shards: int, index: int) -> int:
    """Elements of shard `index` when dim 0 is split in chunks of ceil(rows / shards)."""
    rows, rest = shape[0], numel(shape[1:])
    chunk = -(-rows // shards)
    return max(0, min(rows, (index + 1) * chunk) - index * chunk) * rest


def sharded_numel(name: str, local: tuple[int, ...], *, family: str, shards: int, index: int,
                  ep: int = 1, expert_shards: int = 1) -> int:
    """Elements a rank holds of parameter `name` (tp-local shape `local`): FSDP's shard
    `index` of `shards`; a routed expert weight (ModelFamily.is_expert_param) under ep > 1
    is first split over ep on dim 0 (E/ep experts each), then FSDP-sharded over the
    `expert_shards` ranks holding the same experts (parallel/expert_parallel.py)."""
    if ep > 1 and family_of_name(family).is_expert_param(name):
        return fsdp_local_numel((local[0] // ep, *local[1:]), shards=expert_shards,
                                index=index % expert_shards)
    return fsdp_local_numel(local, shards=shards, index=index)


def family_of_name(family: str):
    from training.models import model_family

    return model_family(family)


@lru_cache(maxsize=16)
def expert_params(model: ModelSpec) -> tuple[int, int]:
    """(routed-expert parameters of the whole model, blocks that have routed experts)."""
    family = family_of(model)
    experts = [(name, shape) for name, shape in _parameter_shapes(model)
               if family.is_expert_param(name)]
    return (sum(numel(shape) for _, shape in experts),
            len({block_index(name) for name, _ in experts}))


@lru_cache(maxsize=256)
def tp_local_params(model: ModelSpec, tp: int) -> int:
    """Parameters one tp rank holds of the whole model: those tp splits 1/tp, the rest
    (norms, and a MoE model's routers and experts) whole."""
    return sum(numel(tp_local_shape(name, shape, tp, model.family))
               for name, shape in _parameter_shapes(model))


@lru_cache(maxsize=16)
def token_local_params(model: ModelSpec) -> tuple[int, int]:
    """(parameters of the family's token-local modules (TpPlan.token_local: the MoE
    feed-forwards, whole on every tp rank), the routed experts among them)."""
    family = family_of(model)
    paths = tuple(f"{path}." for path in family.tp.token_local)
    local = [(name, shape) for name, shape in _parameter_shapes(model)
             if (block_path(name) or "").startswith(paths)] if paths else []
    return (sum(numel(shape) for _, shape in local),
            sum(numel(shape) for name, shape in local if family.is_expert_param(name)))
