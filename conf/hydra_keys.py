"""Hydra's runtime settings (`hydra.run.dir=`, `hydra/launcher=`, ...) and what meshrun uses
in their place: one table, read by the override check (a `hydra.*` override is refused with
the equivalent to type) and by `meshrun run --cfg hydra` (which prints the equivalents).

meshrun composes conf/ with Hydra's compose API and never runs `@hydra.main`, so it has no
Hydra runtime config: nothing reads `hydra.run`, `hydra.sweep`, `hydra.job` or a Hydra
launcher. A `hydra.*` override is refused rather than mapped, because no mapping is exact
(hydra.run.dir is the run's own dir; meshrun makes `<runs_dir>/<name>-<time>` under runs_dir).
`hydra.searchpath=[...]` is the one Hydra setting meshrun reads (launcher/hydra_flags.py).
"""
from __future__ import annotations

from dataclasses import dataclass

HYDRA = "hydra"
NO_RUNTIME = ("is a Hydra runtime setting; meshrun has no Hydra runtime config (it composes "
              "with Hydra's compose API only)")
CFG_HINT = "`meshrun run --cfg hydra` lists meshrun's equivalents"


@dataclass(frozen=True, slots=True)
class Equivalent:
    """One Hydra setting and meshrun's equivalent."""

    hydra_key: str
    """As a Hydra user writes it: hydra.run.dir, hydra/launcher (a group), ..."""
    set_with: str
    """What to type with meshrun instead, short: runs_dir=DIR name=NAME."""
    note: str = ""
    """What that does, when set_with alone does not say."""
    shown_as: str = ""
    """Its key under `meshrun:` in `meshrun run --cfg hydra` ("" = not printed there)."""

    @property
    def fix(self) -> str:
        return f"{self.set_with} ({self.note})" if self.note else self.set_with


EQUIVALENTS = (
    Equivalent("hydra.run.dir", "runs_dir=DIR name=NAME",
               "the run's dir is then DIR/NAME-<YYYYmmdd-HHMMSS>", "run_dir"),
    Equivalent("hydra.sweep.dir", "meshrun sweep --dir DIR ...",
               "default <runs_dir>/sweeps/<sweep name>", "sweep_dir"),
    Equivalent("hydra.sweep.subdir", "meshrun sweep --run-name TEMPLATE ...",
               "each point's run name, e.g. 'lr{optim.lr}-{index}'"),
    Equivalent("hydra/launcher", "cluster=local|nodes|slurm",
               "local: torchrun here; nodes: torchrun per machine; slurm: Slurm through "
               "submitit; it sets cluster.kind, the other settings are cluster.*", "launcher"),
    Equivalent("hydra.launcher", "the cluster.* keys",
               "see ClusterConfig in conf/schema_cluster.py"),
    Equivalent("hydra.job.name", "name=NAME", "the run's name: its run dir and W&B run",
               "job_name"),
    Equivalent("hydra.searchpath", "--config-dir DIR or MESHRUN_CONFIG_PATH=DIR",
               "on the command line hydra.searchpath=[DIR] works too", "searchpath"),
    Equivalent("hydra.runtime.choices", "group=option, e.g. model=tiny", "", "choices"),
    Equivalent("hydra.overrides.task", "the overrides as typed",
               "stored in the run dir", "overrides"),
    Equivalent("hydra.mode", "meshrun run -m ... or meshrun sweep ...", "several runs"),
    Equivalent("hydra/sweeper", "meshrun sweep --combine grid|random|...",
               "or a sweep file: meshrun sweep -f FILE"),
    Equivalent("hydra.sweeper", "meshrun sweep",
               "axes as overrides a,b or range(); a sweep file for zipped, random and listed "
               "points"),
)

SUBMITIT_KEYS = {
    "partition": "cluster.partition", "account": "cluster.account", "qos": "cluster.qos",
    "constraint": "cluster.constraint", "nodes": "cluster.nodes",
    "tasks_per_node": "cluster.procs_per_node", "gpus_per_node": "cluster.gpus_per_node",
    "cpus_per_task": "cluster.cpus_per_task", "mem_gb": "cluster.mem_gb",
    "timeout_min": "cluster.time_limit_min", "setup": "cluster.setup",
    "additional_parameters": "cluster.extra_sbatch",
    "array_parallelism": "meshrun sweep --array-parallelism N",
}
"""hydra.launcher.<key> of hydra-submitit-launcher -> meshrun's key of the same meaning."""


def is_hydra_key(key: str) -> bool:
    """`hydra`, `hydra.x.y` or the group `hydra/x`."""
    return key == HYDRA or key.startswith((HYDRA + ".", HYDRA + "/"))


def hydra_fix(key: str, value: object) -> str:
    """The fix of a refused `hydra...` override: meshrun's equivalent to type instead."""
    return f"{_equivalent(key, value)}; {CFG_HINT}"


def _equivalent(key: str, value: object) -> str:
    """`value`: the override's one value (None for a sweep or `~key`)."""
    given = "" if value is None or "${" in str(value) else str(value)
    if key == "hydra.run.dir" and given.strip("/"):
        return _run_dir_fix(given)
    if key == "hydra.sweep.dir" and given:
        return f"meshrun sweep --dir {given} ..."
    if key.startswith("hydra.launcher."):
        param = key.split(".", 2)[2]
        if param in SUBMITIT_KEYS:
            return f"{SUBMITIT_KEYS[param]} (with cluster=slurm)"
    if key == "hydra/launcher" and "slurm" in str(value):
        return "cluster=slurm (Slurm through submitit; its settings are cluster.*)"
    found = [e for e in EQUIVALENTS if key == e.hydra_key or key.startswith(e.hydra_key + ".")]
    if found:
        return max(found, key=lambda e: len(e.hydra_key)).fix
    shown = [e for e in EQUIVALENTS
             if e.shown_as in ("run_dir", "sweep_dir", "launcher", "job_name")]
    return ("no meshrun equivalent: remove it (meshrun's equivalents of Hydra settings: "
            + ", ".join(f"{e.hydra_key} -> {e.set_with}" for e in shown) + ")")


def _run_dir_fix(run_dir: str) -> str:
    """hydra.run.dir=/data/out/exp1 -> runs_dir=/data/out name=exp1 (not the same dir: meshrun
    adds the launch time to the name)."""
    parent, _, name = run_dir.rstrip("/").rpartition("/")
    parent = parent or ("/" if run_dir.startswith("/") else ".")
    return (f"runs_dir={parent} name={name} (the run's dir is then "
            f"{parent.rstrip('/')}/{name}-<YYYYmmdd-HHMMSS>)")
