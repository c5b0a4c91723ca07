"""The Databricks Asset Bundle (databricks.yml, resources/*.yml, conf/databricks.yaml), checked offline.

No workspace, no Databricks CLI, no Spark: the bundle's YAML is read with pyyaml and its ``${var.*}``
references are resolved per target the way the CLI does for plain variables (a variable the CLI looks
up in the workspace, the SQL warehouse, gets a stub id). Each job, alert and dashboard definition is
then loaded into the typed classes of the ``databricks-bundles`` package (``Job.from_dict``,
``Alert.from_dict``, ``Dashboard.from_dict``), which reject fields the APIs do not have, values outside
their enums and missing required fields; the assertions read the typed objects. Each job's task
parameters go through the real argument parser and ``load_config`` with a stub secret reader. The
dashboard's file is checked for its structure here; its queries, and the alerts', run against tables
real runs wrote in ``tests/integration/test_operations.py``.
"""

import configparser
import copy
import dataclasses
import fnmatch
import glob
import importlib
import re
import shutil
import subprocess
from pathlib import Path

import json

import pytest
import yaml
from databricks.bundles.alerts import (Aggregation, Alert, AlertEvaluationState, ComparisonOperator,
                                       SchedulePauseStatus)
from databricks.bundles.dashboards import Dashboard
from databricks.bundles.jobs import DataSecurityMode, Job, JobsHealthMetric, PauseStatus, Task

from backlog_syphon.cli import build_parser
from backlog_syphon.config import load_config, parse_overrides, trigger_options

ROOT = Path(__file__).resolve().parents[2]
BUNDLE_FILE = ROOT / "databricks.yml"
AVAILABLE_NOW_JOB = "backlog_syphon_available_now"
CONTINUOUS_JOB = "backlog_syphon_continuous"
MAINTENANCE_JOB = "backlog_syphon_maintenance"
FILES_ROOT = "${workspace.file_path}/"  # where the bundle syncs the repository's files
# Substitutions the CLI provides itself; anything else in ${...} must be a declared variable.
BUILTIN_REFS = {"workspace.file_path", "workspace.current_user.userName", "workspace.current_user.short_name",
                "bundle.name", "bundle.target", "workspace.root_path", "workspace.artifact_path"}
VAR_REF = re.compile(r"\$\{var\.([A-Za-z0-9_-]+)\}")
ANY_REF = re.compile(r"\$\{([^}]+)\}")
# Shape-valid for config.validation._check_connection_string; never a real namespace.
STUB_CONNECTION_STRING = "Endpoint=sb://stub/;SharedAccessKeyName=stub;SharedAccessKey=stub"
# Access modes with Unity Catalog (tables and volumes): dedicated and standard, legacy names included.
UNITY_CATALOG_ACCESS_MODES = {DataSecurityMode.SINGLE_USER, DataSecurityMode.DATA_SECURITY_MODE_DEDICATED,
                              DataSecurityMode.USER_ISOLATION, DataSecurityMode.DATA_SECURITY_MODE_STANDARD}
# Serverless environment 4 is the first with the Spark 4 client API (Databricks Connect 17, Python 3.12).
MIN_SERVERLESS_ENVIRONMENT_VERSION = 4
STUB_LOOKUP_ID = "stub-looked-up-id"  # what a variable the CLI looks up in the workspace resolves to here
# The syphon's tables as the jobs name them (storage.runs_table defaults to <checkpoint_table>_runs).
TABLES = ("audit", "checkpoint", "checkpoint_runs")
TASK_KINDS = [f.name for f in dataclasses.fields(Task) if f.name.endswith("_task")]


def normalise(name):
    """PEP 503 name normalisation, as importlib.metadata applies it to distribution names."""
    return re.sub(r"[-_.]+", "-", name).lower()


@pytest.fixture(scope="module")
def bundle():
    """databricks.yml with every resources file it includes merged in, plus where each resource came from."""
    root = yaml.safe_load(BUNDLE_FILE.read_text())
    resources = root.setdefault("resources", {})
    sources = {}
    for pattern in root.get("include", []):
        for path in sorted(glob.glob(str(ROOT / pattern))):
            loaded = yaml.safe_load(Path(path).read_text()) or {}
            for kind, defined in loaded.get("resources", {}).items():
                for key, resource in defined.items():
                    assert key not in sources, f"resource {key} is defined twice"
                    resources.setdefault(kind, {})[key], sources[key] = resource, Path(path)
    return {"config": root, "job_sources": sources}


@pytest.fixture(scope="module")
def typed_jobs(bundle):
    """{target: {job key: databricks.bundles.jobs.Job}}, with that target's variables resolved."""
    config = bundle["config"]
    typed = {}
    for target in config["targets"]:
        variables = target_variables(config, target)
        for key, job in config["resources"]["jobs"].items():
            try:
                typed.setdefault(target, {})[key] = Job.from_dict(resolve(job, variables))
            except (ValueError, TypeError) as exc:
                pytest.fail(f"target {target}, job {key} is not a valid Databricks job: {exc}")
    return typed


def typed_resources(config, kind, cls):
    """{target: {key: typed resource}}, with that target's variables resolved."""
    typed = {}
    for target in config["targets"]:
        variables = target_variables(config, target)
        for key, resource in config["resources"][kind].items():
            try:
                typed.setdefault(target, {})[key] = cls.from_dict(resolve(resource, variables))
            except (ValueError, TypeError) as exc:
                pytest.fail(f"target {target}, {kind} {key} is not valid: {exc}")
    return typed


@pytest.fixture(scope="module")
def typed_alerts(bundle):
    return typed_resources(bundle["config"], "alerts", Alert)


@pytest.fixture(scope="module")
def typed_dashboards(bundle):
    return typed_resources(bundle["config"], "dashboards", Dashboard)


@pytest.fixture(scope="module")
def setup_cfg():
    parser = configparser.ConfigParser()
    parser.read(ROOT / "setup.cfg")
    return parser


@pytest.fixture(scope="module")
def wheel_name(setup_cfg):
    """The file name `make dist` and the bundle artifact give the wheel."""
    return (f"{normalise(setup_cfg['metadata']['name']).replace('-', '_')}-"
            f"{setup_cfg['metadata']['version']}-py3-none-any.whl")


def bundle_files(bundle_config):
    files = [BUNDLE_FILE, ROOT / "conf" / "databricks.yaml"]
    for pattern in bundle_config.get("include", []):
        files += [Path(p) for p in sorted(glob.glob(str(ROOT / pattern)))]
    return files


def target_variables(bundle_config, target):
    values = {name: STUB_LOOKUP_ID if "lookup" in spec else spec.get("default")
              for name, spec in bundle_config.get("variables", {}).items()}
    values.update(bundle_config["targets"][target].get("variables") or {})
    return values


def resolve(value, variables):
    """Substitute ${var.x}; a string that is exactly one reference takes the variable's value and type."""
    if isinstance(value, dict):
        return {k: resolve(v, variables) for k, v in value.items()}
    if isinstance(value, list):
        return [resolve(v, variables) for v in value]
    if isinstance(value, str):
        whole = VAR_REF.fullmatch(value)
        if whole:
            return variables[whole.group(1)]
        return VAR_REF.sub(lambda m: str(variables[m.group(1)]), value)
    return value


def without_empty(value):
    """``value`` without the empty lists and mappings in it, nor those only they fill."""
    if isinstance(value, dict):
        value = {k: without_empty(v) for k, v in value.items()}
        return {k: v for k, v in value.items() if v not in ([], {})}
    if isinstance(value, list):
        return [without_empty(v) for v in value]
    return value


TARGETS = ("dev", "dev_dbr17", "dev_dbr18", "prod")
JOBS = (AVAILABLE_NOW_JOB, CONTINUOUS_JOB, MAINTENANCE_JOB)


def in_every_target(typed, keys):
    """``typed``'s targets, once it is checked to hold ``keys`` in each of ``TARGETS``: the checks then loop
    over them, and a loop over nothing (an empty bundle, a target that lost its resources) proves nothing."""
    assert {target: sorted(resources) for target, resources in typed.items()} == {
        target: sorted(keys) for target in TARGETS}
    return typed.items()


def the_task(job):
    assert len(job.tasks) == 1, "each syphon job runs exactly one task"
    return job.tasks[0]


def assert_is_the_wheel(path, declared_in, wheel_name):
    """A local library path (relative to the file declaring it) must hit the wheel the artifact builds."""
    where = (declared_in.parent / path).resolve()
    assert where.parent == ROOT / "dist" and fnmatch.fnmatch(wheel_name, where.name), \
        f"{path} (in {declared_in.name}) is not the wheel dist/{wheel_name}"


def console_scripts(setup_cfg):
    scripts = {}
    for line in setup_cfg["options.entry_points"]["console_scripts"].strip().splitlines():
        name, _, target = line.partition("=")
        scripts[name.strip()] = target.strip()
    return scripts


def effective_config(task, secret_calls):
    """Parse the typed task's parameters as the entry point will and load the config they name."""
    args = build_parser().parse_args(task.python_wheel_task.parameters)
    assert args.config.startswith(FILES_ROOT), f"--config {args.config} is not a file the bundle syncs"
    path = ROOT / args.config[len(FILES_ROOT):]
    assert path.is_file(), f"--config names {path.relative_to(ROOT)}, which is not in the repository"
    overrides = parse_overrides(args.set)
    assert not [k for k in overrides if "connection_string" in k], \
        "connection strings must come from the secret scope, never from --set (which makes them literals)"

    def stub_reader(scope, key):
        secret_calls.append((scope, key))
        return STUB_CONNECTION_STRING

    return load_config(path, overrides=overrides, environ={}, secret_reader=stub_reader)


# --- targets, artifact, variables ---------------------------------------------------------------

def test_targets_dev_is_the_default_development_target_and_prod_is_production(bundle):
    config = bundle["config"]
    assert config["bundle"]["name"]
    targets = config["targets"]
    assert {"dev", "prod"} <= set(targets)
    assert targets["dev"]["mode"] == "development"
    assert targets["dev"].get("default") is True
    assert [name for name, t in targets.items() if t.get("default")] == ["dev"], "exactly one default target"
    assert targets["prod"]["mode"] == "production"
    assert targets["prod"]["workspace"]["root_path"], "production mode needs an explicit root_path"
    for where in [config.get("workspace") or {}] + [t.get("workspace") or {} for t in targets.values()]:
        assert "host" not in where, "the workspace host comes from the CLI profile, not from the bundle"


def test_the_defaults_are_the_current_runtimes_and_the_older_ones_have_their_targets(bundle, typed_jobs):
    """Runtime 19 (Spark 4.2, JDK 21) and serverless environment 5 by default; 17.3 LTS and 18 as targets."""
    config = bundle["config"]
    runtimes = {}
    for target in in_every_target(typed_jobs, JOBS):
        name, jobs = target
        [cluster] = [c.new_cluster for c in jobs[CONTINUOUS_JOB].job_clusters]
        [environment] = jobs[AVAILABLE_NOW_JOB].environments
        runtimes[name] = (cluster.spark_version, environment.spec.environment_version)
    assert runtimes == {"dev": ("19.0.x-scala2.13", "5"), "prod": ("19.0.x-scala2.13", "5"),
                        "dev_dbr17": ("17.3.x-scala2.13", "4"), "dev_dbr18": ("18.0.x-scala2.13", "5")}
    for name in ("dev_dbr17", "dev_dbr18"):  # like dev: development mode, the dev tables
        target = config["targets"][name]
        assert (target["mode"], target["variables"]["schema"]) == ("development", "backlog_syphon_dev")
    # The conventions of Databricks' own templates: a pinned CLI, a wheel version stamped at each deploy.
    assert re.fullmatch(r">= 0\.\d+\.\d+, < 1\.0\.0", config["bundle"]["databricks_cli_version"])
    assert config["presets"] == {"artifacts_dynamic_version": True}


def test_the_wheel_artifact_is_built_from_the_repository_into_dist(bundle):
    wheels = [a for a in bundle["config"].get("artifacts", {}).values() if a.get("type") == "whl"]
    assert len(wheels) == 1, "one python wheel artifact"
    artifact = wheels[0]
    assert (ROOT / artifact["path"]).resolve() == ROOT and (ROOT / "setup.cfg").is_file()
    build = artifact["build"]
    assert ("wheel" in build and "dist" in build.split()) or "--wheel" in build, "the wheel must land in dist/"


def test_every_variable_referenced_is_declared_and_every_declared_one_is_used(bundle):
    config = bundle["config"]
    declared = set(config.get("variables", {}))
    used = set()
    for path in bundle_files(config):
        text = path.read_text()
        for ref in ANY_REF.findall(text):
            if ref.startswith("var."):
                name = ref[len("var."):]
                assert name in declared, f"{path.name}: ${{var.{name}}} is not declared in databricks.yml"
                used.add(name)
            else:
                assert ref in BUILTIN_REFS, f"{path.name}: unknown reference ${{{ref}}}"
    assert declared - used == set(), "declared but never used"
    assert {"secret_scope", "catalog", "schema", "checkpoint_volume", "warehouse_id"} <= used
    for name, target in config["targets"].items():
        overridden = set(target.get("variables") or {})
        assert overridden <= declared, f"target {name} sets undeclared variables {overridden - declared}"


# --- the job definitions, as typed databricks-bundles objects ------------------------------------

def test_every_job_definition_loads_as_a_typed_job_in_every_target(bundle, typed_jobs):
    for target, jobs in in_every_target(typed_jobs, JOBS):
        for key, job in jobs.items():
            assert isinstance(job, Job) and job.name, f"{target}/{key}"
            # Round trip: nothing in the YAML was dropped or reshaped on the way in (but empty lists, such
            # as the notification variables' defaults, which mean nothing).
            yaml_job = resolve(bundle["config"]["resources"]["jobs"][key], target_variables(bundle["config"], target))
            assert job.as_dict() == without_empty(yaml_job), f"{target}/{key}"


@pytest.mark.parametrize("misspell, error", [
    (lambda job: job.update(max_concurent_runs=1), r"Unexpected field 'max_concurent_runs' for class Job"),
    (lambda job: job["tasks"][0].update(enviroment_key="syphon"), r"Unexpected field 'enviroment_key' for class Task"),
    (lambda job: job["tasks"][0]["python_wheel_task"].update(paramters=[]),
     r"Unexpected field 'paramters' for class PythonWheelTask"),
    (lambda job: job["environments"][0]["spec"].update(dependancies=[]),
     r"Unexpected field 'dependancies' for class Environment"),
    (lambda job: job["schedule"].update(pause_status="STOPPED"), r"'STOPPED' is not a valid PauseStatus"),
    (lambda job: job["tasks"][0].pop("task_key"), r"missing 1 required keyword-only argument: 'task_key'"),
], ids=["job field", "task field", "wheel task field", "environment field", "enum value", "required field"])
def test_the_typed_validation_rejects_a_misspelt_job(bundle, misspell, error):
    # The available_now job has every part the mutations touch; it loads as it is.
    job = resolve(bundle["config"]["resources"]["jobs"][AVAILABLE_NOW_JOB], target_variables(bundle["config"], "dev"))
    Job.from_dict(copy.deepcopy(job))
    misspell(job)
    with pytest.raises((ValueError, TypeError), match=error):
        Job.from_dict(job)


def test_both_jobs_never_run_twice_at_once(typed_jobs):
    for target, jobs in in_every_target(typed_jobs, JOBS):
        for key, job in jobs.items():
            assert job.max_concurrent_runs == 1, f"{target}/{key}: a job must not overlap itself"


def test_the_jobs_report_their_failures_and_the_scheduled_one_its_long_runs(bundle, typed_jobs):
    variables = bundle["config"]["variables"]
    for target, jobs in in_every_target(typed_jobs, JOBS):
        for key, job in jobs.items():
            # Notified to the destinations of the bundle's variables (empty by default: nobody is written to
            # until someone says where).
            assert job.email_notifications.on_failure == variables["notification_emails"]["default"] == []
            assert job.webhook_notifications.on_failure == variables["notification_webhooks"]["default"] == []
            source = yaml.safe_load(bundle["job_sources"][key].read_text())["resources"]["jobs"][key]
            assert source["email_notifications"]["on_failure"] == "${var.notification_emails}", key
            assert source["webhook_notifications"]["on_failure"] == "${var.notification_webhooks}", key
        scheduled, continuous = jobs[AVAILABLE_NOW_JOB], jobs[CONTINUOUS_JOB]
        [rule] = scheduled.health.rules
        assert rule.metric == JobsHealthMetric.RUN_DURATION_SECONDS
        assert 0 < rule.value < scheduled.timeout_seconds, f"{target}: the warning must come before the timeout"
        assert scheduled.email_notifications.on_duration_warning_threshold_exceeded == []
        # A continuous run is meant to last: no timeout (0), no duration rule.
        assert continuous.timeout_seconds == 0 and continuous.health is None, target


def test_every_task_passes_the_job_and_job_run_ids_to_the_syphon(typed_jobs):
    in_every_target(typed_jobs, JOBS)
    for key, job in typed_jobs["dev"].items():
        args = build_parser().parse_args(the_task(job).python_wheel_task.parameters)
        assert (args.job_id, args.job_run_id) == ("{{job.id}}", "{{job.run_id}}"), key
        assert args.log_format == "text", key


# --- the alerts and the dashboard ----------------------------------------------------------------

def test_each_alert_fires_on_rows_of_its_query_on_a_warehouse_and_names_only_the_syphons_tables(
        bundle, typed_alerts):
    config = bundle["config"]
    for target, alerts in in_every_target(typed_alerts, ("backlog_syphon_stalled", "backlog_syphon_dead_letters",
                                                         "backlog_syphon_last_run")):
        variables = target_variables(config, target)
        for key, alert in alerts.items():
            assert alert.warehouse_id == STUB_LOOKUP_ID, f"{key}: the warehouse comes from var.warehouse_id"
            evaluation = alert.evaluation
            # Its query returns rows only in the bad state: any row (a count above 0) fires, none is OK.
            assert (evaluation.comparison_operator, evaluation.threshold.value.double_value) == (
                ComparisonOperator.GREATER_THAN, 0), key
            assert evaluation.empty_result_state == AlertEvaluationState.OK, key
            assert isinstance(evaluation.source.aggregation, Aggregation), key
            assert evaluation.source.name in alert.query_text, f"{key}: {evaluation.source.name} is not selected"
            assert alert.schedule.pause_status == SchedulePauseStatus(variables["alerts_pause_status"]), key
            prefix = f"{variables['catalog']}.{variables['schema']}."
            named = set(re.findall(r"(?:FROM|JOIN)\s+([\w.]+)", alert.query_text))
            assert named and named <= {prefix + table for table in TABLES}, f"{key} reads {named}"
        assert (target == "prod") == (
            alerts["backlog_syphon_stalled"].schedule.pause_status == SchedulePauseStatus.UNPAUSED)


def test_the_typed_validation_rejects_a_misspelt_alert(bundle):
    alert = resolve(bundle["config"]["resources"]["alerts"]["backlog_syphon_last_run"],
                    target_variables(bundle["config"], "dev"))
    Alert.from_dict(copy.deepcopy(alert))
    alert["evaluation"]["comparision_operator"] = "GREATER_THAN"
    with pytest.raises((ValueError, TypeError), match="Unexpected field 'comparision_operator'"):
        Alert.from_dict(alert)


def test_the_dashboard_file_has_a_dataset_for_every_widget_on_the_syphons_tables(bundle, typed_dashboards):
    declared_in = bundle["job_sources"]["backlog_syphon"]
    for target, dashboards in in_every_target(typed_dashboards, ["backlog_syphon"]):
        dashboard = dashboards["backlog_syphon"]
        variables = target_variables(bundle["config"], target)
        # Its queries name tables without catalog and schema: the dashboard's dataset defaults supply them.
        assert (dashboard.dataset_catalog, dashboard.dataset_schema) == (variables["catalog"], variables["schema"])
        assert dashboard.warehouse_id == STUB_LOOKUP_ID
    path = (declared_in.parent / dashboard.file_path).resolve()
    assert path.name.endswith(".lvdash.json") and path.is_file(), path
    content = json.loads(path.read_text())
    datasets = {dataset["name"]: "".join(dataset["queryLines"]) for dataset in content["datasets"]}
    assert set(datasets) == {"moved", "oldest_age", "remaining", "dead_letter_reasons", "runs", "progress"}
    for name, sql in datasets.items():
        named = set(re.findall(r"(?:FROM|JOIN)\s+([\w.]+)", sql))
        assert named and named <= set(TABLES), f"{name} reads {named}"
    widgets = [item["widget"] for page in content["pages"] for item in page["layout"]]
    assert len(widgets) >= len(datasets), "a widget for every dataset at least"
    for widget in widgets:
        for query in widget["queries"]:
            assert query["query"]["datasetName"] in datasets, widget["name"]
        fields = {field["name"] for query in widget["queries"] for field in query["query"]["fields"]}
        encodings = widget["spec"]["encodings"]
        used = [e["fieldName"] for e in encodings.get("columns", [])] + [
            e["fieldName"] for name, e in encodings.items() if name != "columns"]
        assert set(used) <= fields, f"{widget['name']} shows fields its query does not ask for"
    assert {query["query"]["datasetName"] for widget in widgets for query in widget["queries"]} == set(datasets)


def test_one_job_is_scheduled_and_the_other_continuous(typed_jobs):
    for target, jobs in in_every_target(typed_jobs, JOBS):
        scheduled, continuous = jobs[AVAILABLE_NOW_JOB], jobs[CONTINUOUS_JOB]
        assert scheduled.continuous is None and scheduled.trigger is None and not scheduled.triggers
        assert continuous.schedule is None and continuous.trigger is None and not continuous.triggers
        fields = scheduled.schedule.quartz_cron_expression.split()
        assert len(fields) in (6, 7), f"not a Quartz cron expression: {scheduled.schedule.quartz_cron_expression}"
        assert (fields[3] == "?") != (fields[5] == "?"), "Quartz needs '?' in exactly one of day-of-month/-week"
        assert scheduled.schedule.timezone_id
        pauses = {"schedule": scheduled.schedule.pause_status, "continuous": continuous.continuous.pause_status}
        assert all(isinstance(p, PauseStatus) for p in pauses.values()), pauses
        # Both jobs drive the same checkpoint and tables: at most one may be live, or the lease
        # turns every run of the other into an exit code 3.
        assert list(pauses.values()).count(PauseStatus.UNPAUSED) <= 1, f"target {target}: {pauses}"
        if target == "dev":
            assert set(pauses.values()) == {PauseStatus.PAUSED}, pauses


def test_every_task_runs_the_console_script_of_the_wheel(typed_jobs, setup_cfg):
    distribution = setup_cfg["metadata"]["name"]
    scripts = console_scripts(setup_cfg)
    assert scripts == {"backlog-syphon": "backlog_syphon.cli:run"}
    in_every_target(typed_jobs, JOBS)
    for key, job in typed_jobs["dev"].items():
        task = the_task(job)
        kinds = [kind for kind in TASK_KINDS if getattr(task, kind) is not None]
        assert kinds == ["python_wheel_task"], f"{key}: expected only a python_wheel_task, got {kinds}"
        wheel_task = task.python_wheel_task
        assert normalise(wheel_task.package_name) == normalise(distribution), \
            f"{key}: package_name {wheel_task.package_name} is not the distribution {distribution}"
        assert wheel_task.entry_point in scripts, \
            f"{key}: {wheel_task.entry_point} is not a console_scripts entry in setup.cfg"
        module, _, attribute = scripts[wheel_task.entry_point].partition(":")
        assert callable(getattr(importlib.import_module(module), attribute)), scripts[wheel_task.entry_point]


def test_the_available_now_job_runs_on_serverless_with_the_wheel_in_its_environment(bundle, typed_jobs, wheel_name):
    declared_in = bundle["job_sources"][AVAILABLE_NOW_JOB]
    for target, jobs in in_every_target(typed_jobs, JOBS):
        job = jobs[AVAILABLE_NOW_JOB]
        task = the_task(job)
        assert job.job_clusters == [], f"{target}: serverless jobs declare no cluster"
        assert (task.job_cluster_key, task.new_cluster, task.existing_cluster_id) == (None, None, None), target
        assert task.libraries == [], "serverless tasks take their libraries from the job's environment"
        environments = {env.environment_key: env for env in job.environments}
        assert len(environments) == len(job.environments), "environment keys must be unique"
        assert task.environment_key in environments, \
            f"{target}: the task's environment_key {task.environment_key!r} names no environment of the job"
        spec = environments[task.environment_key].spec
        assert spec.client is None, "`client` is deprecated: use environment_version"
        assert spec.environment_version.isdigit(), spec.environment_version
        assert int(spec.environment_version) >= MIN_SERVERLESS_ENVIRONMENT_VERSION, spec.environment_version
        wheels = [dep for dep in spec.dependencies if dep.endswith(".whl")]
        assert len(wheels) == 1, f"{target}: the environment must install the wheel once: {spec.dependencies}"
        assert_is_the_wheel(wheels[0], declared_in, wheel_name)
        # The runtime brings Spark and Delta: no Delta JARs, no pyspark.
        assert spec.java_dependencies == [], spec.java_dependencies
        assert not [dep for dep in spec.dependencies if re.match(r"(py)?spark|delta", dep)], spec.dependencies


def test_the_continuous_job_runs_on_a_spark_4_job_cluster_with_the_wheel_as_a_library(
        bundle, typed_jobs, wheel_name):
    declared_in = bundle["job_sources"][CONTINUOUS_JOB]
    for target, jobs in in_every_target(typed_jobs, JOBS):
        job = jobs[CONTINUOUS_JOB]
        task = the_task(job)
        assert task.environment_key is None and job.environments == [], "a job cluster installs task libraries"
        clusters = {c.job_cluster_key: c.new_cluster for c in job.job_clusters}
        assert task.job_cluster_key in clusters, f"{target}: the task names no job cluster of the job"
        cluster = clusters[task.job_cluster_key]
        runtime = re.match(r"(\d+)\.(\d+|x)\.", cluster.spark_version)
        assert runtime and int(runtime.group(1)) >= 17, f"{target}: Spark 4 needs Databricks Runtime 17+"
        assert cluster.data_security_mode in UNITY_CATALOG_ACCESS_MODES, cluster.data_security_mode
        assert cluster.node_type_id and isinstance(cluster.num_workers, int) and cluster.num_workers >= 1
        wheels = [lib.whl for lib in task.libraries if lib.whl]
        assert len(wheels) == 1, f"{target}: the wheel must be a library of the task once: {task.libraries}"
        assert_is_the_wheel(wheels[0], declared_in, wheel_name)


# --- the configuration the jobs load ------------------------------------------------------------

def test_each_job_loads_conf_databricks_with_secret_scope_references(bundle, typed_jobs):
    config = bundle["config"]
    storage = {}
    for target, jobs in in_every_target(typed_jobs, JOBS):
        scope = target_variables(config, target)["secret_scope"]
        loaded = {}
        for key, job in jobs.items():
            calls = []
            loaded[key] = effective_config(the_task(job), calls)
            assert sorted(calls) == [(scope, "primary-connection-string"), (scope, "secondary-connection-string")]
            for name in ("primary", "secondary"):
                assert getattr(loaded[key], name).connection_string.source.startswith(f"secret {scope}/")
        available_now, continuous = loaded[AVAILABLE_NOW_JOB], loaded[CONTINUOUS_JOB]
        assert trigger_options(available_now.run.trigger) == {"availableNow": True}
        assert set(trigger_options(continuous.run.trigger)) == {"processingTime"}
        # Same syphon, same tables and checkpoint (so one lease): only the trigger differs.
        same_trigger = dataclasses.replace(continuous.run, trigger=available_now.run.trigger)
        assert dataclasses.replace(continuous, run=same_trigger) == available_now
        assert available_now.storage.checkpoint_location.startswith("/Volumes/")
        storage[target] = available_now.storage
    assert storage["dev"].checkpoint_location != storage["prod"].checkpoint_location
    assert storage["dev"].audit_table != storage["prod"].audit_table
    assert storage["dev"].checkpoint_table != storage["prod"].checkpoint_table


def test_conf_databricks_names_the_bundle_secret_scope(bundle):
    raw = yaml.safe_load((ROOT / "conf" / "databricks.yaml").read_text())
    scope = bundle["config"]["variables"]["secret_scope"]["default"]
    for name in ("primary", "secondary"):
        reference = raw[name]["connection_string"]
        assert isinstance(reference, dict) and set(reference) == {"secret"}, f"{name}: not a secret reference"
        assert reference["secret"].split("/")[0] == scope, f"{name}: scope differs from var.secret_scope"
    # The file loads on its own too (e.g. from a notebook), without the jobs' overrides.
    load_config(ROOT / "conf" / "databricks.yaml", environ={}, secret_reader=lambda s, k: STUB_CONNECTION_STRING)


def test_no_connection_string_is_written_in_any_bundle_file(bundle):
    files = bundle_files(bundle["config"])
    assert {path.relative_to(ROOT).as_posix() for path in files} >= {
        "databricks.yml", "conf/databricks.yaml", "resources/backlog_syphon_jobs.yml",
        "resources/backlog_syphon_monitoring.yml"}
    for path in files:
        text = path.read_text().lower()
        for marker in ("sharedaccesskey=", "sharedaccesssignature", "endpoint=sb://", "sb://"):
            assert marker not in text, f"{path.relative_to(ROOT)} contains '{marker}'"


def test_the_config_file_is_synced_to_the_workspace(bundle):
    relative = "conf/databricks.yaml"
    for pattern in (bundle["config"].get("sync") or {}).get("exclude", []):
        assert not fnmatch.fnmatch(relative, pattern), f"sync.exclude {pattern} drops {relative}"
    # Bundle sync honours .gitignore; the repository is a git checkout wherever the bundle is deployed from.
    assert shutil.which("git") and (ROOT / ".git").exists(), "run the tests from a git checkout"
    ignored = subprocess.run(["git", "check-ignore", "-q", relative], cwd=ROOT).returncode
    assert ignored == 1, f"{relative} is git-ignored, so the bundle would not sync it"


def test_the_maintenance_job_maintains_the_same_tables_daily_without_a_lease(typed_jobs):
    for target, jobs in in_every_target(typed_jobs, JOBS):
        maintenance, scheduled = jobs[MAINTENANCE_JOB], jobs[AVAILABLE_NOW_JOB]
        args = build_parser().parse_args(the_task(maintenance).python_wheel_task.parameters)
        syphon = build_parser().parse_args(the_task(scheduled).python_wheel_task.parameters)
        assert args.maintain and not (args.status or args.dry_run), target
        assert args.set == syphon.set and args.config == syphon.config, f"{target}: other tables than the syphon's"
        fields = maintenance.schedule.quartz_cron_expression.split()
        assert len(fields) in (6, 7) and "*" not in fields[:3], f"{target}: not once a day: {fields}"
        assert maintenance.continuous is None and maintenance.max_concurrent_runs == 1
        assert maintenance.schedule.pause_status == (PauseStatus.UNPAUSED if target == "prod" else PauseStatus.PAUSED)
