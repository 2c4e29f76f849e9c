"""Document masking under tp (with sequence parallel), cp and pp on two gloo ranks: a packed
batch of several documents gives the same per-document losses and the same gradients as its
documents run one by one in one process (fp32, rel 1e-5). One spawn runs all three layouts.
The single-process case and the helpers: tests/unit/test_document_mask.py."""
from __future__ import annotations

import dataclasses

import pytest
import torch
import torch.distributed as dist

from conf.spec import RunSpec
from conf.run_dir.spec_io import spec_from_dict, spec_to_dict
from tests.support.layout_parity import full, named_params
from tests.support.packed_documents import (
    ATOL, EOS, LENGTHS, NO_AUTOCAST, RTOL, document_batches, document_targets_count,
    packed_batch, packed_documents,
)
from tests.support.spawn import run_on_ranks
from tests.support.specs import cpu_spec
from training.loss import IGNORE_INDEX

pytestmark = pytest.mark.distributed

CPU = torch.device("cpu")
BASE = ("model=tiny", "data=synthetic", "training.seq_len=32", "training.micro_batch_size=2",
        "training.grad_accum_steps=1", "cluster.procs_per_node=2")
LAYOUTS = {
    "tp_sp": ["parallel=tp"],
    "cp_balanced": ["parallel=cp"],
    "pp_1f1b": ["parallel=pp"],
}


def _spec(name: str, extra: list[str]) -> RunSpec:
    spec = cpu_spec(*BASE, f"parallel.name={name}", *extra)
    # Synthetic tokens have no EOS, so resolve() refuses the knob there (its own test); the
    # batches below are made by hand with EOS = 3.
    return dataclasses.replace(spec, data=dataclasses.replace(spec.data, document_mask=True,
                                                              eos_id=EOS))


def _document_targets(targets: torch.Tensor, rows) -> list[torch.Tensor]:
    """One copy of `targets` per document, every target outside that document ignored."""
    out = []
    for row, docs in enumerate(rows):
        start = 0
        for doc in docs:
            only = torch.full_like(targets, IGNORE_INDEX)
            only[row, start:start + len(doc)] = targets[row, start:start + len(doc)]
            out.append(only)
            start += len(doc)
    return out


def _all_ranks_sum(value: float, *, counts: bool) -> float:
    total = torch.tensor([value if counts else 0.0], dtype=torch.float64)
    dist.all_reduce(total)
    return float(total)


def _record_rope_positions(layout) -> list[torch.Tensor]:
    """Record the positions each part's forward asks RoPE tables for (RoPE is relative, so
    losses cannot tell restarted positions from running ones: this can)."""
    from parallel.data_parallel import unwrap

    seen = []
    for part in layout.parts:
        model = unwrap(part)
        tables = model.rope_tables

        def record(positions=None, tables=tables):
            seen.append(None if positions is None else positions.clone())
            return tables(positions)

        model.rope_tables = record
    return seen


def document_mask_rank(*, rank: int, world_size: int, spec_dicts: list[dict]) -> list[dict]:
    from training.parallel_model import build_parallel_model
    from training.step import eval_loss_sum, forward_backward

    rows = packed_documents(LENGTHS)
    inputs, targets = packed_batch(rows)
    results = []
    for spec_dict in spec_dicts:
        spec = spec_from_dict(RunSpec, spec_dict)
        layout = build_parallel_model(spec, rank=rank, device=CPU)
        positions = _record_rope_positions(layout)
        loss = forward_backward(layout, [(inputs, targets)], device=CPU, autocast=NO_AUTOCAST)
        grads = {n: full(p.grad) for n, p in named_params(layout).items()}
        doc_losses = [_all_ranks_sum(eval_loss_sum(layout, inputs, only, device=CPU,
                                                   autocast=NO_AUTOCAST)[0],
                                     counts=layout.reports_loss)
                      for only in _document_targets(targets, rows)]
        total = _all_ranks_sum(float(loss.local_loss_sum), counts=layout.reports_loss)
        results.append({"layout": spec.parallel.name, "loss_sum": total, "grads": grads,
                        "tokens": loss.global_tokens, "doc_losses": doc_losses,
                        "rope_positions": positions,
                        "cp_positions": layout.cp_positions})
    return results


def _one_by_one(spec: RunSpec) -> tuple[list[float], dict[str, torch.Tensor], int]:
    """Per-document loss sums and the gradient of their sum / all targets, in one process."""
    from training.model_builder import build_model
    from training.step import token_loss_sum

    model = build_model(spec.model, device=CPU, seed=spec.training.seed)
    n_targets = document_targets_count(packed_documents(LENGTHS))
    losses = []
    for x, y in document_batches(packed_documents(LENGTHS)):
        loss = token_loss_sum(model, x, y, NO_AUTOCAST)
        (loss / n_targets).backward()
        losses.append(float(loss.detach()))
    return losses, {n: p.grad for n, p in model.named_parameters()}, n_targets


def _check_rope_positions(row: dict, where: str) -> None:
    """Every forward of every part used positions inside documents: the whole batch (tp), this
    rank's sequence share (cp), or one row per pipeline micro-batch (pp)."""
    expected = torch.stack([torch.cat([torch.arange(n) for n in lengths]) for lengths in LENGTHS])
    if row["cp_positions"] is not None:
        expected = expected[:, row["cp_positions"]]
    allowed = [expected] + [expected[i:i + 1] for i in range(len(LENGTHS))]
    assert row["rope_positions"], where
    for used in row["rope_positions"]:
        assert used is not None and any(used.shape == a.shape and torch.equal(used, a)
                                        for a in allowed), (where, used)


def test_packed_documents_equal_one_by_one_under_tp_cp_pp(tmp_path):
    specs = [_spec(name, extra) for name, extra in LAYOUTS.items()]
    results = run_on_ranks(document_mask_rank, world_size=2, workdir=tmp_path,
                           kwargs={"spec_dicts": [spec_to_dict(s) for s in specs]})
    ref_losses, ref_grads, n_targets = _one_by_one(specs[0])
    assert sum(1 for _ in ref_grads) > 0
    for index, spec in enumerate(specs):
        where = spec.parallel.name
        rows = [rank_results[index] for rank_results in results]
        for row in rows:
            assert row["layout"] == where and row["tokens"] == n_targets
            assert row["loss_sum"] == pytest.approx(sum(ref_losses), rel=RTOL), where
            assert row["doc_losses"] == pytest.approx(ref_losses, rel=RTOL), where
            _check_rope_positions(row, where)
        grads = {}
        for row in rows:
            grads.update(row["grads"])
        assert set(grads) == set(ref_grads), where
        for name, grad in grads.items():
            torch.testing.assert_close(grad, ref_grads[name], rtol=RTOL, atol=ATOL,
                                       msg=lambda m, n=name: f"{where} grad {n}: {m}")
