"""Static bytes per rank (parameters, gradients, optimizer state) under a parallel layout.

Torch-free: the plan and the dry run call it for every rank; tests/distributed compare it
with the bytes the ranks really hold. The rules mirror what the parallel passes do:
- pipeline: a rank holds the blocks of its stages; stage 0 the embedding, the last stage the
  final norm and output head (parallel.dims.pipeline_stage_ids, conf.layout_rules.stage_split);
- tensor parallel: column-parallel weights (wq, wk, wv, w1, w3, output, and the embedding's
  vocabulary rows) split dim 0 over tp, row-parallel ones (wo, w2) split dim 1; norms whole;
- FSDP (zero 2/3) splits dim 0 of each (TP-local) tensor over dp_shard x cp in chunks of
  ceil(rows / n), as fully_shard does; gradients and AdamW moments follow the shards;
- ZeRO-1 keeps whole parameters and gradients, and AdamW moments only for the parameters
  the rank owns (parallel.dims.zero1_owners);
- AdamW keeps two moments per element (fp32, or bf16 with optimizer_state_dtype=bf16) and a
  4-byte step count per parameter tensor. Parameters are fp32: they are the master weights.
"""
from __future__ import annotations

from dataclasses import dataclass

from conf.layout_rules import stage_split
from conf.spec import ModelSpec, RunSpec
from parallel.dims import ParallelDims, pipeline_stage_ids, zero1_owners

PARAM_BYTES = 4
STEP_BYTES = 4
COLUMN_PARALLEL = ("wq", "wk", "wv", "w1", "w3")
ROW_PARALLEL = ("wo", "w2")


def parameter_shapes(model: ModelSpec) -> list[tuple[str, tuple[int, ...]]]:
    """(name, shape) of every parameter, in `Transformer.parameters()` order."""
    d, f, hd = model.dim, model.ffn_dim, model.head_dim
    q, kv = model.n_heads * hd, model.n_kv_heads * hd
    block = [("attention_norm", (d,)), ("attention.wq", (q, d)), ("attention.wk", (kv, d)),
             ("attention.wv", (kv, d)), ("attention.wo", (d, q)), ("ffn_norm", (d,)),
             ("feed_forward.w1", (f, d)), ("feed_forward.w3", (f, d)),
             ("feed_forward.w2", (d, f))]
    shapes = [("tok_embeddings.weight", (model.vocab_size, d))]
    for i in range(model.n_layers):
        shapes += [(f"layers.{i}.{name}.weight", shape) for name, shape in block]
    shapes.append(("norm.weight", (d,)))
    if not model.tie_embeddings:
        shapes.append(("output.weight", (model.vocab_size, d)))
    return shapes


def held_parameters(spec: RunSpec, pp_rank: int) -> list[tuple[str, tuple[int, ...]]]:
    """The full-size parameters a pipeline rank's stages hold, in order."""
    p = spec.parallel
    if p.pp == 1:
        return parameter_shapes(spec.model)
    split = stage_split(p, spec.model.n_layers)
    starts = [sum(split[:s]) for s in range(len(split))]
    last_stage = len(split) - 1
    held = []
    for stage in pipeline_stage_ids(pp=p.pp, virtual_stages=p.pp_virtual_stages, pp_rank=pp_rank):
        layers = {str(i) for i in range(starts[stage], starts[stage] + split[stage])}
        for name, shape in parameter_shapes(spec.model):
            top = name.split(".")[0]
            if (top == "layers" and name.split(".")[1] in layers
                    or top == "tok_embeddings" and stage == 0
                    or top in ("norm", "output") and stage == last_stage):
                held.append((name, shape))
    return held


def held_layers(spec: RunSpec, pp_rank: int) -> list[int]:
    """Block indices pipeline rank `pp_rank` holds (every block without pipelining)."""
    return sorted({int(name.split(".")[1]) for name, _ in held_parameters(spec, pp_rank)
                   if name.startswith("layers.")})


def tp_local_shape(name: str, shape: tuple[int, ...], tp: int) -> tuple[int, ...]:
    if tp == 1 or len(shape) == 1:
        return shape
    module = name.split(".")[-2]
    if module in ROW_PARALLEL:
        return (shape[0], shape[1] // tp)
    if module in COLUMN_PARALLEL or module in ("output", "tok_embeddings"):
        return (shape[0] // tp, *shape[1:])
    return shape


def fsdp_local_numel(shape: tuple[int, ...], *, shards: int, index: int) -> int:
    """Elements of shard `index` when dim 0 is split in chunks of ceil(rows / shards)."""
    rows, rest = shape[0], 1
    for size in shape[1:]:
        rest *= size
    chunk = -(-rows // shards)
    return max(0, min(rows, (index + 1) * chunk) - index * chunk) * rest


@dataclass(frozen=True, slots=True, kw_only=True)
class StaticBytes:
    params: int
    grads: int
    optimizer: int


def static_bytes(spec: RunSpec, rank: int) -> StaticBytes:
    """Parameters, gradients and optimizer state `rank` holds after an optimizer step."""
    dims = ParallelDims.from_spec(spec.parallel)
    coords = dims.coordinates(rank)
    moment_bytes = 2 if spec.precision.optimizer_state_dtype.value == "bf16" else 4
    local = [tp_local_shape(n, s, dims.tp) for n, s in held_parameters(spec, coords["pp"])]
    if dims.uses_fsdp:
        shards, index = dims.dp_shard * dims.cp, coords["dp_shard"] * dims.cp + coords["cp"]
        sizes = [fsdp_local_numel(s, shards=shards, index=index) for s in local]
    else:
        sizes = [_numel(s) for s in local]
    optimized = sizes  # AdamW keeps state for what it updates: everything held, except ZeRO-1
    if dims.zero == 1 and dims.uses_ddp:
        owners = zero1_owners(sizes, dims.dp_shard)
        optimized = [n for n, o in zip(sizes, owners) if o == coords["dp_shard"]]
    params = PARAM_BYTES * sum(sizes)
    optimizer = 2 * moment_bytes * sum(optimized) + STEP_BYTES * len(optimized)
    return StaticBytes(params=params, grads=params, optimizer=optimizer)


def _numel(shape: tuple[int, ...]) -> int:
    n = 1
    for size in shape:
        n *= size
    return n
