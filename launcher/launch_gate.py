"""What must hold before anything is launched or queued, beyond resolve()'s rules: the plan
fits where the ranks will run (unless --force), W&B online has a key to log in with, and the
TensorBoard / MLflow packages are installed when turned on.

`meshrun run` (its dry run too), `meshrun resume`, `meshrun sweep` (every point, before any is
submitted) and so Slurm submission ask `check_launchable`; a refusal is one ConfigError
(exit 2), printed with the re-planned suggestions of launcher.plan.fit_advice.
"""
from __future__ import annotations

import importlib.util

from conf.errors import ProblemList
from conf.spec import RunSpec
from launcher import hardware
from launcher.plan.fit_advice import Suggestion, suggestions
from launcher.wandb_credentials import base_url, credentials_source
from parallel.cost.devices import GIB
from parallel.cost.plan import Plan, make_plan

TITLE = "Cannot launch"


def device_memory(spec: RunSpec) -> float | None:
    """Bytes of one of the run's GPUs (launcher.hardware.device_memory); None on CPU."""
    if spec.training.device != "cuda":
        return None
    from launcher.backends.choose import backend_for

    return hardware.device_memory(spec.host.gpu_name,
                                  local=backend_for(spec.cluster).on_this_machine)


def launch_plan(spec: RunSpec) -> Plan:
    """The plan the gate judges: the catalogue's GPU memory, or nvidia-smi's for a GPU the
    catalogue does not know on this machine."""
    return make_plan(spec, device_bytes=device_memory(spec))


def check_launchable(spec: RunSpec, overrides: list[str], *, force: bool,
                     plan: Plan | None = None, advice: list[Suggestion] | None = None) -> None:
    """Raise one ConfigError when the run may not launch: it does not fit (unless `force`),
    W&B online has no key, or a logger's package is missing. `plan`/`advice`: already computed by the caller's printout."""
    problems = ProblemList()
    if not force:
        plan = plan or launch_plan(spec)
        if plan.verdict.fits is False:
            if advice is None:
                advice = suggestions(spec, overrides, device_bytes=device_memory(spec))
            add_fit_problem(plan, advice, problems)
    add_wandb_problem(spec, problems)
    add_logger_package_problems(spec, problems)
    problems.raise_if_any(TITLE)


def add_fit_problem(plan: Plan, advice: list[Suggestion], problems: ProblemList,
                    key: str = "memory") -> None:
    v = plan.verdict
    problems.add(key, f"{v.need_bytes / GIB:.2f} GiB",
                 v.line.replace("DOES NOT FIT: ", "the plan does not fit: "), fit_fix(advice))


def fit_fix(advice: list[Suggestion]) -> str:
    """The re-planned suggestions (those that fit, then those not enough alone), then --force."""
    def shown(s: Suggestion) -> str:
        return f"{' '.join(s.overrides)} ({s.what}: {s.plan.memory.total / GIB:.2f} GiB per rank)"

    fitting = [shown(s) for s in advice if s.plan.verdict.fits]
    short = [shown(s) for s in advice if not s.plan.verdict.fits]
    parts = ["add " + "; or ".join(fitting)] if fitting else []
    if short:
        parts.append("not enough alone: " + "; ".join(short))
    return "; ".join([*parts, "or pass --force to launch anyway (it may fail out of memory)"])


def add_wandb_problem(spec: RunSpec, problems: ProblemList) -> None:
    """W&B online needs a key where the launch starts (the ranks inherit its environment)."""
    if spec.logging.wandb_mode.value != "online" or credentials_source() is not None:
        return
    problems.add("logging.wandb_mode", "online",
                 f"W&B online needs an API key for {base_url()}, and none is configured here "
                 "(no WANDB_API_KEY, no netrc entry, no api_key in wandb's settings): rank 0 "
                 "would fail at wandb.init, after the queue",
                 "run `wandb login` (or export WANDB_API_KEY=...), or use logging=offline "
                 "and `wandb sync` the run later")


LOGGER_PACKAGES = {"tensorboard": ("tensorboard", "pip install tensorboard"),
                   "mlflow": ("mlflow", "pip install 'meshrun[mlflow]'")}
"""logging.<knob> -> the package rank 0 imports for it, and how to install it."""


def add_logger_package_problems(spec: RunSpec, problems: ProblemList,
                                packages: dict[str, tuple[str, str]] = LOGGER_PACKAGES) -> None:
    """A logger turned on needs its package where the launch starts (the ranks share its
    environment); without it rank 0 could only name the failure after the launch."""
    for knob, (package, install) in packages.items():
        if getattr(spec.logging, knob) and importlib.util.find_spec(package) is None:
            problems.add(f"logging.{knob}", "true", f"needs the {package} package, which is "
                         "not installed here", f"{install}, or logging.{knob}=false")
