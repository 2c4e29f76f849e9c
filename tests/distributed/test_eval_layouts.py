"""Eval task scores under the layouts (2 gloo ranks, one spawn): FSDP (each dp rank scores its
share of the 5 documents, uneven; weights gathered in the forward, the rank with fewer
batches runs padding ones) and tensor parallel with sequence parallel and loss_parallel's
vocabulary-sharded logits give the scores of one process on the same weights."""
from __future__ import annotations

import pytest
import torch

from conf.eval_tasks import MultipleChoiceDoc
from conf.run_dir.spec_io import spec_to_dict
from tests.support.eval_ranks import all_choice_scores, eval_layout_rank, layout_scorer
from tests.support.spawn import run_on_ranks
from tests.support.specs import synthetic_spec

pytestmark = pytest.mark.distributed

DOCS = [MultipleChoiceDoc("def f(x):\n    return", (" x", " x + 1", " None"), 1),
        MultipleChoiceDoc("import", (" os", " sys"), 0),
        MultipleChoiceDoc("for i in range(", ("10):", "len(xs)):"), 0),
        MultipleChoiceDoc("while", (" True:", " x < 3:", " not done:"), 2),
        MultipleChoiceDoc("class A", ("(B):", ":"), 1)]
LAYOUTS = {"fsdp": ["parallel=fsdp"],
           "tp": ["parallel=tp", "parallel.loss_parallel=true"]}


def test_every_layout_scores_what_one_process_scores(tmp_path):
    from training.evals.task_scores import score_task
    from training.model_builder import build_model
    from training.parallel_model import ParallelModel

    specs = [synthetic_spec(*overrides) for overrides in LAYOUTS.values()]
    results = run_on_ranks(eval_layout_rank, world_size=2, workdir=tmp_path, timeout_s=240,
                           kwargs={"spec_dicts": [spec_to_dict(s) for s in specs],
                                   "docs": DOCS})
    spec = specs[0]
    model = build_model(spec.model, device=torch.device("cpu"), seed=spec.training.seed)
    scorer = layout_scorer(spec, ParallelModel.single(model))
    reference = {"metrics": score_task(scorer, DOCS), "choices": all_choice_scores(scorer, DOCS)}
    assert reference["metrics"]["n"] == 5
    for index, name in enumerate(LAYOUTS):
        for rank in (0, 1):
            got = results[rank][index]
            assert got["metrics"] == reference["metrics"], (name, rank)
            assert got["choices"] == pytest.approx(reference["choices"], abs=2e-5), (name, rank)
