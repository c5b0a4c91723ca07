"""The foreachBatch sink (``sink.foreach_batch.DeliverySink``): the Delta transaction app id, and the
settings it carries to where Spark runs it (a Spark Connect server gets a pickled copy)."""

from pyspark import cloudpickle

from backlog_syphon.config import load_config
from backlog_syphon.sink.foreach_batch import DeliverySink, checkpoint_app_id
from backlog_syphon.sink.micro_batch import NO_HOOKS, CrashPoint
from tools.fault_hooks import FaultHooks
from tools.fault_plan import FaultPlan

SECRET = "Endpoint=sb://127.0.0.1:5672;SharedAccessKeyName=Root;SharedAccessKey=k=;UseDevelopmentEmulator=true"
CONFIG = """
primary: {namespace: contoso, connection_string: {env: P}}
secondary: {connection_string: {env: S}}
storage: {audit_table: /t/audit, checkpoint_table: /t/cp, checkpoint_location: /t/stream}
"""


def test_the_transaction_app_id_is_one_per_streaming_checkpoint_and_query():
    app_id = checkpoint_app_id("/state/checkpoint", "query-1")
    assert app_id == checkpoint_app_id("/state/checkpoint", "query-1")
    assert app_id.startswith("backlog-syphon-") and len(app_id) == len("backlog-syphon-") + 16
    assert app_id != checkpoint_app_id("/state/checkpoint", "query-2")  # the checkpoint made again at the same path
    assert app_id != checkpoint_app_id("/state/other", "query-1")
    assert checkpoint_app_id("/state/checkpoint", None) == checkpoint_app_id("/state/checkpoint", "")


def test_the_sink_carries_a_test_harnesss_hooks_to_where_it_runs_and_has_none_otherwise(tmp_path):
    path = tmp_path / "c.yaml"
    path.write_text(CONFIG)
    config = load_config(path, environ={"P": SECRET, "S": SECRET})
    assert DeliverySink(config, run_id="r1", lease_keeper=None).hooks is NO_HOOKS
    plan = FaultPlan(pause_at=CrashPoint.AFTER_SEND, marker=str(tmp_path / "marker"))
    sink = DeliverySink(config, run_id="r1", lease_keeper=None, hooks=FaultHooks(plan))
    sink.classifiers._built[("backlog_queue",)] = "column expressions of this process"  # the copy builds its own
    copy = cloudpickle.loads(cloudpickle.dumps(sink))
    assert copy.hooks.plan == plan and copy.run_id == "r1" and copy._purges._hooks.plan == plan
    assert copy.classifiers._built == {} and copy.classifiers.config == config
