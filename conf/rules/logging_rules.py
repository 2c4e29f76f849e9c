"""Rules on the TensorBoard and MLflow knobs (logging.*) that otherwise fail only on rank 0,
after launch, where a failing logger is only named in the log. Each adds Problems; none raises."""
from __future__ import annotations

import re

from conf.errors import ProblemList
from conf.schema import LoggingConfig

MLFLOW_SCHEMES = ("http", "https", "sqlite", "postgresql", "mysql", "mssql", "databricks")
"""Tracking URI schemes MLflow's client serves: a server, a database store, Databricks."""
BARE_URIS = ("databricks", "databricks-uc")
"""Tracking URIs MLflow takes without `://` (the default Databricks profile)."""
SCHEME = re.compile(r"^([A-Za-z][A-Za-z0-9+.-]*)://")
URI_EXAMPLES = ("http://localhost:5000 for a tracking server, sqlite:////abs/path/mlflow.db, "
                "or leave it empty for a SQLite store in the run dir")


def check_logging(lg: LoggingConfig, problems: ProblemList) -> None:
    """The MLflow store and experiment can be used by rank 0."""
    key, uri = "logging.mlflow_tracking_uri", lg.mlflow_tracking_uri
    if uri and not lg.mlflow:
        problems.add(key, uri, "is set but logging.mlflow=false, so nothing would be logged",
                     "add logging.mlflow=true, or drop the tracking URI")
    if uri:
        _check_tracking_uri(key, uri, problems)
    if lg.mlflow and not lg.mlflow_experiment.strip():
        problems.add("logging.mlflow_experiment", repr(lg.mlflow_experiment),
                     "must name an experiment", "e.g. logging.mlflow_experiment=meshrun")


def _check_tracking_uri(key: str, uri: str, problems: ProblemList) -> None:
    if uri in BARE_URIS:
        return
    found = SCHEME.match(uri)
    if found is None:
        problems.add(key, uri, "is not a URI (scheme://...)", f"use {URI_EXAMPLES}")
        return
    scheme = found.group(1).lower().split("+")[0]  # postgresql+psycopg2:// is postgresql
    if scheme == "file":
        problems.add(key, uri, "MLflow 3 refuses file stores (maintenance mode)",
                     "use sqlite:////abs/path/mlflow.db, or leave it empty")
    elif scheme not in MLFLOW_SCHEMES:
        problems.add(key, uri, f"scheme {scheme!r} is not one MLflow tracks to "
                     f"(valid: {', '.join(MLFLOW_SCHEMES)})", f"use {URI_EXAMPLES}")
    elif scheme == "sqlite":
        _check_sqlite_path(key, uri, problems)


def _check_sqlite_path(key: str, uri: str, problems: ProblemList) -> None:
    """sqlite:///rel.db is relative to rank 0's working folder, sqlite:// is in memory."""
    path = uri[len("sqlite://"):]
    if not path.startswith("//"):
        problems.add(key, uri, "is not an absolute SQLite path (sqlite:// is in memory, "
                     "sqlite:///x.db relative to the rank's working folder)",
                     "give an absolute path with four slashes: sqlite:////abs/path/mlflow.db")
