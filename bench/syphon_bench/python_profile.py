"""Where the Python processes of a run spend their CPU, step by step (``--py-spy DIR``): py-spy samples
every Python process under the syphon's child (the driver, the streaming source's runner, the workers),
keeping the threads that hold the GIL (``--gil``: a thread asleep or blocked on a socket does not), and each
sample is put down to the innermost step of ``STEPS`` on its stack. Samples are shares of a process's time
running Python *or waiting for a core* with the GIL held, so on a busy machine each process's shares are
scaled by the CPU seconds ``process_cpu`` measured for it."""
from __future__ import annotations

import collections
import os
import re
import shutil
import signal
import subprocess
import threading
import time
from contextlib import contextmanager
from pathlib import Path

from tools.testing import process_tree

# (step, substrings of a frame: "function (file:line)"), innermost match on a stack wins, the first listed on a tie.
STEPS = (
    ("pyspark daemon: gc.collect() after each task", ("manager (daemon.py:273)",)),
    ("imports", ("_find_and_load", "<frozen importlib")),
    ("source: planning (latestOffset)", ("latestOffset", "initialOffset", "source/planning.py", "window_planner.py")),
    ("source: identity decode", ("broker_identity",)),
    ("source: envelope decode", ("backlog_row_values", "decode_envelope", "decode_backlog_message")),
    ("source: peek (SDK request and answer)", ("peek_stored_bytes", "peek_raw")),
    ("Arrow record batch -> rows (send task)", ("row_chunks (", "to_pylist")),
    ("Arrow rows -> record batch", ("record_batch (",)),
    ("send task: restore (codec)", ("restore_message_bytes", "build_outgoing")),
    ("send task: SDK send", ("send_encoded", "send_in_flight", "send_singly", "DestinationSenders.send")),
    ("send task: grouping, rounds, outcomes", ("deliver_rows", "deliver_chunks", "outcome_row", "_DestinationRounds",
                                               "send_groups")),
    ("purge: receive", ("ServiceBusReceiver.receive_messages",)),
    ("purge: settle", ("complete_by_lock_tokens", "dead_letter_by_lock_tokens", "release_message")),
    ("purge: other", ("servicebus/purge.py", "purge_runner.py", "backlog_syphon/purge/")),
    ("links: open", ("open_in_parallel", "open_with_retry", "ready_within_a_nap")),
    ("pyspark worker: (de)serialisation", ("serializers.py", "pyspark/worker.py", "pyspark/sql/pandas")),
    ("driver: foreachBatch", ("foreach_batch.py", "micro_batch.py", "spark_ports.py")),
    ("py4j", ("py4j",)),
)
_PROCESS = re.compile(r'^process (?P<pid>\d+):')


def py_spy() -> str | None:
    return os.environ.get("PY_SPY") or shutil.which("py-spy")


class Follower:
    """What following a process tree cost this process: ``own_seconds``, its thread's CPU (known once done)."""

    own_seconds = 0.0


@contextmanager
def sampled(pid: int, out: Path | None, poll_seconds: float = 0.3):
    """py-spy records ``pid`` and every Python process under it into ``out`` (raw collapsed stacks) meanwhile;
    yields a ``Follower``.

    py-spy's own ``--subprocesses`` does not follow a JVM's children (Spark's worker daemons, the source's
    runner) nor, here, the workers a daemon forks. So each Python process gets a recorder of its own as it
    appears (found every ``poll_seconds``: a worker that lives shorter may be missed); their files are
    joined at the end."""
    follower = Follower()
    if out is None:
        yield follower
        return
    spy = py_spy()
    if spy is None:
        raise RuntimeError("--py-spy needs py-spy on the PATH (or PY_SPY=/path/to/py-spy): pip install py-spy")
    out.parent.mkdir(parents=True, exist_ok=True)
    recorders: dict[int, tuple[subprocess.Popen, Path]] = {}
    done = threading.Event()

    def follow() -> None:
        while True:
            tree = {pid: None, **process_tree(pid)}
            for child in tree:
                if child in recorders or not _is_python(child):
                    continue
                part = out.with_name(f"{out.stem}.{child}.txt")
                recorders[child] = (subprocess.Popen(
                    [spy, "record", "--pid", str(child), "--gil", "--format", "raw", "--rate", "50",
                     "--nonblocking", "--output", str(part)], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL),
                    part)
            if done.wait(poll_seconds):
                follower.own_seconds = time.thread_time()
                return

    thread = threading.Thread(target=follow, name="py-spy-follower", daemon=True)
    thread.start()
    try:
        yield follower
    finally:
        done.set()
        thread.join()
        for recorder, _ in recorders.values():
            try:
                recorder.wait(120)  # each writes its file once the process it follows has exited
            except subprocess.TimeoutExpired:
                recorder.send_signal(signal.SIGINT)
                recorder.wait()
        with open(out, "w") as joined:  # each stack under its process, as ``--subprocesses`` writes them
            for child, (_, part) in recorders.items():
                if part.exists():
                    joined.writelines(f'process {child}:"";{line}' for line in part.read_text(errors="replace")
                                      .splitlines(keepends=True))
                    part.unlink()


def _is_python(pid: int) -> bool:
    try:
        program = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")[0]
    except OSError:
        return False
    return b"python" in os.path.basename(program)


def step_of(frames: list[str]) -> str:
    """The innermost step of ``STEPS`` a stack (outermost frame first) is in; ``other`` when none."""
    for frame in reversed(frames):
        for step, patterns in STEPS:
            if any(pattern in frame for pattern in patterns):
                return step
    return "other"


def samples_by_process(raw: str) -> dict[int, collections.Counter]:
    """pid -> step -> samples, from py-spy's raw output (``process PID:"command";frame;...;frame COUNT``)."""
    out: dict[int, collections.Counter] = collections.defaultdict(collections.Counter)
    record = ""
    for line in raw.splitlines():
        record += line
        head, _, count = record.rpartition(" ")
        if not count.isdigit() or not _PROCESS.match(record):
            record += "\n"  # a command line with a newline in it
            continue
        frames = head.split(";")
        out[int(_PROCESS.match(frames[0])["pid"])][step_of(frames[1:])] += int(count)
        record = ""
    return out


def cpu_by_step(raw: str, cpu_seconds: dict[int, float]) -> collections.Counter:
    """CPU seconds per step: each process's measured CPU seconds shared out as its samples are."""
    total: collections.Counter = collections.Counter()
    for pid, steps in samples_by_process(raw).items():
        samples = sum(steps.values())
        for step, count in steps.items():
            total[step] += cpu_seconds.get(pid, 0.0) * count / samples
    return total
