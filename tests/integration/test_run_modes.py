"""The run modes users have, against the emulator with real Delta: the spark-submit line of
docs/running/spark-submit.md (run exactly as it shows it), the walkthrough of docs/running/local.md,
and the replay notebook (dry run only, then dry run + replay)."""

from __future__ import annotations

import os
import re
import runpy
import subprocess
import time

import pytest

from backlog_syphon.local_setup.jvm_options import driver_java_options
from backlog_syphon.servicebus.peek import peek_counts
from tools import backlog_writer
from tools.testing import expected_arrivals, received_counts

from .conftest import PRIMARY, ROOT, SECONDARY

NOTEBOOK = ROOT / "notebooks/replay_backlog.py"
RUNNING_PAGES = ROOT / "docs/running"  # every way to run the syphon: the pages docs/running.md lists
# Speed only, for the JVMs the documented lines start (the java launcher reads JDK_JAVA_OPTIONS; the
# lines stay as they are): the session builder's driver options, its class archive included. The
# spark-submit launcher's own small JVM has another class path, where the archive does not apply:
# the JVM's note saying so is kept off the output.
JDK_JAVA_OPTIONS = f"{driver_java_options()} -Xlog:cds=off -Xlog:cds+dynamic=off"


def documented_block(page: str, marker: str) -> str:
    """The fenced bash block right after ``<!-- tested: marker -->`` in docs/running/<page>."""
    text = (RUNNING_PAGES / page).read_text()
    match = re.search(rf"<!-- tested: {re.escape(marker)} -->\n```bash\n(.*?)```", text, re.S)
    assert match, f"{page} has no block marked 'tested: {marker}'"
    return match.group(1)


def backlog_env(emulator, tmp_path) -> dict[str, str]:
    """What a user exports: the two connection strings; plus where this test keeps its tables."""
    return {
        "SYPHON_PRIMARY_CONNECTION_STRING": emulator.connection_string(PRIMARY),
        "SYPHON_SECONDARY_CONNECTION_STRING": emulator.connection_string(SECONDARY),
        "SYPHON__STORAGE__AUDIT_TABLE": str(tmp_path / "audit"),
        "SYPHON__STORAGE__CHECKPOINT_TABLE": str(tmp_path / "checkpoint"),
        "SYPHON__STORAGE__CHECKPOINT_LOCATION": str(tmp_path / "checkpoint-stream"),
        "SYPHON__RUN__MAX_MESSAGES_PER_TRIGGER": "100",  # a few micro-batches, so a few progress lines
    }


def write_realistic_backlog(config_env: dict[str, str], count: int, seed: int):
    from backlog_syphon.config import load_config

    config = load_config(ROOT / "conf/local.yaml", environ=config_env)
    originals = backlog_writer.realistic_backlog(count, seed=seed, body_size=200)
    written = backlog_writer.write_backlog(config.secondary, PRIMARY, originals, queue_count=10, seed=seed)
    return config, originals, written


def assert_all_arrived(emulator, originals) -> None:
    expected = expected_arrivals(originals)
    assert received_counts(emulator.connection_string(PRIMARY), sorted(expected)) == expected


def test_documented_spark_submit_line_drains_the_backlog(emulator, tmp_path):
    env = backlog_env(emulator, tmp_path)
    config, originals, written = write_realistic_backlog(env, 150, seed=11)
    # A user's shell: none of the Makefile's PYTHONPATH/PYSPARK_* exports, so the zip and the
    # documented --conf must be enough.
    shell_env = {k: v for k, v in os.environ.items()
                 if k not in ("PYTHONPATH", "PYSPARK_PYTHON", "PYSPARK_DRIVER_PYTHON", "SPARK_HOME")}
    shell_env.update(env)
    shell_env["JDK_JAVA_OPTIONS"] = JDK_JAVA_OPTIONS
    block = documented_block("spark-submit.md", "spark-submit-local")
    result = subprocess.run(["bash", "-euo", "pipefail", "-c", block], cwd=ROOT, env=shell_env,
                            capture_output=True, text=True, timeout=900)
    assert result.returncode == 0, f"exit {result.returncode}\n{result.stdout[-3000:]}\n{result.stderr[-5000:]}"

    # spark-submit runs a Python application with its stderr merged into stdout.
    output = result.stdout + result.stderr
    origin = [line for line in output.splitlines() if "backlog-syphon library from" in line]
    assert origin and "backlog_syphon_libs.zip" in origin[0], f"not the --py-files zip: {origin}"
    progress = [line for line in output.splitlines() if re.match(r"batch \d+: delivered \d+", line)]
    assert len(progress) >= 2, output[-3000:]
    assert sum(int(re.search(r"delivered (\d+)", line).group(1)) for line in progress) == len(originals)
    assert re.search(r"remaining 0$", progress[-1])
    assert re.search(r"^run \S+", output, re.M)
    assert "(nothing moved)" not in output
    assert len(output.splitlines()) < 400, "Spark's INFO logging buries the progress lines"
    assert peek_counts(config.secondary, written) == {queue: 0 for queue in written}
    assert_all_arrived(emulator, originals)


@pytest.fixture
def notebook_env(emulator, tmp_path, monkeypatch):
    for name, value in backlog_env(emulator, tmp_path).items():
        monkeypatch.setenv(name, value)
    monkeypatch.chdir(ROOT / "notebooks")  # where Databricks runs a notebook from: the config is found from there
    return backlog_env(emulator, tmp_path)


def test_notebook_stops_after_the_dry_run_by_default(emulator, notebook_env, spark, capsys):
    config, originals, written = write_realistic_backlog(notebook_env, 60, seed=12)

    with pytest.raises(SystemExit) as stopped:
        runpy.run_path(str(NOTEBOOK), run_name="__main__")

    assert stopped.value.code == 0
    out = capsys.readouterr().out
    # The status first: what waits, and that no run has recorded anything yet.
    assert out.index(f"verdict: {len(originals)} waiting, last progress never") < out.index("dry run:")
    assert "dry run: nothing was sent, settled or written" in out
    assert f"backlog queues: {len(originals)} messages" in out
    assert "dry run only: set the 'replay' widget to 'yes'" in out
    assert "delivered" not in out.split("dry run only")[1]
    assert peek_counts(config.secondary, written) == written, "the dry run changed the backlog"


def test_notebook_replays_with_progress_summary_report_and_charts(emulator, notebook_env, spark, capsys,
                                                                   monkeypatch):
    config, originals, written = write_realistic_backlog(notebook_env, 150, seed=13)
    monkeypatch.setenv("SYPHON_WIDGET_REPLAY", "yes")
    monkeypatch.setenv("SYPHON_WIDGET_TTL_POLICY", "restart")  # a widget reaches the configuration

    namespace = runpy.run_path(str(NOTEBOOK), run_name="__main__")

    out = capsys.readouterr().out
    assert namespace["config"].restore.ttl_policy == "restart"
    summary = namespace["summary"]
    assert summary.drained
    assert sum(sum(counts.values()) for counts in summary.per_destination.values()) == len(originals)
    progress = [line for line in out.splitlines() if re.match(r"batch \d+: delivered \d+", line)]
    assert len(progress) >= 2 and "remaining 0" in progress[-1]
    assert out.index("dry run:") < out.index(progress[0]) < out.index(f"run {summary.run_id}")
    audit_rows = {row["destination"]: row["delivered"] for row in namespace["reports"].audit_summary(
        namespace["audit"], run_id=summary.run_id).collect()}
    assert audit_rows == {destination: counts["delivered"] for destination, counts in summary.per_destination.items()}
    assert "messages moved per 10 seconds" in out and "backlog remaining after each micro-batch" in out
    assert re.search(r"^batch 0 +#+ +\d+$", out, re.M), "no remaining-backlog bar for the first batch"
    assert peek_counts(config.secondary, written) == {queue: 0 for queue in written}
    assert_all_arrived(emulator, originals)


def test_wheel_entry_point_exits_with_the_cli_code(tmp_path):
    """The Databricks wheel task calls the ``backlog-syphon`` console script: its exit code must
    reach the runner, or a failed run would show as succeeded."""
    import shutil
    import sys

    script = shutil.which("backlog-syphon", path=os.path.dirname(sys.executable))
    assert script, "the backlog-syphon console script is not installed in this environment"
    result = subprocess.run([script, "--config", str(ROOT / "conf/databricks.yaml"), "--set", "run.tigger=5 seconds"],
                            capture_output=True, text=True, timeout=120)
    assert result.returncode == 2
    assert "unknown key 'run.tigger'" in result.stderr and "known keys in 'run'" in result.stderr


def test_documented_walkthrough_from_setup_to_dry_run_and_replay(tmp_path):
    """A new user's path, exactly as docs/running/local.md gives it: emulator, backlog, dry run, replay."""
    shell_env = {k: v for k, v in os.environ.items()
                 if k not in ("PYTHONPATH", "PYSPARK_PYTHON", "PYSPARK_DRIVER_PYTHON", "SPARK_HOME")}
    shell_env.update({
        "SB_EMULATOR_PORT_OFFSET": str(20000 + os.getpid() % 10000),  # clear of a `make emulator` on 5672
        "JDK_JAVA_OPTIONS": JDK_JAVA_OPTIONS,
        "SYPHON__STORAGE__AUDIT_TABLE": str(tmp_path / "audit"),  # keep the repository's var/ as it is
        "SYPHON__STORAGE__CHECKPOINT_TABLE": str(tmp_path / "checkpoint"),
        "SYPHON__STORAGE__CHECKPOINT_LOCATION": str(tmp_path / "checkpoint-stream"),
    })
    block = documented_block("local.md", "walkthrough")
    result = subprocess.run(["bash", "-euo", "pipefail", "-c", block], cwd=ROOT, env=shell_env,
                            capture_output=True, text=True, timeout=900)
    output = result.stdout + result.stderr
    assert result.returncode == 0, f"exit {result.returncode}\n{output[-6000:]}"

    assert re.search(r"^total: 300$", result.stdout, re.M), "the backlog writer did not write 300 messages"
    start = result.stdout.index("dry run: nothing was sent")
    plan = result.stdout[start:result.stdout.index("  backlog queues:", start)]
    assert "  backlog queues: 300 messages" in result.stdout[start:]
    rows = [line.split() for line in plan.splitlines()[2:] if re.match(r"  [\w-]+ +\d+ ", line)]
    assert sum(int(row[6]) for row in rows) == 300, plan  # the "deliver" column
    progress = [line for line in output.splitlines() if re.match(r"batch \d+: delivered \d+", line)]
    assert sum(int(re.search(r"delivered (\d+)", line).group(1)) for line in progress) == 300
    assert "remaining 0" in progress[-1]
    remaining = re.findall(r"^  contoso/x-servicebus-transfer/\d+ +(\d+)$", result.stdout, re.M)
    assert len(remaining) == 10 and set(remaining) == {"0"}
    deadline = time.monotonic() + 15
    while (ROOT / "var/emulator.json").exists() and time.monotonic() < deadline:
        time.sleep(0.2)  # the trap's SIGTERM has been sent; the emulator removes its file on exit
    assert not (ROOT / "var/emulator.json").exists(), "the emulator did not stop (its ready file remains)"
