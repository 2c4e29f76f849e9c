"""Multiple-choice eval tasks on local JSONL files: the one definition of their format.

One JSON object per line, the HellaSwag / ARC / PIQA shape:

    {"context": "The cat sat on the", "choices": ["mat", "moon"], "gold": 0}

A choice is scored by the sum of the log-probabilities of its tokens after the context
(continuation = TARGET_DELIMITER + choice, as lm-eval's `target_delimiter`). `acc`: the best
sum is the gold one; `acc_norm`: the best sum divided by the choice's length in characters
(lm-eval's acc_norm). The same file runs under lm-eval (`lm_eval_task`) and in meshrun's own
scorer (training/evals/), which give the same numbers. Torch-free: resolve() and the
`meshrun eval` command check the files before anything starts.
"""
from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from conf.errors import ProblemList

FIELDS = ("context", "choices", "gold")
"""The keys every line holds; other keys are kept out of scoring (ids, sources, ...)."""
TARGET_DELIMITER = " "
"""Put between the context and each choice (lm-eval's default target_delimiter)."""
METRICS = ("acc", "acc_norm")
"""What each task reports, as `eval/<task>/<metric>` (plus `n`, the documents scored)."""
ROW_KIND = "task_eval"
"""The metrics.jsonl row kind of task scores (kept apart from "eval" rows, which hold
val_loss): {"kind": "task_eval", "step": N, "eval/<task>/acc": ..., ...}."""
FIX_LINE = ('write one JSON object per line: {"context": "...", "choices": ["...", "..."], '
            '"gold": <index of the right choice>}')


@dataclass(frozen=True, slots=True)
class MultipleChoiceDoc:
    context: str
    choices: tuple[str, ...]
    gold: int

    def continuations(self) -> list[str]:
        """The strings scored after the context, one per choice."""
        return [TARGET_DELIMITER + choice for choice in self.choices]


def metric_key(task: str, metric: str) -> str:
    """A task metric's name in metrics.jsonl, W&B and `meshrun compare`."""
    return f"eval/{task}/{metric}"


def task_name(name: str, path: str) -> str:
    """A task's name: the one given, else its file's stem."""
    return name or Path(path).stem


def read_task_file(path: str | Path, *, key: str, problems: ProblemList,
                   limit: int = 0) -> list[MultipleChoiceDoc]:
    """The documents of `path` (the first `limit`, 0 = all); every bad line adds a problem
    under `key` naming the file and its line number."""
    file = Path(path).expanduser()
    if not file.is_file():
        problems.add(key, path, "no such file", "give the path of a JSONL task file")
        return []
    docs = []
    with file.open(encoding="utf-8") as handle:
        for number, line in enumerate(handle, start=1):
            if not line.strip():
                continue
            doc = _parse_line(line, where=f"{file}:{number}", key=key, problems=problems)
            if doc is not None:
                docs.append(doc)
            if limit and len(docs) >= limit:
                break
    if not docs and not problems:
        problems.add(key, path, "holds no documents", FIX_LINE)
    return docs


def _parse_line(line: str, *, where: str, key: str,
                problems: ProblemList) -> MultipleChoiceDoc | None:
    try:
        record = json.loads(line)
    except ValueError as err:
        problems.add(key, where, f"is not valid JSON ({err.msg})", FIX_LINE)
        return None
    rule = _line_rule(record)
    if rule:
        problems.add(key, where, rule, FIX_LINE)
        return None
    return MultipleChoiceDoc(record["context"], tuple(record["choices"]), record["gold"])


def _line_rule(record: object) -> str:
    """What is wrong with one parsed line; "" when nothing is."""
    if not isinstance(record, dict):
        return "is not a JSON object"
    missing = [f for f in FIELDS if f not in record]
    if missing:
        return f"lacks {', '.join(missing)}"
    context, choices, gold = (record[f] for f in FIELDS)
    if not isinstance(context, str) or not context:
        return "context must be a non-empty string"
    if (not isinstance(choices, list) or len(choices) < 2
            or not all(isinstance(c, str) and c for c in choices)):
        return "choices must be a list of 2 or more non-empty strings"
    if isinstance(gold, bool) or not isinstance(gold, int) or not 0 <= gold < len(choices):
        return f"gold={gold!r} is not an index into its {len(choices)} choices (0..{len(choices) - 1})"
    return ""


def lm_eval_task(name: str, path: str | Path) -> dict:
    """lm-eval's task config for a task file (what a task YAML holds): the local JSONL read
    by the `json` dataset builder, scored as multiple choice exactly as meshrun scores it."""
    return {
        "task": name,
        "dataset_path": "json",
        "dataset_kwargs": {"data_files": {"test": str(Path(path).expanduser().resolve())}},
        "test_split": "test",
        "output_type": "multiple_choice",
        "doc_to_text": "{{context}}",
        "doc_to_choice": "{{choices}}",
        "doc_to_target": "{{gold}}",
        "target_delimiter": TARGET_DELIMITER,
        "num_fewshot": 0,
        "metric_list": [{"metric": m, "aggregation": "mean", "higher_is_better": True}
                        for m in METRICS],
    }
