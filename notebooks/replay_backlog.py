# Databricks notebook source
# MAGIC %md
# MAGIC # Replay a paired-namespace backlog
# MAGIC
# MAGIC Drains the `<primary>/x-servicebus-transfer/<N>` backlog queues of the secondary namespace back to
# MAGIC their destinations in the primary namespace, once (`available_now`), with the syphon library.
# MAGIC
# MAGIC 1. Set the widgets: the config file, and optionally the namespace pair (connection strings as
# MAGIC    `secret:<scope>/<key>` or `env:<VAR>` references, never pasted).
# MAGIC 2. Run all: the **status** says whether the backlog is drained and, if not, why not; the **dry run**
# MAGIC    shows what would move and what would be dead-lettered. Nothing moves while `replay` is `no`.
# MAGIC 3. Set `replay` to `yes` and run all again: progress shows one line per micro-batch, then a summary,
# MAGIC    the audit report and charts.
# MAGIC
# MAGIC With `conf/databricks.yaml` the notebook uses the same tables and streaming checkpoint as the bundle's
# MAGIC jobs: pause their schedule (or let the running one finish) before replaying from here.
# MAGIC
# MAGIC **Re-drive dead-letters**: set `source` to `dead_letters` to read the backlog queues' dead-letter
# MAGIC sub-queues instead (what the syphon, or the broker, dead-lettered), with the `redrive_*` filters. The dry
# MAGIC run then shows what would move per destination and dead-letter reason; `replay` = `yes` moves it. What
# MAGIC is not selected, or still cannot be delivered, stays in the dead-letter queue (see
# MAGIC docs/running/redrive.md).
# MAGIC
# MAGIC Outside Databricks the widgets take their defaults (or `SYPHON_WIDGET_<NAME>` variables):
# MAGIC `python notebooks/replay_backlog.py` from the repository root.

# COMMAND ----------

# The library: installed as the wheel on a cluster, or taken from this repository's lib/ folder.
import importlib.util
import os
import sys

if importlib.util.find_spec("backlog_syphon") is None:
    for candidate in ("lib", os.path.join("..", "lib")):
        if os.path.isdir(os.path.join(candidate, "backlog_syphon")):
            sys.path.insert(0, os.path.abspath(candidate))
            break

from backlog_syphon.run import reports
from backlog_syphon.run.databricks_host import (Widget, default_config_path, find_repo_file, load_config, show,
                                                stop_here, widget_values)
from backlog_syphon.run.dry_run import dry_run
from backlog_syphon.run.status import status
from backlog_syphon.run.spark_session import build_spark_session
from backlog_syphon.run.syphon import run_syphon
from backlog_syphon.storage import delta

try:
    notebook_display = display  # noqa: F821 - provided by Databricks notebooks
except NameError:
    notebook_display = None

# COMMAND ----------

params = widget_values([
    Widget("config", default_config_path(), "Config file (repository path)"),
    Widget("primary_namespace", "", "Primary namespace name (blank: from config)"),
    Widget("primary_connection", "", "Primary connection (secret:scope/key or env:VAR; blank: config)"),
    Widget("secondary_connection", "", "Secondary connection (secret:scope/key or env:VAR; blank: config)"),
    Widget("max_messages_per_trigger", "", "Messages per micro-batch (blank: config)"),
    Widget("ttl_policy", "config", "TTL policy", ("config", "remaining", "restart")),
    Widget("source", "backlog", "Read the backlog, or re-drive its dead-letters", ("backlog", "dead_letters")),
    Widget("redrive_reason_codes", "", "Re-drive: syphon reason codes (comma-separated; blank: any)"),
    Widget("redrive_dead_letter_reasons", "", "Re-drive: broker dead-letter reasons, e.g. MaxDeliveryCountExceeded"),
    Widget("redrive_destinations", "", "Re-drive: destinations (comma-separated; blank: any)"),
    Widget("redrive_enqueued_after", "", "Re-drive: entered the backlog at or after (ISO 8601, with zone)"),
    Widget("redrive_enqueued_before", "", "Re-drive: entered the backlog before (ISO 8601, with zone)"),
    Widget("redrive_retry_dead_lettered", "no", "Re-drive: retry what an earlier re-drive dead-lettered again",
           ("no", "yes")),
    Widget("replay", "no", "Replay after the dry run", ("no", "yes")),
])
overrides = {"run.trigger": "available_now"}
for widget, key in [("primary_namespace", "primary.namespace"), ("primary_connection", "primary.connection_string"),
                    ("secondary_connection", "secondary.connection_string"),
                    ("max_messages_per_trigger", "run.max_messages_per_trigger")]:
    if params[widget].strip():
        overrides[key] = params[widget].strip()
if params["ttl_policy"] != "config":
    overrides["restore.ttl_policy"] = params["ttl_policy"]
if params["source"] == "dead_letters":
    overrides["run.source"] = "dead_letters"
    for key in ("reason_codes", "dead_letter_reasons", "destinations", "enqueued_after", "enqueued_before"):
        if params[f"redrive_{key}"].strip():
            overrides[f"redrive.{key}"] = params[f"redrive_{key}"].strip()
    if params["redrive_retry_dead_lettered"] == "yes":
        overrides["redrive.retry_dead_lettered"] = "true"
config = load_config(find_repo_file(params["config"]), overrides=overrides)
spark = build_spark_session("backlog-syphon-replay")
print(f"primary namespace {config.primary.namespace}; {config.backlog.queue_count} backlog queues"
      f"{' (re-drive of their dead-letter sub-queues)' if config.redriving else ''}; "
      f"audit table {config.storage.audit_table}")

# COMMAND ----------

# MAGIC %md
# MAGIC ## Status: is the backlog drained, and if not, why not
# MAGIC What each backlog queue and dead-letter sub-queue holds now, where the tables say the syphon is, who
# MAGIC holds the lease, the last runs, and a verdict (the same as `jobs/syphon.py --status`). Changes nothing.

# COMMAND ----------

print("\n".join(status(spark, config).lines()))

# COMMAND ----------

# MAGIC %md
# MAGIC ## Dry run: what would move
# MAGIC Peeks every backlog queue (or, re-driving, every dead-letter sub-queue) and attaches (without sending) to
# MAGIC every destination. Nothing changes. A re-drive's plan comes per destination and dead-letter reason.

# COMMAND ----------

plan = dry_run(spark, config)
print("\n".join(plan.lines()))
if plan.per_reason:
    show(spark.createDataFrame(plan.per_reason), notebook_display)
elif plan.per_destination:
    show(spark.createDataFrame(plan.per_destination), notebook_display)

# COMMAND ----------

if params["replay"] != "yes":
    stop_here("dry run only: set the 'replay' widget to 'yes' and run again to move these messages")

# COMMAND ----------

# MAGIC %md
# MAGIC ## Replay
# MAGIC One progress line per micro-batch: delivered, dead-lettered, skipped, the oldest message's age,
# MAGIC the send rate and what remains behind each backlog queue.

# COMMAND ----------

summary = run_syphon(spark, config, on_progress=print)
print("\n".join(summary.lines()))

# COMMAND ----------

# MAGIC %md
# MAGIC ## What moved (from the audit table)

# COMMAND ----------

audit = delta.read_table(spark, config.storage.audit_table)
show(reports.audit_summary(audit, run_id=summary.run_id), notebook_display)
show(reports.dead_letter_reasons(audit, run_id=summary.run_id), notebook_display)

# COMMAND ----------

# MAGIC %md
# MAGIC ## Messages moved over time, and backlog remaining after each micro-batch

# COMMAND ----------

moved = reports.moved_over_time(audit, run_id=summary.run_id, bucket="10 seconds")
remaining = [(f"batch {point.batch_id}", point.remaining_total) for point in summary.progress
             if point.remaining_total is not None]  # a batch whose tail was not measured has no point
if notebook_display is not None:
    notebook_display(moved)  # choose the line chart in the cell's visualisations
    notebook_display(spark.createDataFrame(remaining or [("none", 0)], "batch string, remaining long"))
else:
    print("messages moved per 10 seconds")
    print("\n".join(reports.text_chart([(f"{row['bucket_start']:%H:%M:%S}", row["moved"])
                                               for row in moved.collect()])))
    print("backlog remaining after each micro-batch")
    print("\n".join(reports.text_chart(remaining)))
