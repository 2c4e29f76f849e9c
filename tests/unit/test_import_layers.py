"""The packages stack one way (ARCHITECTURE.md): each arrow between our packages is in this
table, and the torch-free modules never import torch. A new arrow fails here until the table
says it is allowed; the architecture page's import table is made from this one
(`python -m tests.unit.test_import_layers` rewrites it) and a test here fails when they differ."""
from __future__ import annotations

import ast
from pathlib import Path

from tests.support.architecture_page import REGENERATE, import_table, marked_block, with_block

REPO = Path(__file__).resolve().parents[2]
PACKAGES = ("conf", "parallel", "training", "launcher", "sweeps")

# The torch-free part of parallel/: the layout (ParallelDims), the TP split table, the index of
# parallelisms, the cost model.
TORCH_FREE_PARALLEL = ("parallel.dims", "parallel.tp_plan", "parallel.parallelisms",
                       "parallel.cost")
# The rank entry point the launcher hands to torchrun / submitit (it imports torch only when run).
RANK_ENTRY = ("training.slurm_entry",)
# The torch-free part of the model families (training/models/: the registry, the ModelFamily
# protocol, each family's facts): every package may import it (conf reads config.json through
# it, the cost model counts its parameter table, the passes ask it for names). It is every
# module under FAMILY_ROOT except a family's torch module (FAMILY_TORCH_MODULE) or the
# modules of a torch package of that name (training/models/moe/model/).
FAMILY_ROOT = "training.models"
FAMILY_TORCH_MODULE = "model"
# What the family facts may import of ours besides each other: conf's leaves only.
FAMILY_LEAVES = ("conf.choices", "conf.errors", "conf.spec")

# package -> the modules of ours it may import (a prefix: "conf" allows conf.anything), besides
# the family facts, which every package may import.
ALLOWED = {
    "conf": (),
    "parallel": ("conf",),
    "training": ("conf", "parallel"),
    "launcher": ("conf", *TORCH_FREE_PARALLEL, *RANK_ENTRY),
    "sweeps": ("conf", "launcher", *TORCH_FREE_PARALLEL),
}
# Modules that must not import torch at all (top level or inside a function); the family
# facts too (`is_family_fact`).
TORCH_FREE = ("conf", *TORCH_FREE_PARALLEL)


def is_family_fact(module: str) -> bool:
    """A torch-free module of the model families (see FAMILY_ROOT)."""
    inside = module.split(".")[len(FAMILY_ROOT.split(".")):]
    return under(module, (FAMILY_ROOT,)) and FAMILY_TORCH_MODULE not in inside


def imported_modules(path: Path) -> list[tuple[int, str]]:
    """Every absolute import in the file, anywhere in it, as (line, module)."""
    found = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            found += [(node.lineno, alias.name) for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            found.append((node.lineno, node.module))
            found += [(node.lineno, f"{node.module}.{alias.name}") for alias in node.names
                      if node.module in PACKAGES]  # `from parallel import cost`
    return found


def module_name(path: Path) -> str:
    return ".".join(path.relative_to(REPO).with_suffix("").parts)


def under(module: str, prefixes: tuple[str, ...]) -> bool:
    return any(module == p or module.startswith(p + ".") for p in prefixes)


def wrong_arrows() -> list[str]:
    wrong = []
    for package in PACKAGES:
        for path in sorted((REPO / package).rglob("*.py")):
            for line, module in imported_modules(path):
                top = module.split(".")[0]
                if top not in PACKAGES or top == package or module in PACKAGES:
                    continue
                if not under(module, ALLOWED[package]) and not is_family_fact(module):
                    wrong.append(f"{path.relative_to(REPO)}:{line} imports {module}")
    return wrong


def torch_imports() -> list[str]:
    found = []
    for package in PACKAGES:
        for path in sorted((REPO / package).rglob("*.py")):
            if not under(module_name(path), TORCH_FREE) and not is_family_fact(module_name(path)):
                continue
            found += [f"{path.relative_to(REPO)}:{line} imports {module}"
                      for line, module in imported_modules(path)
                      if module.split(".")[0] == "torch"]
    return found


def test_every_arrow_between_packages_is_in_the_table():
    assert sum(1 for p in PACKAGES for _ in (REPO / p).rglob("*.py")) > 50  # the walk found them
    assert wrong_arrows() == []


def test_the_torch_free_modules_never_import_torch():
    assert torch_imports() == []


def family_fact_imports() -> list[str]:
    """Imports of ours in the family facts that are neither conf leaves nor family facts."""
    found = []
    for path in sorted((REPO / "training" / "models").rglob("*.py")):
        if not is_family_fact(module_name(path)):
            continue
        found += [f"{path.relative_to(REPO)}:{line} imports {module}"
                  for line, module in imported_modules(path)
                  if module.split(".")[0] in PACKAGES and module not in PACKAGES
                  and not under(module, FAMILY_LEAVES) and not is_family_fact(module)]
    return found


def test_the_family_facts_import_only_conf_leaves_and_each_other():
    assert is_family_fact("training.models.llama") and is_family_fact("training.models")
    assert not is_family_fact("training.models.llama.model")
    assert not is_family_fact("training.models.moe.model.moe_layer")
    assert family_fact_imports() == []


def test_the_check_sees_a_wrong_arrow():
    """The walk really reports an arrow that is not in the table (a module added on the fly)."""
    bad = REPO / "conf" / "_wrong_arrow_probe.py"
    bad.write_text("def f():\n    from training.model_builder import Transformer\n")
    try:
        assert "conf/_wrong_arrow_probe.py:2 imports training.model_builder" in wrong_arrows()
    finally:
        bad.unlink()


PAGE = REPO / "ARCHITECTURE.md"


def page_table() -> str:
    """The import table ARCHITECTURE.md must show: this file's table, rendered."""
    return import_table(packages=PACKAGES, allowed=ALLOWED, torch_free=TORCH_FREE)


def test_the_architecture_page_shows_this_table():
    shown = marked_block(PAGE.read_text())
    assert shown == page_table(), (
        f"ARCHITECTURE.md's import table differs from ALLOWED / TORCH_FREE in "
        f"tests/unit/test_import_layers.py: run `{REGENERATE}` to rewrite it")


if __name__ == "__main__":  # rewrite the page's import table from the table above
    PAGE.write_text(with_block(PAGE.read_text(), page_table()))
    print(f"{PAGE.name}: import table rewritten from tests/unit/test_import_layers.py")
