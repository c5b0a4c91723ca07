"""The movers' child processes: ``bench_syphon.py --child ROLE`` in a folder of its own, with the emulator's
connection strings in its environment and its output in ``<role>.log``."""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from contextlib import contextmanager
from pathlib import Path

from syphon_bench import BenchFailure
from syphon_bench.broker import LIBRARY_ENV, ROOT, connection_env

BENCH_SCRIPT = ROOT / "bench" / "bench_syphon.py"


@contextmanager
def child_process(role: str, spec: dict, emu, workdir: Path, library: Path | None = None, transport: str = "amqp"):
    """The bench script as ``role`` with ``spec`` (reaching ``emu`` over ``transport``); its output goes to
    ``<role>.log``.

    The child runs in its own session (so that its JVM goes with it): on any error here, a timeout
    or Ctrl-C included, the whole group is killed.
    """
    env = {**os.environ, **(connection_env(emu, library, transport) if emu is not None else {}),
           LIBRARY_ENV: str(library or ""),
           "PYTHONPATH": os.pathsep.join(filter(None, [str(library or ROOT / "lib"), str(ROOT / "emulator" / "src"),
                                                       os.environ.get("PYTHONPATH")])),
           "PYSPARK_PYTHON": os.environ.get("PYSPARK_PYTHON", sys.executable)}
    command = [sys.executable, str(BENCH_SCRIPT), "--child", role, "--spec", json.dumps(spec),
               "--result", str(workdir / f"{role}.json")]
    with open(workdir / f"{role}.log", "w") as log:
        child = subprocess.Popen(command, env=env, stdout=log, stderr=subprocess.STDOUT, cwd=workdir,
                                 start_new_session=True)
    try:
        yield child
    except BaseException:
        if child.poll() is None:
            os.killpg(child.pid, signal.SIGKILL)
            child.wait()
        raise


def child_result(child: subprocess.Popen, role: str, workdir: Path, timeout: float) -> dict:
    """The child's result, with ``exited_at``: when this process saw it end (epoch seconds)."""
    try:
        code = child.wait(timeout)
        exited_at = time.time()
    except subprocess.TimeoutExpired:
        raise BenchFailure(f"{role}: still running after {timeout:.0f} s; killed. Log:\n{log_tail(workdir, role)}") \
            from None
    result = workdir / f"{role}.json"
    if code != 0 or not result.exists():
        raise BenchFailure(f"{role}: exit code {code}. Log:\n{log_tail(workdir, role)}")
    return {**json.loads(result.read_text()), "exited_at": exited_at}


# asyncio's complaint about the SDK's keep-alive tasks at a loop's end: two lines each, hundreds of them, which
# would push the child's own error out of the tail.
ASYNCIO_NOISE = ("Task was destroyed but it is pending!", "task: <Task pending ")


def log_tail(workdir: Path, role: str, lines: int = 120) -> str:
    logged = (workdir / f"{role}.log").read_text(errors="replace").splitlines()
    return "\n".join([line for line in logged if not line.startswith(ASYNCIO_NOISE)][-lines:])


def run_child(role: str, spec: dict, result_path: str) -> int:
    """What a child does (``--child``): its role's work, its result written as JSON."""
    from syphon_bench.loops import loop_child
    from syphon_bench.migration_row import migration_loop_child
    from syphon_bench.syphon_run import syphon_child

    if role == "loop":
        result = (migration_loop_child if spec.get("migration") else loop_child)(spec)
    else:
        result = syphon_child(spec)
    if "returned_at" in result:  # what the bench alone did after the run (progress, peaks): not the job's
        result["bench_only_seconds"] = time.time() - result["returned_at"]
    Path(result_path).write_text(json.dumps(result))
    return 0
