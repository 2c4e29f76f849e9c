"""One rank's share of the model under the run's layout, built in a fixed order:

  model on meta -> PP split -> fp8 -> TP/SP -> CP -> recompute -> compile -> FSDP
  -> materialise (training/init.py; or a Hugging Face model's weights) -> DDP -> pipeline schedule
  (DDP under tp: a gradient average over the local shards, parallel/dp_tp_grads.py)

Nothing has memory until each part is split and sharded: a rank allocates only its shards,
filled with the single-process model's values (initialised by name). The pipeline split
comes first (as torchtitan does): each stage is a pruned copy of the model, with the full
model's parameter names, and every later pass applies to each stage.
"""
from __future__ import annotations

from dataclasses import dataclass, field

import torch
from torch import nn

from conf.schema import Precision
from conf.spec import RunSpec
from parallel.compile import apply_compile
from parallel.context_parallel import apply_context_parallel, shard_positions, shard_sequence
from parallel.data_parallel import apply_ddp, unwrap
from parallel.dims import ParallelDims
from parallel.dp_tp_grads import ShardGradAverage
from parallel.fsdp import ExpertUnits, apply_fsdp
from parallel.mesh import Meshes, build_mesh, fsdp_mesh
from parallel.recompute import apply_recompute
from parallel.tensor_parallel import apply_tp, keep_embedding_grad_sharded
from parallel.tied_embeddings import TiedCopy, find_tied_copy
from parallel.tp_replicated import sum_over_tp
from parallel.zero1 import Zero1Partition
from training.hf_import import hf_start_dir
from training.init import materialize
from training.loss import IGNORE_INDEX, token_cross_entropy_sum
from training.model_builder import build_model_on_meta
from training.models import family_of
from training.precision import apply_fp8, mixed_precision_policy


@dataclass(kw_only=True)
class ParallelModel:
    """What this rank holds and whom it talks to. Built once by `build_parallel_model`."""

    dims: ParallelDims
    rank: int
    mesh: Meshes | None
    """The device mesh over MESH_AXES and its flattened axes (dp, dp_shard_cp, dp_cp), by
    name (parallel/mesh.py); None in one process."""
    parts: list[nn.Module]
    """The model (one part), or this rank's pipeline stages."""
    schedule: object | None = None
    pp_loss: object | None = None
    cp_positions: torch.Tensor | None = None
    zero1: Zero1Partition | None = None
    grad_reducers: tuple = ()
    """DDP under tp: the parts' gradient averages over dp x cp (parallel/dp_tp_grads.py),
    in place of DistributedDataParallel, which cannot take DTensor parameters."""
    loss_parallel: bool = False
    """Logits stay sharded over the vocabulary (tp); cross entropy runs under loss_parallel."""
    loss_chunks: int = 1
    """The head and cross entropy run in this many row blocks (training.loss_chunks)."""
    document_eos_id: int | None = None
    """Document masking (data.document_mask): the token id that ends a document; None = off."""
    tied: TiedCopy | None = None
    """Tied embeddings under a pipeline: this rank's copy of the weight the first and last
    stage share (parallel/tied_embeddings.py); None elsewhere."""
    token_local: list[nn.Module] = field(default_factory=list)
    """Modules computed on each tp rank's share of the sequence with weights whole on every
    rank (sequence parallel; parallel/tp_replicated.py): gradients summed over tp."""

    @classmethod
    def single(cls, model: nn.Module) -> "ParallelModel":
        """One process holding the whole `model` (references, tools, tests)."""
        return cls(dims=ParallelDims.single(), rank=0, mesh=None, parts=[model])

    @property
    def coords(self) -> dict[str, int]:
        return self.dims.coordinates(self.rank)

    @property
    def is_first_stage(self) -> bool:
        return self.coords["pp"] == 0

    @property
    def is_last_stage(self) -> bool:
        return self.coords["pp"] == self.dims.pp - 1

    @property
    def reports_loss(self) -> bool:
        return self.dims.reports_loss(self.rank)

    def group(self, axis: str):
        """Process group of `axis` (a mesh axis or a flattened one); None if it is size 1."""
        return None if self.mesh is None else self.mesh.group(axis)

    def parameters(self) -> list[torch.Tensor]:
        return [p for part in self.parts for p in part.parameters()]

    def uncounted_in_norm(self) -> tuple[torch.Tensor, ...]:
        """Parameters whose gradient another rank counts in the global norm (a tied
        weight's last-stage copy)."""
        return (self.tied.param,) if self.tied is not None and not self.tied.counted else ()

    def sum_token_local_grads(self) -> None:
        """After the step's backward: the token-local modules' gradients summed over tp."""
        if self.token_local:
            sum_over_tp(self.token_local, group=self.group("tp"))

    def shard_tokens(self, tensor: torch.Tensor) -> torch.Tensor:
        """This rank's part of a [B, T] batch along the sequence (context parallel)."""
        if self.cp_positions is None:
            return tensor
        return shard_sequence(tensor, positions=self.cp_positions.to(tensor.device), dim=1)


def build_parallel_model(spec: RunSpec, *, rank: int, device: torch.device) -> ParallelModel:
    dims = ParallelDims.from_spec(spec.parallel)
    if spec.data.document_mask and spec.data.eos_id is None:
        raise ValueError("data.document_mask=true, but the spec names no EOS token id "
                         "(resolve() could not read one): resolve the run again where the "
                         "data is readable")
    mesh = build_mesh(dims, device=device) if dims.world_size > 1 else None
    layout = ParallelModel(dims=dims, rank=rank, mesh=mesh, parts=[],
                        loss_parallel=dims.tp > 1 and spec.parallel.loss_parallel,
                        loss_chunks=spec.training.loss_chunks,
                        document_eos_id=spec.data.eos_id if spec.data.document_mask else None)
    model = build_model_on_meta(spec.model)
    layout.parts = _split(model, spec, layout)
    del model
    for part in list(layout.parts):
        _parallelize_part(part, spec, layout, device)
    if dims.zero == 1 and dims.uses_ddp:
        layout.zero1 = Zero1Partition(layout.parameters(), group=layout.group("dp_shard"),
                                      group_rank=layout.coords["dp_shard"],
                                      group_size=dims.dp_shard)
    if dims.pp > 1:
        _build_pipeline(layout, spec, device)
        if spec.model.tie_embeddings:
            layout.tied = find_tied_copy(
                [unwrap(part) for part in layout.parts], embedding=family_of(spec.model).embedding,
                dims=dims, rank=rank, pp_group=layout.group("pp"), first=layout.is_first_stage)
    return layout


def _split(model: nn.Module, spec: RunSpec, layout: ParallelModel) -> list[nn.Module]:
    if layout.dims.pp == 1:
        return [model]
    from parallel.pipeline import split_model

    return split_model(model, parallel=spec.parallel, pp_rank=layout.coords["pp"])


def _parallelize_part(part: nn.Module, spec: RunSpec, layout: ParallelModel,
                      device: torch.device) -> None:
    dims, p = layout.dims, spec.parallel
    apply_fp8(part, spec.precision)
    if dims.tp > 1:
        layout.token_local += apply_tp(part, tp_mesh=layout.mesh["tp"],
                                       sequence_parallel=p.sequence_parallel,
                                       loss_parallel=p.loss_parallel,
                                       fp8=spec.precision.name is Precision.fp8)
    if dims.cp > 1:
        positions = shard_positions(seq_len=spec.training.seq_len, cp=dims.cp,
                                    cp_rank=layout.coords["cp"], balanced=p.cp_balanced)
        layout.cp_positions = torch.tensor(positions, dtype=torch.long, device=device)
        apply_context_parallel(part, group=layout.group("cp"), positions=layout.cp_positions)
    experts = _apply_ep(part, spec, layout)
    apply_recompute(part, recompute=spec.recompute)
    if spec.training.compile:
        apply_compile(part, backend=spec.training.compile_backend)
    if layout.dims.uses_fsdp:
        apply_fsdp(part, mesh=fsdp_mesh(layout.mesh, layout.dims), zero=layout.dims.zero,
                   mp_policy=mixed_precision_policy(spec.precision), experts=experts)
    materialize(part, model=spec.model, device=device, seed=spec.training.seed,
                hf_dir=hf_start_dir(spec))
    if layout.dims.tp > 1:
        keep_embedding_grad_sharded(part)
    _apply_ddp(part, layout, device)


def _apply_ep(part: nn.Module, spec: RunSpec, layout: ParallelModel) -> ExpertUnits | None:
    """Expert parallelism (parallel.ep > 1): the experts sharded over ep, and their FSDP units."""
    if layout.dims.ep == 1:
        return None
    from parallel.expert_parallel import apply_ep

    path = family_of(spec.model).experts
    apply_ep(part, ep_mesh=layout.mesh["ep"], path=path)
    return ExpertUnits(mesh=layout.mesh["efsdp"], path=path, divide_by=layout.dims.dp_cp)


def _apply_ddp(part: nn.Module, layout: ParallelModel, device: torch.device) -> None:
    dims = layout.dims
    if dims.uses_ddp and dims.tp > 1:
        reducer = ShardGradAverage(list(part.parameters()), group=layout.group("dp_cp"),
                                   group_size=dims.dp_cp)
        layout.grad_reducers = (*layout.grad_reducers, reducer)
    elif dims.uses_ddp:
        wrapped = apply_ddp(part, device=device, group=layout.group("dp_cp"))
        layout.parts[layout.parts.index(part)] = wrapped


def _build_pipeline(layout: ParallelModel, spec: RunSpec, device: torch.device) -> None:
    from parallel.pipeline import PipelineLoss, build_schedule

    layout.pp_loss = PipelineLoss(token_cross_entropy_sum, vocab_sharded=layout.loss_parallel,
                                  ignore_index=IGNORE_INDEX)
    layout.schedule = build_schedule(layout.parts, parallel=spec.parallel,
                                     pp_rank=layout.coords["pp"], pp_group=layout.group("pp"),
                                     device=device, loss=layout.pp_loss)
