"""Communication of one training step, per mesh axis: which collectives, how many bytes, over
which link, at what alpha-beta cost, and whether compute hides it. Torch-free.

Cost of one collective over a group of n ranks with per-step latency alpha (s) and per-rank
bandwidth B (bytes/s), V the full (unsharded) buffer, ring algorithms (NCCL's, gloo's):

    all-gather, reduce-scatter:  o + (n-1) * alpha + (n-1)/n * V / B
    all-reduce:                 o + 2(n-1) * alpha + 2(n-1)/n * V / B
    point-to-point send:        o + alpha + V / B

o is the link's software cost per call (`Link.call_overhead_s`): what one call costs beyond
the wire, the same whatever its size (the framework code around it: FSDP2's hooks with their
copy-in/copy-out, DTensor's redistribution, the pipeline schedule's send/recv, the context-
parallel autograd function; and the peers meeting after compute). Preflight's back-to-back
bare all-reduces cannot see it; a calibration on training runs fits it
(parallel.cost.calibrate). Bare calls, and calls that follow another with no compute
between (zero 1's broadcasts after the optimizer step, the token count, V's gather after
K's, HSDP's all-reduce after its reduce-scatter), pay alpha-beta only (`Collective.bare`).

The link of an axis: ranks are numbered row-major over conf.degrees.MESH_AXES (tp fastest),
so a group of the axis spans `stride * size` consecutive ranks (stride = the product of the
degrees after it); it stays inside a node when that block fits in (and tiles) a node's ranks.

Per step, with a micro-batches of accumulation (grad_accum_steps), L blocks on a rank:
- FSDP (zero 2/3) over dp_shard x cp: parameters all-gathered once per micro-batch in forward
  (zero 3: again in backward, after the forward reshard), gradients reduce-scattered once per
  step (the loop turns gradient sync off on all but the last micro-batch:
  parallel.data_parallel.gradient_sync); one call per FSDP unit (each block, the embedding,
  and the final norm with the head - one unit with the embedding when tied), so the latency
  is paid L + 2 times; zero 3 gathers every unit again in backward but the head unit, which
  is never re-sharded after forward;
- DDP (zero 0/1) over dp_replicate x dp_shard x cp: gradients all-reduced once per step (the
  RoPE tables are buffers every rank computes alike: broadcast_buffers is off); under tp
  (axis "dp_tp", parallel/dp_tp_grads.py) the tp-local gradients are all-reduced after the
  backward, in buckets (counted as one call), not overlapped; zero 1 also all-gathers the
  updated parameters from their owners after the optimizer step, one call per parameter
  tensor (each is broadcast by its owner);
- HSDP: the replicate axis all-reduces the shard's gradients once per step (with the
  reduce-scatter);
- TP: per block, per micro-batch, 2 in forward and 2 in backward (attention and MLP): an
  all-reduce of the block's activations, or with sequence parallelism an all-gather plus a
  reduce-scatter (the same ring volume); a full-recompute re-run adds the 2 forward ones;
  with fp8 the all-gathers move 1 byte an element (torchao's Float8 TP styles gather the
  linears' inputs and, in backward, their output gradients already cast to fp8:
  parallel/float8_tp.py), the reduce-scatters and all-reduces the activations' dtype;
  a MoE block's feed-forward (router and experts whole on every tp rank) takes none, and
  under sequence parallel its gradients (this rank's shards) are all-reduced once a step;
- CP: per block, per micro-batch, K and V all-gathered to the full sequence in forward and
  their gradients reduce-scattered in backward, K and V one call each;
- PP: per pipeline micro-batch and virtual stage, one activation sent forward and one gradient
  sent back; with tied embeddings, once per step, the embedding's gradient (this rank's tp and
  FSDP shard of it) all-reduced between the first and the last stage;
- EP (parallel.ep > 1), per MoE block, per micro-batch: the token copies sent to their
  experts' ranks and back (dispatch and combine), forward and again in backward (their
  gradients), each an all-to-all of tokens x top-k x dim activations of which (ep-1)/ep
  cross, scaled by the ep imbalance (the busiest rank's share over the mean: the knob
  parallel.ep_imbalance, else the calibration's, else 1; step_time.hardware_of); a
  full-recompute re-run adds the 2 forward ones; the split sizes (E integers) go first, bare.
  The experts' FSDP gathers and reduce-scatters their ep shard over the dp x cp / ep ranks
  holding the same experts (the efsdp axis), the dense rest over dp_shard x cp as without EP;
- the step's bookkeeping (axis "step"): the target-token count all-reduced over dp x cp
  (training.step.count_global_tokens), and the gradient norm's partial sums all-reduced over
  each axis that splits the parameters (FSDP's shard axis, tp, pp: parallel.grad_norm), a
  few bytes each.

Overlap rule (`exposed_s`): data-parallel traffic (FSDP, DDP, HSDP) runs under the compute of
the other blocks, so only the first block's gather and the last block's reduction (1/L of it)
and whatever the compute cannot cover are exposed; zero 1's parameter gather after the
optimizer step, DDP's under tp (dp_tp), TP, CP and PP traffic sit on the critical path and are
exposed in full. Where
the device cannot overlap (CPU: gloo uses the same cores as compute) all of it is exposed.
"""
from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache

from conf.degrees import FLATTENED_AXES, MESH_AXES
from conf.spec import RunSpec
from parallel.cost.activations import DTYPE_BYTES
from parallel.cost.optimizer_state import muon_matrices
from parallel.cost.params import (expert_params, numel, parameter_shapes, token_local_params,
                                  tp_local_params)
from parallel.tp_plan import tp_split_dim
from training.models import family_of

RING_STEPS = {"all_gather": 1, "reduce_scatter": 1, "all_reduce": 2, "all_to_all": 1}
"""How many (n-1)/n passes over the buffer each ring collective makes."""

FSDP_AXES = FLATTENED_AXES["dp_shard_cp"]
"""The mesh axes FSDP (zero 2/3) shards over."""
DP_CP_AXES = FLATTENED_AXES["dp_cp"]
"""The mesh axes DDP averages gradients over and the token count is summed over."""

OVERLAPPED_AXES = ("fsdp", "ddp", "hsdp", "efsdp")
"""Traffic the overlap rule lets compute hide (all but the first/last block's share)."""


@dataclass(frozen=True, slots=True, kw_only=True)
class Link:
    name: str
    """"intra-node" or "inter-node"."""
    gbps: float
    """Bandwidth per rank per direction, GB/s (1e9 bytes/s)."""
    latency_s: float
    """alpha: the fixed cost of one step of a collective."""
    call_overhead_s: float = 0.0
    """o: the software cost of one call, whatever its size (module docstring)."""


@dataclass(frozen=True, slots=True, kw_only=True)
class Collective:
    """One kind of collective of a step: `calls` calls of `op` over `group` ranks, each on a
    `size_bytes` buffer (the full, unsharded one)."""

    axis: str
    """What it serves: fsdp, ddp, zero1, hsdp, tp, cp or pp."""
    op: str
    """all_gather, reduce_scatter, all_reduce or p2p."""
    group: int
    size_bytes: float
    calls: int
    link: Link
    why: str
    bare: bool = False
    """Plain library calls with no framework code around them: no call overhead."""

    @property
    def seconds(self) -> float:
        wire = collective_s(self.op, n=self.group, size_bytes=self.size_bytes, link=self.link)
        return self.calls * (wire + (0.0 if self.bare else self.link.call_overhead_s))


def collective_s(op: str, *, n: int, size_bytes: float, link: Link) -> float:
    """Alpha-beta time of one ring collective (module docstring, without o); 0 for a group
    of one."""
    if op == "p2p":
        return link.latency_s + size_bytes / (link.gbps * 1e9)
    if n <= 1:
        return 0.0
    passes = RING_STEPS[op]
    return passes * ((n - 1) * link.latency_s + (n - 1) / n * size_bytes / (link.gbps * 1e9))


def axis_stride(degrees: dict[str, int], axes: tuple[str, ...]) -> int:
    """Rank distance between neighbours of a group over `axes` (adjacent mesh axes)."""
    last = max(MESH_AXES.index(axis) for axis in axes)
    stride = 1
    for axis in MESH_AXES[last + 1:]:
        stride *= degrees[axis]
    return stride


def axis_is_intra_node(degrees: dict[str, int], axes: tuple[str, ...], ranks_per_node: int) -> bool:
    """Does every group over `axes` stay inside one node of `ranks_per_node` ranks?"""
    block = axis_stride(degrees, axes)
    for axis in axes:
        block *= degrees[axis]
    return block <= ranks_per_node and ranks_per_node % block == 0


def step_collectives(spec: RunSpec, *, ranks_per_node: int, intra: Link, inter: Link,
                     ep_imbalance: float = 1.0) -> list[Collective]:
    """Every collective one rank takes part in during a step (module docstring);
    `ep_imbalance`: the busiest ep rank's tokens over the mean (step_time.Hardware's: the
    knob, else the calibration, else 1.0)."""
    p = spec.parallel
    degrees = tuple(getattr(p, axis) for axis in MESH_AXES)

    def link(*axes: str) -> Link:
        return intra if _intra_node(degrees, axes, ranks_per_node) else inter

    shape = _Shape.of(spec)
    out: list[Collective] = []
    out += _data_parallel(spec, shape, link)
    out += _tensor_parallel(spec, shape, link("tp"))
    out += _context_parallel(spec, shape, link("cp"))
    out += _pipeline(spec, shape, link("pp"))
    out += _expert_parallel(spec, shape, intra if ep_is_intra_node(p, ranks_per_node)
                            else inter, link(*DP_CP_AXES), imbalance=ep_imbalance)
    out += _bookkeeping(spec, link)
    out += _muon_gathers(spec, link)
    return [c for c in out if c.calls > 0 and (c.group > 1 or c.op == "p2p")]


@lru_cache(maxsize=4096)
def _intra_node(degrees: tuple[int, ...], axes: tuple[str, ...], ranks_per_node: int) -> bool:
    """axis_is_intra_node, cached by the layout's degrees (in MESH_AXES order): the search
    asks it for thousands of layouts."""
    return axis_is_intra_node(dict(zip(MESH_AXES, degrees)), axes, ranks_per_node)


@dataclass(frozen=True, slots=True)
class _Shape:
    stage_params: float
    """Parameters one tp rank of one pipeline stage holds before data-parallel sharding."""
    param_bytes: int
    """Bytes per element of the gathered parameters (FSDP mixed precision: compute dtype)."""
    grad_bytes: int
    """Bytes per element of the reduced gradients (precision.reduce_dtype)."""
    act_bytes: int
    micro_batches: int
    """Training micro-batches per step (gradient accumulation)."""
    tokens_per_micro_batch: int
    """Tokens of one micro-batch on one rank (after the cp split)."""
    layers: int
    """Blocks on one pipeline rank."""
    tensors: int
    """Parameter tensors on one pipeline rank."""

    expert_params: float = 0.0
    """Routed-expert parameters one pipeline stage holds on one rank (its ep shard) under
    ep > 1, sharded by their own FSDP; 0 without EP (then in stage_params)."""
    token_local_params: float = 0.0
    """Parameters of the token-local modules (MoE feed-forwards, whole on every tp rank)
    one rank holds of one pipeline stage, after its FSDP and ep shards."""
    moe_layers: int = 0
    """Blocks with routed experts on one pipeline rank (their feed-forward takes no tp
    collective: its weights are whole on every tp rank)."""

    @classmethod
    def of(cls, spec: RunSpec) -> "_Shape":
        p, t, m = spec.parallel, spec.training, spec.model
        compute = spec.precision.compute_dtype.value
        low = DTYPE_BYTES.get(compute, 4)
        micro = t.grad_accum_steps
        experts = expert_params(m)[0] if p.ep > 1 else 0
        return cls(stage_params=(tp_local_params(m, p.tp) - experts) / p.pp,
                   expert_params=experts / (p.pp * p.ep),
                   token_local_params=_token_local_shard(spec) / p.pp,
                   moe_layers=min(max(1, m.n_layers // p.pp),
                                          -(-expert_params(m)[1] // p.pp)),
                   param_bytes=low if p.uses_fsdp else 4,
                   grad_bytes=DTYPE_BYTES.get(spec.precision.reduce_dtype.value, 4),
                   act_bytes=low if compute != "fp32" else 4, micro_batches=micro,
                   tokens_per_micro_batch=p.cp_share(t.micro_batch_size * t.seq_len),
                   layers=max(1, m.n_layers // p.pp),
                   tensors=max(1, len(parameter_shapes(m)) // p.pp))


def _token_local_shard(spec: RunSpec) -> float:
    """Token-local parameters one rank holds of the whole model (FSDP's and ep's shards)."""
    p = spec.parallel
    local, experts = token_local_params(spec.model)
    shards = p.fsdp_shards if p.uses_fsdp else 1
    if p.ep > 1:
        return (local - experts) / shards + experts / (p.ep * p.expert_fsdp_shards)
    return local / shards


def _edge_units(spec: RunSpec) -> int:
    """FSDP units besides the blocks on the busiest pipeline rank (parallel/fsdp.py): the
    embedding and the head unit (one unit when tied), or under pp the one the first or the
    last stage holds."""
    if spec.parallel.pp > 1 or spec.model.tie_embeddings:
        return 1
    return 2


def _data_parallel(spec: RunSpec, s: _Shape, link) -> list[Collective]:
    p = spec.parallel
    shard = p.fsdp_shards
    if p.zero in (2, 3):
        units = s.layers + _edge_units(spec)
        # zero 3 gathers every unit again for backward but the head unit (never re-sharded)
        gathers = 2 * units - 1 if p.zero == 3 else units
        out = [Collective(axis="fsdp", op="all_gather", group=shard,
                          size_bytes=s.stage_params * s.param_bytes / units,
                          calls=gathers * s.micro_batches, link=link(*FSDP_AXES),
                          why=f"zero {p.zero}: each unit gathered {gathers}x per micro-batch"),
               Collective(axis="fsdp", op="reduce_scatter", group=shard,
                          size_bytes=s.stage_params * s.grad_bytes / units,
                          calls=units, link=link(*FSDP_AXES),
                          why="each unit's gradients, on the step's last micro-batch")]
        if p.dp_replicate > 1:
            out.append(Collective(axis="hsdp", op="all_reduce", group=p.dp_replicate,
                                  size_bytes=s.stage_params * s.grad_bytes / shard / units,
                                  calls=units, link=link("dp_replicate"), bare=True,
                                  why="each unit's gradient shard across replicas, once a "
                                      "step, right after its reduce-scatter"))
        return out
    group = p.dp_cp
    out = [Collective(axis="ddp" if p.tp == 1 else "dp_tp", op="all_reduce", group=group,
                      size_bytes=s.stage_params * s.grad_bytes, calls=1,
                      link=link(*DP_CP_AXES), why="gradients, once a step" if p.tp == 1 else
                      "the tp-local gradients, once a step, after backward")]
    if p.zero == 1:
        out.append(Collective(axis="zero1", op="all_gather", group=group,
                              size_bytes=s.stage_params * 4 / s.tensors, calls=s.tensors,
                              link=link(*DP_CP_AXES), bare=True,
                              why="updated parameters from their owners, back to back"))
    return out


def ep_is_intra_node(p, ranks_per_node: int) -> bool:
    """The ep ranks are the innermost ep of dp x cp (parallel/mesh.py), tp apart: a group
    spans tp x ep consecutive ranks."""
    block = p.tp * p.ep
    return block <= ranks_per_node and ranks_per_node % block == 0


def all_to_all_bytes(spec: RunSpec, tokens: float, *, imbalance: float) -> float:
    """One dispatch (or combine) buffer of a rank: its `tokens` x top-k copies x dim
    activations, x `imbalance` (the busiest rank's share over the mean)."""
    top_k = family_of(spec.model).routed_per_token(spec.model)
    act = DTYPE_BYTES.get(spec.precision.compute_dtype.value, 4)
    return tokens * top_k * spec.model.dim * act * imbalance


def _expert_parallel(spec: RunSpec, s: _Shape, link: Link, dp_link: Link, *,
                     imbalance: float) -> list[Collective]:
    p = spec.parallel
    if p.ep <= 1:
        return []
    moe_layers = max(1, expert_params(spec.model)[1] // p.pp)
    per_block = 4 + (2 if spec.recompute.mode.value == "full" else 0)
    calls = per_block * moe_layers * s.micro_batches
    size = all_to_all_bytes(spec, s.tokens_per_micro_batch, imbalance=imbalance)
    experts = routed_count(spec)
    out = [Collective(axis="ep", op="all_to_all", group=p.ep, size_bytes=size, calls=calls,
                      link=link, why=f"tokens to their experts and back: {per_block} per "
                                     "MoE block"),
           Collective(axis="ep", op="all_to_all", group=p.ep, size_bytes=8 * experts,
                      calls=calls // 2, link=link, bare=True,
                      why="split sizes before each dispatch")]
    if p.uses_fsdp:
        gathers = 2 * moe_layers if p.zero == 3 else moe_layers
        unit = s.expert_params / moe_layers
        out += [Collective(axis="efsdp", op="all_gather", group=p.expert_fsdp_shards,
                           size_bytes=unit * s.param_bytes, calls=gathers * s.micro_batches,
                           link=dp_link, why="each block's experts (their ep shard)"),
                Collective(axis="efsdp", op="reduce_scatter", group=p.expert_fsdp_shards,
                           size_bytes=unit * s.grad_bytes, calls=moe_layers, link=dp_link,
                           why="each block's expert gradients, once a step")]
    return out


def routed_count(spec: RunSpec) -> int:
    return family_of(spec.model).routed_experts(spec.model)


def _tensor_parallel(spec: RunSpec, s: _Shape, link: Link) -> list[Collective]:
    p = spec.parallel
    if p.tp <= 1:
        return []
    per_block = 4 + (2 if spec.recompute.mode.value == "full" else 0)
    # a MoE block: attention's pair only (its feed-forward runs on whole weights)
    calls = (per_block * s.layers - per_block // 2 * s.moe_layers) * s.micro_batches
    elements = s.tokens_per_micro_batch * spec.model.dim
    why = f"{per_block} per block" + (f" ({per_block // 2} per MoE block)" if s.moe_layers else "")
    if not p.sequence_parallel:
        return [Collective(axis="tp", op="all_reduce", group=p.tp,
                           size_bytes=elements * s.act_bytes, calls=calls, link=link, why=why)]
    gather = tp_gather_bytes(spec, s.act_bytes)
    out = [Collective(axis="tp", op=op, group=p.tp, size_bytes=elements * nbytes, calls=calls,
                      link=link, why=f"sequence parallel: {why}{note}")
           for op, nbytes, note in (("all_gather", gather, ", in fp8" if gather == 1 else ""),
                                    ("reduce_scatter", s.act_bytes, ""))]
    if s.token_local_params:  # parallel/tp_replicated.py
        out.append(Collective(axis="tp", op="all_reduce", group=p.tp,
                              size_bytes=s.token_local_params * s.grad_bytes, calls=1,
                              link=link, why="MoE gradients of each rank's sequence share, "
                              "summed once a step"))
    return out


def tp_gather_bytes(spec: RunSpec, act_bytes: int) -> int:
    """Bytes an element of the tp all-gathers under sequence parallel: 1 with precision=fp8
    (torchao's Float8 TP styles cast before they gather, forward and backward), else the
    activations' `act_bytes`."""
    return 1 if spec.precision.name.value == "fp8" else act_bytes


def _context_parallel(spec: RunSpec, s: _Shape, link: Link) -> list[Collective]:
    p, m = spec.parallel, spec.model
    if p.cp <= 1:
        return []
    kv = 2 * m.n_kv_heads * m.head_dim / p.tp  # K and V, this rank's heads
    size = s.tokens_per_micro_batch * p.cp * kv * s.act_bytes
    calls = s.layers * s.micro_batches
    return [Collective(axis="cp", op=op, group=p.cp, size_bytes=size / 2, calls=calls,
                       link=link, bare=name == "V", why=f"{name}{what}, per block" + (
                           ", right after K's" if name == "V" else ""))
            for op, what in (("all_gather", " to the full sequence"),
                             ("reduce_scatter", "'s gradient"))
            for name in ("K", "V")]


def _pipeline(spec: RunSpec, s: _Shape, link: Link) -> list[Collective]:
    p = spec.parallel
    if p.pp <= 1:
        return []
    chunks = p.pp_microbatches
    tokens = s.tokens_per_micro_batch / chunks / (p.tp if p.sequence_parallel else 1)
    sends = 2 * chunks * p.pp_virtual_stages * s.micro_batches  # activation + its gradient
    out = [Collective(axis="pp", op="p2p", group=2, size_bytes=tokens * spec.model.dim
                      * s.act_bytes, calls=sends, link=link,
                      why="activations forward, gradients back, per pipeline micro-batch")]
    if spec.model.tie_embeddings:  # parallel/tied_embeddings.py, fp32 gradients
        shard = p.tp * (p.fsdp_shards if p.uses_fsdp else 1)
        out.append(Collective(axis="pp", op="all_reduce", group=2, calls=1, link=link,
                              bare=True,
                              size_bytes=spec.model.vocab_size * spec.model.dim * 4 / shard,
                              why="tied embedding's gradient, first and last stage summed"))
    return out


def _bookkeeping(spec: RunSpec, link) -> list[Collective]:
    p = spec.parallel
    out = [Collective(axis="step", op="all_reduce", group=p.dp_cp, size_bytes=8, calls=1,
                      link=link(*DP_CP_AXES), bare=True,
                      why="target-token count")]
    split = (("dp_shard", p.fsdp_shards, FSDP_AXES, False) if p.uses_fsdp
             else None, ("tp", p.tp, ("tp",), False), ("pp", p.pp, ("pp",), True))
    out += [Collective(axis="step", op="all_reduce", group=n, size_bytes=4, calls=1,
                       link=link(*axes), bare=bare,
                       why=f"gradient norm's partial sums over {name}"
                           + ("" if bare else " (DTensor)"))
            for name, n, axes, bare in (x for x in split if x is not None)]
    return out


def _muon_gathers(spec: RunSpec, link) -> list[Collective]:
    """optim=muon: each sharded matrix's fp32 update all-gathered whole before its
    orthogonalisation (training/muon.py), over the FSDP shards and over tp."""
    p, matrices = spec.parallel, muon_matrices(spec)
    if not matrices:
        return []
    whole = 4 * sum(numel(shape) for _, shape in matrices) / len(matrices)
    split = [m for m in matrices if tp_split_dim(m[0], spec.model.family) is not None]
    return [Collective(axis="muon", op="all_gather", group=n, size_bytes=size, calls=calls,
                       link=link(*axes), why=why)
            for n, size, calls, axes, why in (
                (p.fsdp_shards if p.uses_fsdp else 1, whole / p.tp, len(matrices), FSDP_AXES,
                 "Muon: each matrix's update gathered over the FSDP shards"),
                (p.tp, whole, len(split), ("tp",), "Muon: each matrix's update gathered over tp"))]


def exposed_s(collectives: list[Collective], *, compute_s: float, layers: int,
              overlaps: bool) -> float:
    """Communication time not hidden by compute (the overlap rule, module docstring)."""
    total = sum(c.seconds for c in collectives)
    if not overlaps:
        return total
    hideable = sum(c.seconds for c in collectives if c.axis in OVERLAPPED_AXES)
    edge = hideable / max(layers, 1)  # the first block's gather, the last block's reduction
    return (total - hideable) + edge + max(0.0, hideable - edge - compute_s)
