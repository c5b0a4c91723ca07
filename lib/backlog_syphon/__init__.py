"""The backlog syphon: drains Azure Service Bus paired-namespace backlog queues back to their destinations,
on Spark Structured Streaming, with every outcome recorded in Delta tables.

The public API, loaded on first use so that ``import backlog_syphon`` stays cheap and imports no
pyspark (Spark's Python workers import this package too)::

    from backlog_syphon import dry_run, load_config, run_syphon, status

    config = load_config("conf/local.yaml")
    print("\\n".join(dry_run(spark, config).lines()))
    summary = run_syphon(spark, config)
    print("\\n".join(status(spark, config).lines()))

Packages: ``restore`` (pure restore rules and AMQP codec), ``source`` (the ``servicebus-backlog``
data source), ``sink`` (the ``foreachBatch`` sink), ``servicebus`` (all Service Bus I/O),
``storage`` (all Delta I/O), ``run`` (wiring, dry run, fence, progress, reports, Spark session);
``model`` is the shared vocabulary and ``config`` the settings.
"""

from __future__ import annotations

import importlib

_PUBLIC = {
    "run_syphon": "backlog_syphon.run.syphon",
    "dry_run": "backlog_syphon.run.dry_run",
    "status": "backlog_syphon.run.status",  # is the backlog drained, and if not, why not (changes nothing)
    # config.load_config, with Databricks' secret scopes where they exist
    "load_config": "backlog_syphon.run.databricks_host",
    "SyphonConfig": "backlog_syphon.config",
}

__all__ = sorted(_PUBLIC)


def __getattr__(name: str):
    module = _PUBLIC.get(name)
    if module is None:
        raise AttributeError(f"module 'backlog_syphon' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value  # once loaded, a plain attribute
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_PUBLIC))
