"""Rules on the eval section: the multiple-choice task files (conf/eval_tasks.py) and when
they are scored."""
from __future__ import annotations

import os

from conf.data_contract.stdlib_tokens import STDLIB_VOCAB_SIZE as BYTE_VOCAB
from conf.data_contract.tokenizer_info import tokenizer_file
from conf.errors import ProblemList
from conf.eval_tasks import read_task_file, task_name
from conf.schema import DataConfig, DataKind, EvalConfig
from conf.spec import EvalSpec, EvalTaskSpec, ParallelSpec, spec_from_config


def resolve_eval(e: EvalConfig, *, parallel: ParallelSpec, data: DataConfig, vocab_size: int,
                 problems: ProblemList, check_paths: bool) -> EvalSpec:
    """The frozen eval section: names filled in, paths absolute, every task file read and
    checked (`check_paths`), every problem added to `problems`."""
    for knob, least in (("every_steps", 0), ("limit", 0), ("batch_size", 1)):
        if getattr(e, knob) < least:
            problems.add(f"eval.{knob}", getattr(e, knob), f"must be >= {least}",
                         f"give a value >= {least}")
    tasks = tuple(_task(i, t, e, problems, check_paths=check_paths)
                  for i, t in enumerate(e.tasks))
    _check_unique_names(tasks, problems)
    if tasks:
        _check_layout(parallel, problems)
        _check_text_encoding(data, vocab_size, problems, check_paths=check_paths)
    return spec_from_config(EvalSpec, e, tasks=tasks)


def _task(index: int, t, e: EvalConfig, problems: ProblemList, *,
          check_paths: bool) -> EvalTaskSpec:
    key = f"eval.tasks[{index}]"
    if not t.path:
        problems.add(f"{key}.path", "", "is required", "give the path of a JSONL task file")
    if t.limit < 0:
        problems.add(f"{key}.limit", t.limit, "must be >= 0", "give 0 (eval.limit) or more")
    elif t.path and check_paths:
        read_task_file(t.path, key=f"{key}.path", problems=problems, limit=t.limit or e.limit)
    path = os.path.abspath(os.path.expanduser(t.path)) if t.path else ""
    return EvalTaskSpec(path=path, name=task_name(t.name, t.path), limit=t.limit)


def _check_unique_names(tasks: tuple[EvalTaskSpec, ...], problems: ProblemList) -> None:
    seen: set[str] = set()
    for i, task in enumerate(tasks):
        if task.name in seen:
            problems.add(f"eval.tasks[{i}].name", task.name, "names two tasks",
                         "give each task its own name")
        seen.add(task.name)


def _check_layout(parallel: ParallelSpec, problems: ProblemList) -> None:
    """The scorer runs the whole model on whole sequences: no pipeline, no context split."""
    for degree in ("pp", "cp"):
        if getattr(parallel, degree) > 1:
            problems.add("eval.tasks", "...", f"are not scored with parallel.{degree}>1 yet",
                         f"score the finished run with `meshrun eval RUN_DIR tasks=...` "
                         f"(one process), or drop eval.tasks")


def _check_text_encoding(data: DataConfig, vocab_size: int, problems: ProblemList, *,
                         check_paths: bool) -> None:
    """The scorer encodes the task text as the data was: with data.tokenizer (the
    `tokenizers` library: a tokenizer.json), else as UTF-8 bytes (data=stdlib)."""
    if not data.tokenizer:
        if data.kind is DataKind.files:
            problems.add("eval.tasks", "...", "need data.tokenizer with data=files (the "
                         "tokenizer the data was made with)", "give data.tokenizer=PATH")
        elif vocab_size < BYTE_VOCAB:
            problems.add("eval.tasks", "...", f"are byte-level text: model.vocab_size="
                         f"{vocab_size} is below {BYTE_VOCAB}", f"give model.vocab_size >= {BYTE_VOCAB}")
        return
    if not check_paths:
        return
    try:
        found = tokenizer_file(data.tokenizer)
    except (OSError, ValueError):
        return  # the data rules name a tokenizer that cannot be read
    if found.suffix != ".json":
        problems.add("eval.tasks", "...", f"are not scored with a tiktoken tokenizer "
                     f"({found.name}) yet", "drop eval.tasks, or use a tokenizer.json")
