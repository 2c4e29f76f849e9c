"""The run's eval tasks (`eval.tasks`) scored during training: every eval.every_steps steps
and after the last one, by every rank together, one `task_eval` row per time on rank 0."""
from __future__ import annotations

import dataclasses
import logging
import time

import torch

from conf.errors import ProblemList
from conf.eval_tasks import ROW_KIND, MultipleChoiceDoc, read_task_file
from conf.spec import EvalSpec, RunSpec
from training.evals.task_scores import Scorer, score_tasks
from training.evals.text_encoder import build_encoder
from training.parallel_model import ParallelModel

log = logging.getLogger("meshrun.evals")


def read_tasks(evals: EvalSpec) -> dict[str, list[MultipleChoiceDoc]]:
    """Every task's documents (each cut to its limit); a file changed since resolve() into
    something unreadable raises ConfigError naming it."""
    problems = ProblemList()
    tasks = {t.name: read_task_file(t.path, key=f"eval.tasks[{i}].path", problems=problems,
                                    limit=t.limit or evals.limit)
             for i, t in enumerate(evals.tasks)}
    problems.raise_if_any("Cannot read the eval tasks")
    return tasks


class TaskEvals:
    """The tasks read once at build time, and the scorer over this rank's model."""

    def __init__(self, spec: RunSpec, *, model: ParallelModel, device: torch.device,
                 autocast) -> None:
        self.every_steps = spec.eval.every_steps
        self.tasks = read_tasks(spec.eval)
        self.scorer = Scorer(model=model, encode=build_encoder(spec.data.tokenizer),
                             device=device, autocast=autocast, max_len=spec.model.max_seq_len,
                             batch_size=spec.eval.batch_size)

    @classmethod
    def build(cls, spec: RunSpec, **kwargs) -> "TaskEvals | None":
        return cls(spec, **kwargs) if spec.eval.tasks else None

    def due(self, step: int) -> bool:
        """Between the ends: every every_steps steps (the last step scores in `finish`)."""
        return bool(self.every_steps) and step % self.every_steps == 0


def log_task_evals(tr) -> None:
    """Score the tasks now (every rank: a collective) and log the row on rank 0. `tr`: the
    loop's TrainState."""
    if tr.task_evals is None:
        return
    tr.heartbeat.phase("eval")
    started = time.perf_counter()
    scorer = dataclasses.replace(tr.task_evals.scorer,
                                 progress=lambda: tr.heartbeat.enter("eval tasks forward"))
    row = score_tasks(scorer, tr.task_evals.tasks)
    tr.heartbeat.phase("step")
    if tr.loggers is not None:
        tr.loggers.log({"kind": ROW_KIND, "step": tr.step, **row})
    log.info("step %d: eval tasks in %.2f s: %s", tr.step, time.perf_counter() - started,
             ", ".join(f"{k} {v:.4f}" for k, v in row.items() if not k.endswith("/n")))
