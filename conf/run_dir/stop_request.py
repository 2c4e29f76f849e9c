"""`meshrun stop` of a cluster=nodes run: a request in the shared run dir that the node agents
read (launcher/node_agent.py polls it), since no process on the stopping machine owns them.

`<run_dir>/stop_request.json` (written atomically: a temporary file, then a rename) names the
agents it asks to stop, each by the record its lock holds (node, host, pid, start time;
launcher/backends/node_presence.py). An agent stops only when the request names it, so a
request left from an earlier launch never stops a resumed run or a fresh pair of agents; a
resume removes it too. Torch-free.
"""
from __future__ import annotations

import json
import os
import time
from pathlib import Path

STOP_REQUEST_FILE = "stop_request.json"
AGENT_KEYS = ("node", "host", "pid", "started")
"""What identifies one node agent: its lock record's fields."""


def stop_request_file(run_dir: Path | str) -> Path:
    return Path(run_dir) / STOP_REQUEST_FILE


def request_stop(run_dir: Path | str, agents: list[dict], *, by: dict) -> None:
    """Ask `agents` (their lock records) to stop the run; `by`: who asked (host, pid)."""
    path = stop_request_file(run_dir)
    request = {"time": time.strftime("%Y-%m-%dT%H:%M:%S%z"), "by": by,
               "agents": [agent_identity(a) for a in agents]}
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    tmp.write_text(json.dumps(request) + "\n")
    os.replace(tmp, path)


def read_stop_request(run_dir: Path | str) -> dict | None:
    """The pending request, or None (none, or torn: the next poll reads it whole)."""
    try:
        request = json.loads(stop_request_file(run_dir).read_text())
    except (OSError, ValueError):
        return None
    return request if isinstance(request, dict) else None


def stop_asked_of(run_dir: Path | str, agent: dict) -> bool:
    """The run dir holds a stop request that names this agent (its lock record)."""
    request = read_stop_request(run_dir)
    named = request.get("agents", []) if request else []
    return isinstance(named, list) and agent_identity(agent) in named


def clear_stop_request(run_dir: Path | str) -> None:
    stop_request_file(run_dir).unlink(missing_ok=True)


def agent_identity(record: dict) -> dict:
    return {key: record.get(key) for key in AGENT_KEYS}
