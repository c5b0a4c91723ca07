"""What the syphon needs from its host, Databricks or a plain Spark: secret scopes for the
configuration, and for the replay notebook widgets, tables, charts and stopping early.

On Databricks these use ``dbutils`` and ``display``; on a plain local Spark (tests, a laptop)
``{secret: scope/key}`` references are an error, widgets fall back to their defaults, which
``SYPHON_WIDGET_<NAME>`` environment variables can override, tables print as text and charts as
text bars. The notebook itself only calls these and the library.
"""

from __future__ import annotations

import importlib.util
import os
import sys
from dataclasses import dataclass
from typing import Any, Callable, Mapping

from backlog_syphon import config


@dataclass(frozen=True)
class Widget:
    name: str
    default: str
    label: str
    choices: tuple[str, ...] = ()  # a dropdown when given


def _dbutils():
    """Databricks' ``dbutils``: from the runtime's SDK (classic and serverless compute alike, with or
    without a session yet), else from the classic runtime's ``pyspark.dbutils``; None elsewhere."""
    try:
        from databricks.sdk.runtime import dbutils  # Databricks runtimes, serverless included
        return dbutils
    except ImportError:
        pass
    try:
        from pyspark.dbutils import DBUtils  # only exists on classic Databricks runtimes
        from pyspark.sql import SparkSession
    except ImportError:
        return None
    return DBUtils(SparkSession.builder.getOrCreate())


def databricks_secret_reader(scope: str, key: str) -> str:
    """Read a Databricks secret (``{secret: scope/key}`` in the configuration)."""
    dbutils = _dbutils()
    if dbutils is None:
        raise config.ConfigError(config.SECRET_SCOPES_NEED_DATABRICKS)
    return dbutils.secrets.get(scope=scope, key=key)


def load_config(path: str | os.PathLike | None = None, *, overrides: Mapping[str, str] | None = None,
                environ: Mapping[str, str] | None = None,
                secret_reader: Callable[[str, str], str] | None = None) -> config.SyphonConfig:
    """``config.load_config`` reading secret scopes from Databricks unless another reader is given."""
    return config.load_config(path, overrides=overrides, environ=environ,
                              secret_reader=secret_reader or databricks_secret_reader)


def default_config_path() -> str:
    """The configuration a notebook starts from: secret-scope references on Databricks, else the emulator's."""
    on_databricks = importlib.util.find_spec("pyspark.dbutils") is not None
    return "conf/databricks.yaml" if on_databricks else "conf/local.yaml"


def widget_values(widgets: list[Widget]) -> dict[str, str]:
    """Create the widgets (on Databricks) and return their current values."""
    dbutils = _dbutils()
    if dbutils is None:
        return {w.name: os.environ.get(f"SYPHON_WIDGET_{w.name.upper()}", w.default) for w in widgets}
    for w in widgets:
        if w.choices:
            dbutils.widgets.dropdown(w.name, w.default, list(w.choices), w.label)
        else:
            dbutils.widgets.text(w.name, w.default, w.label)
    return {w.name: dbutils.widgets.get(w.name) for w in widgets}


def find_repo_file(path: str) -> str:
    """A repo-relative path from the repo root or from ``notebooks/`` (a notebook's working folder)."""
    for candidate in (path, os.path.join("..", path)):
        if os.path.exists(candidate):
            return os.path.abspath(candidate)
    return path  # let the caller's error name the path as given


def show(frame: Any, notebook_display=None, limit: int = 50) -> None:
    """``display`` a DataFrame where the notebook has one, else print it as a text table."""
    if notebook_display is not None:
        notebook_display(frame)
    else:
        frame.show(limit, truncate=False)


def stop_here(message: str) -> None:
    """End the notebook run early, successfully, with a message."""
    print(message)
    dbutils = _dbutils()
    if dbutils is not None:
        dbutils.notebook.exit(message)
    sys.exit(0)
