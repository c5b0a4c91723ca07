"""What the integration tests share: running ``jobs/syphon.py`` as a real job (under the fault harness,
``tools/faulty_job.py``, when a test sets ``SYPHON_FAULT_*``), killing it, and draining destinations."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time

from tools import testing

from .conftest import PRIMARY, ROOT, SECONDARY

# For the jobs the tests start (unless PYSPARK_SUBMIT_ARGS is set already): no Spark UI. The driver
# JVM's options are the session builder's own (``local_setup.jvm_options.driver_java_options``, the
# class archive included): a --driver-java-options here would replace them.
JOB_SUBMIT_ARGS = "--conf spark.ui.enabled=false pyspark-shell"
JOB, FAULTY_JOB = "jobs/syphon.py", "tools/faulty_job.py"
FAULT_VARIABLES = "SYPHON_FAULT_"  # ``tools.fault_plan``: read by the fault harness only


def job_command(tmp_path, config: str = "conf/local.yaml", **settings) -> list[str]:
    """``jobs/syphon.py`` on ``config`` with state in ``tmp_path``; ``settings`` are ``--set`` keys
    with ``__`` for the dot (``run__trigger="10 seconds"``)."""
    values = {
        "storage.audit_table": tmp_path / "audit",
        "storage.checkpoint_table": tmp_path / "checkpoint",
        "storage.checkpoint_location": tmp_path / "checkpoint-stream",
        "run.trigger": "available_now",
    }
    values.update({key.replace("__", "."): value for key, value in settings.items()})
    command = [sys.executable, JOB, "--config", config]
    for key, value in values.items():
        command += ["--set", f"{key}={value}"]
    return command


def job_env(emulator, extra: dict[str, str] | None = None, *, primary: str | None = None,
            secondary: str | None = None, transport: str = "amqp", proxy=None) -> dict[str, str]:
    """The job's environment: the emulator's connection strings (or the given ones) and the venv;
    ``transport`` and ``proxy``: the way to the emulator (``testing.emulator_environment``)."""
    env = {key: value for key, value in os.environ.items() if not key.startswith(FAULT_VARIABLES)}
    env.update(testing.emulator_environment(emulator, PRIMARY, SECONDARY, transport=transport, proxy=proxy))
    env.update({
        "SYPHON_PRIMARY_CONNECTION_STRING": primary or emulator.connection_string(PRIMARY, transport=transport),
        "SYPHON_SECONDARY_CONNECTION_STRING": secondary or emulator.connection_string(SECONDARY, transport=transport),
        "PYTHONPATH": str(ROOT / "lib"),
        "PYSPARK_PYTHON": sys.executable,
        "PYSPARK_DRIVER_PYTHON": sys.executable,
    })
    env.setdefault("PYSPARK_SUBMIT_ARGS", JOB_SUBMIT_ARGS)
    env.update(extra or {})
    return env


def free_port() -> int:
    """A port on 127.0.0.1 that was free a moment ago (nothing listens there)."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def start_job(command: list[str], env: dict[str, str], log) -> subprocess.Popen:
    """Start a job in its own session (so its whole tree, JVM included, can be killed), output to ``log``. With
    a test's faults in ``env`` (``SYPHON_FAULT_*``), ``jobs/syphon.py`` runs under the fault harness, which reads
    them: the library itself has no fault code."""
    if any(key.startswith(FAULT_VARIABLES) for key in env):
        command = [FAULTY_JOB if part == JOB else part for part in command]
        assert FAULTY_JOB in command, f"faults set for a command that is not {JOB}: {command}"
    with open(log, "wb") as out:
        return subprocess.Popen(command, cwd=ROOT, stdout=out, stderr=subprocess.STDOUT, start_new_session=True,
                                env=env)


def descendants(pid: int) -> set[int]:
    """Every live descendant of ``pid`` (PySpark's daemon moves its workers to their own group)."""
    return set(testing.process_tree(pid))


def kill_tree(proc: subprocess.Popen, extra_pids=()) -> None:
    """SIGKILL the job's process group and every process it started, then reap it."""
    tree = descendants(proc.pid) | {int(pid) for pid in extra_pids}
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    for pid in tree:
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    proc.wait(timeout=30)


def kill_when_parked(command: list[str], env: dict[str, str], step: str, marker, log, timeout: float, *,
                     settle_seconds: float = 0.0, until=None) -> str:
    """Run the job with the sink's test hook at ``step`` (``SYPHON_FAULT_PAUSE_AT``: the process that reaches
    it writes ``<step> <pid>`` to ``marker`` and sleeps), then SIGKILL its whole process tree, the parked
    processes included. Returns '' once killed there, or why it never parked. ``settle_seconds``: let the
    job's other tasks get as far as they get before the kill. ``until``: once parked, wait (within the
    timeout) until this holds too, as when a thread parks while the rest of the job goes on."""
    proc = start_job(command, {**env, "SYPHON_FAULT_PAUSE_AT": step, "SYPHON_FAULT_MARKER": str(marker)}, log)
    parked_pids: list[int] = []
    try:
        parked = wait_for(lambda: proc.poll() is not None or (marker.exists() and marker.read_text().strip()),
                          timeout, interval=0.2)
        if proc.poll() is not None:
            return f"the job ended (rc={proc.returncode}) before reaching {step}"
        if not parked:
            return f"the job did not reach {step} within {timeout:.0f} s"
        if until is not None and not wait_for(lambda: proc.poll() is not None or until(), timeout, interval=0.2):
            return f"parked at {step}, but what the test waits for did not come within {timeout:.0f} s"
        if proc.poll() is not None:
            return f"the job ended (rc={proc.returncode}) while parked at {step}"
        time.sleep(settle_seconds)
        words = marker.read_text().split()
        parked_pids = [int(pid) for pid in words[1::2]]
        return "" if words[0] == step else f"the job parked at {words[0]}, not {step}"
    finally:
        kill_tree(proc, parked_pids)


def finish_job(proc: subprocess.Popen, timeout: float) -> int | None:
    """The job's exit code once it ends within ``timeout``; None (and the job killed) otherwise."""
    try:
        return proc.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        return None
    finally:
        if proc.poll() is None:
            kill_tree(proc)


def tail(path, limit: int = 4000) -> str:
    try:
        return path.read_text(errors="replace")[-limit:]
    except OSError:
        return "(no output)"


def wait_for(condition, timeout: float, interval: float = 0.25) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if condition():
            return True
        time.sleep(interval)
    return condition()


def drain_destinations(emulator, destinations) -> dict[str, list]:
    """Receive and delete everything in the primary's destination queues: destination -> received messages."""
    return testing.drain_destinations(emulator.connection_string(PRIMARY), destinations)


def read_with_deltalake(table_path) -> dict[str, str]:
    """An independent Delta reader (delta-rs) reads a table whole: its columns and their types as it sees them.

    delta-rs refuses a table whose schema it does not know (for example strings declared with a
    collation, as a table first written through Spark Connect would be): then this raises.
    """
    from deltalake import DeltaTable

    table = DeltaTable(str(table_path))
    table.to_pyarrow_table()  # every row, every column
    return {field.name: str(field.type) for field in table.schema().fields}
