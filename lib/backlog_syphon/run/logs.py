"""Machine-readable logs (``--log-format json``, ``run.log_format: json``): one JSON object per line.

Every line carries the run's ids (``run_id``, and the Databricks ``job_id`` and ``job_run_id`` that tie it
to the jobs UI), the ``batch_id`` and ``backlog_queue`` it is about (null when it is about neither),
the level, the logger and the message. A record's own facts come as fields of their own: a progress
line's counts, rates and remaining backlog (``run.progress.progress_fields``), a run summary's counts,
the status report. The ids are the process's (one command, one run), set once by the command line.

Secrets stay out as they do in text: no log message carries one, and a ``config.Secret`` among a
record's fields is written as its masked text.
"""

from __future__ import annotations

import datetime as dt
import json
import logging
import re
from enum import Enum

_CONTEXT: dict[str, str | None] = {"run_id": None, "job_id": None, "job_run_id": None}
# The library's log lines name their batch and backlog queue as ``batch_id=N`` (or ``batch N``) and
# ``backlog=<queue>``: the stable keys of its messages.
_BATCH = re.compile(r"\bbatch(?:_id=| )(\d+)\b")
_BACKLOG = re.compile(r"\bbacklog=(\S+)")
_RECORD_ATTRIBUTES = frozenset(vars(logging.LogRecord("", 0, "", 0, "", (), None))) | {"message", "asctime"}


def set_context(**ids: str | None) -> None:
    """The ids every JSON line of this process carries from now on (``run_id``, ``job_id``, ``job_run_id``)."""
    unknown = set(ids) - set(_CONTEXT)
    if unknown:
        raise ValueError(f"unknown log context keys: {sorted(unknown)}")
    _CONTEXT.update(ids)


def record_fields(level: str, logger: str, message: str, fields: dict | None = None,
                  at: dt.datetime | None = None) -> dict:
    """A JSON line's fields: when, level, logger, message, the ids, then the record's own fields."""
    batch = _BATCH.search(message)
    queue = _BACKLOG.search(message)
    line = {"time": (at or dt.datetime.now(dt.timezone.utc)).isoformat(timespec="milliseconds"), "level": level,
            "logger": logger, "message": message, **_CONTEXT,
            "batch_id": int(batch.group(1)) if batch else None,
            "backlog_queue": queue.group(1).rstrip(".,;:") if queue else None}
    line.update(fields or {})
    return line


def json_line(fields: dict) -> str:
    return json.dumps(fields, default=_plain, ensure_ascii=False)


class JsonFormatter(logging.Formatter):
    """One JSON object per record; ``tracebacks``: an exception's traceback in the field ``exception``
    (the log file has them; the console only with ``--verbose``, as in text)."""

    def __init__(self, *, tracebacks: bool = True):
        super().__init__()
        self.tracebacks = tracebacks

    def format(self, record: logging.LogRecord) -> str:
        own = {key: value for key, value in vars(record).items() if key not in _RECORD_ATTRIBUTES}
        if record.exc_info and self.tracebacks:
            own["exception"] = self.formatException(record.exc_info)
        at = dt.datetime.fromtimestamp(record.created, dt.timezone.utc)
        return json_line(record_fields(record.levelname, record.name, record.getMessage(), own, at))


def _plain(value):
    """JSON for what ``json`` does not know: times in ISO 8601, enums as their values, the rest as text
    (a ``config.Secret`` shows itself masked)."""
    if isinstance(value, (dt.datetime, dt.date)):
        return value.isoformat()
    if isinstance(value, Enum):
        return value.value
    if isinstance(value, (set, frozenset, tuple)):
        return list(value)
    return str(value)
