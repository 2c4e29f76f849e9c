"""Rules on raw token files (data=files): the globs and the token dtype. Prepared data, data
sources and the tokenizer are checked by conf/data_contract/prepared_corpus.py, the files' contents by
conf/data_contract/token_files.py, the document mask by conf/rules/document_rules.py."""
from __future__ import annotations

from typing import Callable

from conf.errors import ProblemList
from conf.schema import DataConfig, DataKind
from conf.spec import TOKEN_DTYPES


def data_files(d: DataConfig, problems: ProblemList, *, check_paths: bool,
               expand: Callable[[str], list[str]]) -> tuple[list[str], list[str]]:
    """Expand data.train_files/val_files (kind=files); other kinds are filled by the launcher."""
    if d.val_every_nth_file < 2:
        problems.add("data.val_every_nth_file", d.val_every_nth_file, "must be >= 2",
                     "e.g. 50 puts every 50th file in validation")
    if d.kind is not DataKind.files:
        return [], []
    if d.dtype not in TOKEN_DTYPES:
        problems.add("data.dtype", d.dtype, "unknown token dtype", f"use one of {', '.join(TOKEN_DTYPES)}")
    found: list[list[str]] = []
    for key, pattern in (("data.train_files", d.train_files), ("data.val_files", d.val_files)):
        files = expand(pattern) if pattern else []
        if not pattern:
            problems.add(key, "''", "is required with data=files", f"set {key}=/path/or/glob")
        elif check_paths and not files:
            problems.add(key, pattern, "matches no file", "check the path or glob")
        found.append(files)
    return found[0], found[1]
