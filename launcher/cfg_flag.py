"""`meshrun run|plan|sweep --cfg job|hydra|all [--package PKG] [--resolve]`, as Hydra users
know them (`sweep`: one YAML document per point, `---` between them, each headed by a comment
naming the point).

- job: the composed config (what `meshrun run` would resolve), interpolations as written;
- hydra: meshrun has no Hydra runtime config (it composes with Hydra's compose API and never
  runs @hydra.main). It prints, under `meshrun:`, what meshrun uses in place of Hydra's
  settings (conf/hydra_keys.py: run dir, sweep dir, launcher = the cluster group, job name,
  search path, group choices, overrides), with a header naming each Hydra key it replaces;
- all: both, in one YAML document.

--package selects a subtree (`--package model`) or a value (`--package model.dim`);
--resolve resolves interpolations first. Nothing is created.
"""
from __future__ import annotations

from conf.compose.printed import PrintableConfig, compose_printable, config_text
from conf.errors import ConfigError, Problem
from conf.hydra_keys import EQUIVALENTS, is_hydra_key
from conf.overrides import GROUPS, OPTIONAL_GROUPS
from conf.run_dir.paths import safe_name
from conf.search_path import config_dirs

CFG_PARTS = ("job", "hydra", "all")
SECTION = "meshrun"
HEADER = ("# meshrun has no Hydra runtime config: it composes conf/ with Hydra's compose API and\n"
          "# never runs @hydra.main, so nothing reads hydra.run, hydra.sweep, hydra.job or a\n"
          "# Hydra launcher (a hydra.* override is refused, naming the equivalent). In their "
          "place:\n")


def print_cfg(overrides: list[str], *, part: str, package: str | None, resolve: bool) -> int:
    print(cfg_text(overrides, part=part, package=package, resolve=resolve), end="")
    return 0


def print_cfgs(labelled: list[tuple[str, list[str]]], *, part: str, package: str | None,
               resolve: bool) -> int:
    """Several configs (a sweep's points): one YAML document each, `# label` on top. Every
    one is composed before anything is printed, so a bad point prints nothing."""
    texts = [f"# {label}\n" + cfg_text(overrides, part=part, package=package, resolve=resolve)
             for label, overrides in labelled]
    print("---\n".join(texts), end="")
    return 0


def cfg_text(overrides: list[str], *, part: str, package: str | None, resolve: bool) -> str:
    composed = compose_printable(overrides)
    tree = {} if part == "hydra" else dict(composed.tree)
    if part in ("hydra", "all"):
        tree[SECTION] = runtime_section(composed, overrides)
    text = config_text(tree, package=package, resolve=resolve,
                       missing_fix=_hydra_package_fix(package))
    shows_section = part != "job" and (package in (None, "", "_global_", SECTION))
    return (header() if shows_section else "") + text


def check_cfg_flags(*, cfg: str | None, package: str | None, resolve: bool,
                    others: dict[str, bool], command: str = "run") -> None:
    """--package and --resolve only mean something with --cfg (Hydra refuses --resolve too);
    --cfg runs nothing, so it goes with none of `others` (flag -> given), as in Hydra."""
    given = [flag for flag, on in others.items() if on]
    if cfg is not None and given:
        raise ConfigError([Problem("--cfg", cfg, f"prints the config and runs nothing: it does "
                                   f"not go with {', '.join(given)}",
                                   f"drop --cfg, or drop {', '.join(given)}")], "Bad command")
    if cfg is None and (package is not None or resolve):
        flag = "--package" if package is not None else "--resolve"
        raise ConfigError([Problem(flag, package or "", "only works with --cfg",
                                   "add --cfg job (or hydra, all): "
                                   f"meshrun {command} --cfg job {flag}"
                                   + (f" {package}" if package else "") + " ...")],
                          "Bad command")


def runtime_section(composed: PrintableConfig, overrides: list[str]) -> dict:
    """What meshrun uses in place of Hydra's runtime settings, for this config."""
    runs_dir = str(composed.resolved["runs_dir"]).rstrip("/")
    name = str(composed.resolved["name"])
    values = {
        "run_dir": f"{runs_dir}/{safe_name(name)}-<YYYYmmdd-HHMMSS>",
        "sweep_dir": f"{runs_dir}/sweeps/<sweep name>",
        "launcher": str(composed.resolved["cluster"]["kind"]),
        "job_name": name,
        "searchpath": [str(d) for d in config_dirs()],
        "choices": {g: composed.choices[g] for g in GROUPS + OPTIONAL_GROUPS
                    if g in composed.choices},
        "overrides": list(overrides),
    }
    return {e.shown_as: values[e.shown_as] for e in EQUIVALENTS if e.shown_as}


def header() -> str:
    shown = [e for e in EQUIVALENTS if e.shown_as]
    width = max(len(e.hydra_key) for e in shown)
    lines = [f"#   {e.hydra_key:<{width}} -> {SECTION}.{e.shown_as} (set with {e.set_with})"
             for e in shown]
    return HEADER + "\n".join(lines) + "\n"


def _hydra_package_fix(package: str | None) -> str:
    """--package hydra.run.dir: the key meshrun prints in its place."""
    if not package or not is_hydra_key(package):
        return ""
    found = [e for e in EQUIVALENTS if e.shown_as and package.startswith(e.hydra_key)]
    where = f"{SECTION}.{found[0].shown_as}" if found else SECTION
    return f"meshrun has no Hydra runtime config: meshrun run --cfg hydra --package {where}"
