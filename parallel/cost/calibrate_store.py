"""Where calibrations live: one JSON file, one entry per device. Torch-free.

`meshrun plan --calibrate` writes it; every plan reads the entry of its device (see
`cluster.calibration`). The file::

    {"schema": "meshrun.calibration/1",
     "devices": {"<device key>": {"matmul_efficiency": 0.41, "layer_overhead_us": 120.0,
                                  "intra_node_gbps": 2.1, "intra_node_latency_us": 60.0,
                                  ..., "runs": 3, "median_abs_error": 0.07}}}

The device key is the catalogue row the device matches (parallel.cost.devices: "H100",
"CPU core", ...), else the device's own name. Only the constants the fit could identify are
written; the others stay the catalogue's.
"""
from __future__ import annotations

import json
import math
import os
from pathlib import Path

from conf.errors import ConfigError, Problem
from conf.spec import RunSpec
from parallel.cost.devices import CPU_KEY, device_facts

SCHEMA = "meshrun.calibration/1"
FILE_NAME = "calibration.json"
CONSTANTS = ("peak_tflops", "hbm_gbps", "intra_node_gbps", "inter_node_gbps",
             "intra_node_latency_us", "inter_node_latency_us", "matmul_efficiency",
             "layer_overhead_us", "tp_overhead_us", "collective_overhead_us", "host_link_gbps",
             "update_overhead_us", "matmul_knee_us", "ep_imbalance", "reserved_ratio")
"""The constants a calibration may hold: the `cluster.*` knobs of the same names (reserved_ratio:
fitted to CUDA runs' memory peaks, parallel.cost.allocator_reserve), and
`parallel.ep_imbalance` (fitted to MoE runs' routing: parallel.cost.routing_fit)."""


RATIOS = ("ep_imbalance", "reserved_ratio")
"""Constants that are ratios of at least 1 by construction (routing_fit, allocator_reserve)."""


def default_path() -> Path:
    """$MESHRUN_HOME/calibration.json, else ~/.meshrun/calibration.json."""
    home = os.environ.get("MESHRUN_HOME") or os.path.join(os.path.expanduser("~"), ".meshrun")
    return Path(home) / FILE_NAME


def path_of(setting: str) -> Path | None:
    """The file `cluster.calibration` names: auto = the default path, none = no file."""
    if setting == "none":
        return None
    return default_path() if setting in ("auto", "") else Path(setting).expanduser()


def device_key(spec: RunSpec) -> str:
    """The calibration entry a run reads and writes: its catalogue row, else its GPU name."""
    if spec.training.device != "cuda":
        return CPU_KEY
    facts = device_facts(spec.host.gpu_name)
    return facts.key if facts is not None else spec.host.gpu_name


def load_entry(spec: RunSpec) -> dict:
    """The calibrated constants for `spec`'s device ({} when there is none). A named file that
    is missing or unreadable raises ValueError (the message names the key and the file)."""
    path = path_of(spec.cluster.calibration)
    if path is None or (not path.exists() and spec.cluster.calibration in ("auto", "")):
        return {}
    data = read_file(path, key="cluster.calibration")
    entry = data["devices"].get(device_key(spec), {})
    return {k: float(v) for k, v in entry.items() if k in CONSTANTS}


def read_file(path: Path, *, key: str) -> dict:
    """The calibration file at `path`; ConfigError (a ValueError) naming `key` if it is not."""
    fix = f"run `meshrun plan --calibrate <run dirs>`, or set {key}=none"
    try:
        data = json.loads(Path(path).read_text())
    except (OSError, ValueError) as error:
        raise ConfigError([Problem(key, path, f"not a readable calibration file ({error})",
                                   fix)]) from None
    if not isinstance(data, dict) or data.get("schema") != SCHEMA or \
            not isinstance(data.get("devices"), dict):
        raise ConfigError([Problem(key, path, f"not a {SCHEMA} file", fix)])
    bad = [f"{device}.{name}={value}" for device, entry in data["devices"].items()
           for name, value in (entry.items() if isinstance(entry, dict) else [("", entry)])
           if name in CONSTANTS and not _finite_number(value) or not isinstance(entry, dict)]
    if bad:
        raise ConfigError([Problem(key, path, f"holds a constant that is not a finite number "
                                   f"({bad[0]})", fix)])
    below = [f"{device}.{name}={value}" for device, entry in data["devices"].items()
             for name, value in entry.items() if name in RATIOS and value < 1]
    if below:
        raise ConfigError([Problem(key, path, f"holds a ratio below 1 ({below[0]}): "
                                   f"{', '.join(RATIOS)} are a max or a reserve over a mean or "
                                   "an allocation", fix)])
    return data


def _finite_number(value: object) -> bool:
    return (isinstance(value, (int, float)) and not isinstance(value, bool)
            and math.isfinite(value))


def store_entry(path: Path, device: str, constants: dict) -> Path:
    """Merge `constants` into `path`'s entry for `device` (atomically: temp file, rename)."""
    path = Path(path)
    data = read_file(path, key="calibration file") if path.exists() else \
        {"schema": SCHEMA, "devices": {}}
    data["devices"][device] = {**data["devices"].get(device, {}), **constants}
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(data, indent=2, sort_keys=True) + "\n")
    tmp.replace(path)
    return path
