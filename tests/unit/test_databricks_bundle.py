"""The Databricks Asset Bundle (databricks.yml, resources/*.yml, conf/databricks.yaml), checked offline.

No workspace, no Databricks CLI, no Spark: the bundle's YAML is read with pyyaml, its ``${var.*}``
references are resolved per target the way the CLI does for plain variables, and each job's task
parameters go through the real argument parser and ``load_config`` with a stub secret reader.
"""

import configparser
import dataclasses
import fnmatch
import glob
import importlib
import re
import shutil
import subprocess
from pathlib import Path

import pytest
import yaml

from backlog_syphon.cli import build_parser
from backlog_syphon.config import load_config, parse_overrides, trigger_options

ROOT = Path(__file__).resolve().parents[2]
BUNDLE_FILE = ROOT / "databricks.yml"
AVAILABLE_NOW_JOB = "backlog_syphon_available_now"
CONTINUOUS_JOB = "backlog_syphon_continuous"
FILES_ROOT = "${workspace.file_path}/"  # where the bundle syncs the repository's files
# Substitutions the CLI provides itself; anything else in ${...} must be a declared variable.
BUILTIN_REFS = {"workspace.file_path", "workspace.current_user.userName", "workspace.current_user.short_name",
                "bundle.name", "bundle.target", "workspace.root_path", "workspace.artifact_path"}
VAR_REF = re.compile(r"\$\{var\.([A-Za-z0-9_-]+)\}")
ANY_REF = re.compile(r"\$\{([^}]+)\}")
# Shape-valid for config._check_connection_string; never a real namespace.
STUB_CONNECTION_STRING = "Endpoint=sb://stub/;SharedAccessKeyName=stub;SharedAccessKey=stub"


def normalise(name):
    """PEP 503 name normalisation, as importlib.metadata applies it to distribution names."""
    return re.sub(r"[-_.]+", "-", name).lower()


@pytest.fixture(scope="module")
def bundle():
    """databricks.yml with every resources file it includes merged in, plus where each job came from."""
    root = yaml.safe_load(BUNDLE_FILE.read_text())
    jobs, sources = {}, {}
    for pattern in root.get("include", []):
        for path in sorted(glob.glob(str(ROOT / pattern))):
            loaded = yaml.safe_load(Path(path).read_text()) or {}
            for key, job in loaded.get("resources", {}).get("jobs", {}).items():
                assert key not in jobs, f"job {key} is defined twice"
                jobs[key], sources[key] = job, Path(path)
    root.setdefault("resources", {}).setdefault("jobs", {}).update(jobs)
    return {"config": root, "job_sources": sources}


@pytest.fixture(scope="module")
def setup_cfg():
    parser = configparser.ConfigParser()
    parser.read(ROOT / "setup.cfg")
    return parser


def bundle_files(bundle_config):
    files = [BUNDLE_FILE, ROOT / "conf" / "databricks.yaml"]
    for pattern in bundle_config.get("include", []):
        files += [Path(p) for p in sorted(glob.glob(str(ROOT / pattern)))]
    return files


def target_variables(bundle_config, target):
    values = {name: spec.get("default") for name, spec in bundle_config.get("variables", {}).items()}
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


def the_task(job):
    assert len(job["tasks"]) == 1, "each syphon job runs exactly one task"
    return job["tasks"][0]


def console_scripts(setup_cfg):
    scripts = {}
    for line in setup_cfg["options.entry_points"]["console_scripts"].strip().splitlines():
        name, _, target = line.partition("=")
        scripts[name.strip()] = target.strip()
    return scripts


def effective_config(task, variables, secret_calls):
    """Parse the task's parameters as the entry point will and load the config it names."""
    params = resolve(task["python_wheel_task"]["parameters"], variables)
    args = build_parser().parse_args(params)
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


def test_the_wheel_artifact_is_built_from_the_repository_and_attached_to_every_task(bundle, setup_cfg):
    config = bundle["config"]
    wheels = [a for a in config.get("artifacts", {}).values() if a.get("type") == "whl"]
    assert len(wheels) == 1, "one python wheel artifact"
    artifact = wheels[0]
    assert (ROOT / artifact["path"]).resolve() == ROOT and (ROOT / "setup.cfg").is_file()
    build = artifact["build"]
    assert ("wheel" in build and "dist" in build.split()) or "--wheel" in build, "the wheel must land in dist/"
    wheel_name = (f"{normalise(setup_cfg['metadata']['name']).replace('-', '_')}-"
                  f"{setup_cfg['metadata']['version']}-py3-none-any.whl")
    for key, job in config["resources"]["jobs"].items():
        libraries = the_task(job).get("libraries", [])
        assert [lib for lib in libraries if "whl" in lib], f"{key}: the wheel is not a library of the task"
        for lib in libraries:
            # Library paths are relative to the file that declares them; they must hit the build output.
            where = (bundle["job_sources"][key].parent / lib["whl"]).resolve()
            assert where.parent == ROOT / "dist" and fnmatch.fnmatch(wheel_name, where.name), lib


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
    for name, target in config["targets"].items():
        overridden = set(target.get("variables") or {})
        assert overridden <= declared, f"target {name} sets undeclared variables {overridden - declared}"


# --- the two jobs -------------------------------------------------------------------------------

def test_both_jobs_exist_and_never_run_twice_at_once(bundle):
    jobs = bundle["config"]["resources"]["jobs"]
    assert set(jobs) == {AVAILABLE_NOW_JOB, CONTINUOUS_JOB}
    for key, job in jobs.items():
        assert job.get("max_concurrent_runs") == 1, f"{key}: two runs on one checkpoint would race"


def test_one_job_is_scheduled_and_the_other_continuous(bundle):
    config = bundle["config"]
    scheduled, continuous = (config["resources"]["jobs"][k] for k in (AVAILABLE_NOW_JOB, CONTINUOUS_JOB))
    assert "continuous" not in scheduled and "trigger" not in scheduled
    assert "schedule" not in continuous and "trigger" not in continuous
    for target in config["targets"]:
        variables = target_variables(config, target)
        schedule = resolve(scheduled["schedule"], variables)
        fields = schedule["quartz_cron_expression"].split()
        assert len(fields) in (6, 7), f"not a Quartz cron expression: {schedule['quartz_cron_expression']}"
        assert (fields[3] == "?") != (fields[5] == "?"), "Quartz needs '?' in exactly one of day-of-month/-week"
        assert schedule.get("timezone_id")
        pauses = {"schedule": schedule["pause_status"],
                  "continuous": resolve(continuous["continuous"], variables)["pause_status"]}
        assert set(pauses.values()) <= {"PAUSED", "UNPAUSED"}, pauses
        # Both jobs drive the same checkpoint and tables, so at most one may be live.
        assert list(pauses.values()).count("UNPAUSED") <= 1, f"target {target}: {pauses}"
        if target == "dev":
            assert pauses == {"schedule": "PAUSED", "continuous": "PAUSED"}, pauses


def test_every_task_runs_the_console_script_of_the_wheel(bundle, setup_cfg):
    distribution = setup_cfg["metadata"]["name"]
    scripts = console_scripts(setup_cfg)
    for key, job in bundle["config"]["resources"]["jobs"].items():
        task = the_task(job)
        other_kinds = [k for k in task if k.endswith("_task") and k != "python_wheel_task"]
        assert "python_wheel_task" in task and not other_kinds, f"{key}: expected only a python_wheel_task"
        wheel_task = task["python_wheel_task"]
        assert normalise(wheel_task["package_name"]) == normalise(distribution), \
            f"{key}: package_name {wheel_task['package_name']} is not the distribution {distribution}"
        entry_point = wheel_task["entry_point"]
        assert entry_point in scripts, f"{key}: {entry_point} is not a console_scripts entry in setup.cfg"
        module, _, attribute = scripts[entry_point].partition(":")
        assert callable(getattr(importlib.import_module(module), attribute)), scripts[entry_point]


def test_tasks_run_on_a_dedicated_spark_4_job_cluster(bundle):
    config = bundle["config"]
    for target in config["targets"]:
        variables = target_variables(config, target)
        for key, job in config["resources"]["jobs"].items():
            clusters = {c["job_cluster_key"]: resolve(c["new_cluster"], variables) for c in job["job_clusters"]}
            cluster = clusters[the_task(job)["job_cluster_key"]]
            runtime = re.match(r"(\d+)\.(\d+|x)\.", cluster["spark_version"])
            assert runtime and int(runtime.group(1)) >= 17, f"{key}: Spark 4 needs Databricks Runtime 17+"
            # The sink uses the RDD API, which standard (shared) access mode does not offer.
            assert cluster["data_security_mode"] in ("SINGLE_USER", "DATA_SECURITY_MODE_DEDICATED"), key
            assert cluster["node_type_id"] and isinstance(cluster["num_workers"], int)


# --- the configuration the jobs load ------------------------------------------------------------

def test_each_job_loads_conf_databricks_with_secret_scope_references(bundle):
    config = bundle["config"]
    jobs = config["resources"]["jobs"]
    storage = {}
    for target in config["targets"]:
        variables = target_variables(config, target)
        loaded = {}
        for key in (AVAILABLE_NOW_JOB, CONTINUOUS_JOB):
            calls = []
            loaded[key] = effective_config(the_task(jobs[key]), variables, calls)
            scope = variables["secret_scope"]
            assert sorted(calls) == [(scope, "primary-connection-string"), (scope, "secondary-connection-string")]
            for name in ("primary", "secondary"):
                assert getattr(loaded[key], name).connection_string.source.startswith(f"secret {scope}/")
        available_now, continuous = loaded[AVAILABLE_NOW_JOB], loaded[CONTINUOUS_JOB]
        assert trigger_options(available_now.run.trigger) == {"availableNow": True}
        assert set(trigger_options(continuous.run.trigger)) == {"processingTime"}
        # Same syphon, same tables and checkpoint: only the trigger differs.
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
    for path in bundle_files(bundle["config"]):
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
