"""Checkpoints across layouts: a checkpoint saved under one layout loads under another (DCP
reshards weights and AdamW moments, or Muon's momentum buffers, by parameter name), and
training then continues exactly as the saving layout would have; without asking for
resharding, loading stops with a clear error.
Resuming under the same layout exactly is checked end to end in test_e2e_runs.py and below."""
from __future__ import annotations

import pytest
import torch

from conf.spec import RunSpec
from conf.run_dir.spec_io import spec_from_dict, spec_to_dict
from tests.support.layout_parity import ATOL, CPU, RTOL, full, named_params
from tests.support.spawn import run_on_ranks
from tests.support.specs import cpu_spec

pytestmark = pytest.mark.distributed

BASE = ("model=tiny", "model.n_layers=4", "data=synthetic", "training.seq_len=32",
        "optim.lr=1e-4", "training.global_batch_size=8", "training.micro_batch_size=2",
        "training.grad_accum_steps=-1")
PAIRS_2 = [("zero3", "tp"), ("tp", "zero1"), ("ddp", "zero2"), ("cp", "zero3"), ("pp", "zero3"),
           ("zero3", "pp"), ("zero3_muon", "tp_muon")]
PAIRS_4 = [("fsdp_tp", "hsdp"), ("hsdp", "3d_small")]
PAIRS_DP_TP = [("zero1_tp", "fsdp_tp"), ("fsdp_tp", "ddp_tp")]
"""DDP and ZeRO-1 under tp (parallel/dp_tp_grads.py): ZeRO-1's owned moments of tp shards
saved, and a DDP x tp run loading FSDP x tp's."""
EXTRA = {"3d_small": ["parallel.pp=2", "parallel.tp=2", "parallel.dp_replicate=1", "parallel.zero=0"],
         # optim=muon: Muon's momentum buffers go from FSDP shards to tp shards
         "zero3_muon": ["parallel=zero3", "optim=muon"], "tp_muon": ["parallel=tp", "optim=muon"],
         "zero1_tp": ["parallel=zero1", "parallel.tp=2"],
         "ddp_tp": ["parallel=ddp", "parallel.tp=2"]}
MOMENT_KEYS = ("exp_avg_sq", "momentum_buffer")
"""The state compared per parameter: AdamW's second moment, or Muon's momentum buffer."""


def _spec(name: str, world: int) -> RunSpec:
    preset = EXTRA.get(name, [f"parallel={name}"])
    return cpu_spec(*BASE, f"cluster.procs_per_node={world}", *preset)


class Run:
    """One layout's live training state on this rank."""

    def __init__(self, spec: RunSpec, rank: int):
        from training.data.build import build_train_batches
        from training.parallel_model import build_parallel_model
        from training.optim import build_optimizers

        self.spec = spec
        self.model = build_parallel_model(spec, rank=rank, device=CPU)
        self.optimizers = build_optimizers(self.model, optim=spec.optim, state_dtype="fp32")
        self.batches = build_train_batches(spec.data, spec.training,
                                           dp_rank=self.model.dims.dp_rank(rank),
                                           dp_size=self.model.dims.dp)

    def step(self) -> None:
        from training.step import clip_and_step, forward_backward

        forward_backward(self.model, self.batches.next_step(), device=CPU,
                         autocast=torch.autocast("cpu", enabled=False))
        clip_and_step(self.model, self.optimizers, grad_clip=self.spec.optim.grad_clip)

    def params(self) -> dict[str, torch.Tensor]:
        return {n: full(p) for n, p in named_params(self.model).items()}

    def moments(self) -> dict[str, torch.Tensor]:
        by_param = {p: n for n, p in named_params(self.model).items()}
        return {by_param[p]: full(next(state[k] for k in MOMENT_KEYS if k in state))
                for o in self.optimizers for p, state in o.state.items()}


def merged(named: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """Every rank's full tensors by name (pipeline stages hold different names)."""
    import torch.distributed as dist

    pieces = [None] * dist.get_world_size()
    dist.all_gather_object(pieces, named)
    return {name: tensor for piece in pieces for name, tensor in piece.items()}


def reshard_rank(*, rank: int, world_size: int, root: str, pairs: list) -> list[dict]:
    from training.checkpoint import CheckpointMismatch, load_checkpoint, save_checkpoint
    from training.train_state import checkpoint_degrees

    report = []
    for index, (dict_a, dict_b) in enumerate(pairs):
        a, b = spec_from_dict(RunSpec, dict_a), spec_from_dict(RunSpec, dict_b)
        run_a = Run(a, rank)
        run_a.step()
        path = save_checkpoint(f"{root}/pair_{index}", step=1, model=run_a.model.parts,
                               optimizer=run_a.optimizers,
                               metadata={"layout": checkpoint_degrees(a)})
        moments_a = merged(run_a.moments())
        run_a.step()  # what the saving layout does next
        run_b = Run(b, rank)
        with pytest.raises(CheckpointMismatch, match="checkpoint.load_from="):
            load_checkpoint(path, model=run_b.model.parts, optimizer=run_b.optimizers,
                            degrees=checkpoint_degrees(b))
        load_checkpoint(path, model=run_b.model.parts, optimizer=run_b.optimizers,
                        degrees=checkpoint_degrees(b), allow_reshard=True)
        for name, moment in run_b.moments().items():
            torch.testing.assert_close(moment, moments_a[name], atol=0, rtol=0, msg=name)
        run_b.batches.next_step()  # the data position the checkpoint recorded: after step 1
        run_b.step()
        params_a, params_b = merged(run_a.params()), run_b.params()
        for name, param in params_b.items():
            torch.testing.assert_close(param, params_a[name], atol=ATOL, rtol=RTOL,
                                       msg=lambda m, n=name: f"{a.parallel.name}->{b.parallel.name} {n}: {m}")
        report.append({"pair": (a.parallel.name, b.parallel.name), "names": sorted(params_b)})
    return report


def _run(tmp_path, pairs: list[tuple[str, str]], world: int) -> None:
    specs = [(_spec(a, world), _spec(b, world)) for a, b in pairs]
    (tmp_path / "ckpt").mkdir()  # saves never create parents (a removed run dir stays removed)
    results = run_on_ranks(reshard_rank, world_size=world, workdir=tmp_path, timeout_s=400,
                           kwargs={"root": str(tmp_path / "ckpt"),
                                   "pairs": [(spec_to_dict(a), spec_to_dict(b)) for a, b in specs]})
    from parallel.cost.params import parameter_shapes

    every_name = {name for name, _ in parameter_shapes(specs[0][0].model)}
    for index, (a, b) in enumerate(specs):
        names = set().union(*(rows[index]["names"] for rows in results))
        assert names == every_name, (a.parallel.name, b.parallel.name)


def test_two_rank_checkpoints_load_under_other_layouts(tmp_path):
    _run(tmp_path, PAIRS_2, 2)


def test_four_rank_checkpoints_load_under_other_layouts(tmp_path):
    _run(tmp_path, PAIRS_4, 4)


def test_checkpoints_of_ddp_and_zero1_under_tp_load_under_fsdp_tp_and_back(tmp_path):
    _run(tmp_path, PAIRS_DP_TP, 4)
