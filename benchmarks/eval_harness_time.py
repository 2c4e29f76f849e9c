"""What scoring a task through lm-eval costs beside meshrun's own scorer, in one process.

Times, on the tiny model and a generated multiple-choice task (N documents):
  import lm-eval            lm_eval.evaluator, lm_eval.tasks, lm_eval.api.model
  TaskManager (defaults)    lm-eval's index of its built-in tasks (what `meshrun eval` skips)
  TaskManager (none)        include_defaults=False, what `meshrun eval` makes
  lm-eval scoring           training/evals/lm_eval_model.lm_eval_scores (dataset build + evaluate)
  meshrun scoring           training/evals/task_scores.score_task on the same documents
and checks that both give the same acc and acc_norm.

    PYTHONPATH=$PWD .venv/bin/python benchmarks/eval_harness_time.py [--docs 200]
"""
from __future__ import annotations

import argparse
import contextlib
import json
import random
import tempfile
import time
from pathlib import Path


def make_task(path: Path, docs: int) -> None:
    rng = random.Random(0)
    words = ["def", "class", "return", "import", "self", "for", "while", "if", "else", "None"]
    with path.open("w") as out:
        for _ in range(docs):
            choices = [" ".join(rng.choices(words, k=rng.randint(1, 4))) for _ in range(4)]
            out.write(json.dumps({"context": " ".join(rng.choices(words, k=12)),
                                  "choices": choices, "gold": rng.randrange(4)}) + "\n")


def timed(label: str, fn, seconds: dict):
    started = time.perf_counter()
    value = fn()
    seconds[label] = time.perf_counter() - started
    return value


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--docs", type=int, default=200)
    args = parser.parse_args()
    import torch

    from conf.errors import ProblemList
    from conf.eval_tasks import lm_eval_task, read_task_file
    from tests.support.specs import tiny_model_spec
    from training.evals.lm_eval_model import lm_eval_class, lm_eval_scores
    from training.evals.task_scores import Scorer, score_task
    from training.evals.text_encoder import byte_encoder
    from training.model_builder import build_model
    from training.parallel_model import ParallelModel

    seconds: dict[str, float] = {}
    spec = tiny_model_spec()
    model = build_model(spec, device=torch.device("cpu"), seed=0)
    scorer = Scorer(model=ParallelModel.single(model), encode=byte_encoder,
                    device=torch.device("cpu"), autocast=contextlib.nullcontext(),
                    max_len=spec.max_seq_len, batch_size=16)
    with tempfile.TemporaryDirectory() as tmp:
        task = Path(tmp) / "mc.jsonl"
        make_task(task, args.docs)
        timed("import lm-eval", lambda: (lm_eval_class(), __import__("lm_eval.evaluator")),
              seconds)
        from lm_eval.tasks import TaskManager

        timed("TaskManager (defaults)", TaskManager, seconds)
        timed("TaskManager (none)", lambda: TaskManager(include_defaults=False), seconds)
        theirs = timed("lm-eval scoring", lambda: lm_eval_scores(
            scorer, [lm_eval_task("mc", task)]), seconds)["mc"]
        docs = read_task_file(task, key="task", problems=ProblemList())
        ours = timed("meshrun scoring", lambda: score_task(scorer, docs), seconds)
    for label, value in seconds.items():
        print(f"{label:<24} {value:7.2f} s")
    same = all(theirs[k] == ours[k] for k in ("acc", "acc_norm", "n"))
    print(f"{args.docs} documents: lm-eval {theirs}, meshrun {ours}: "
          f"{'the same' if same else 'DIFFERENT'}")


if __name__ == "__main__":
    main()
