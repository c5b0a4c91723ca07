"""The parts of ``bench/bench_syphon.py``, one role each: the rows (``rows``), the emulator and its counters
(``broker``), the child processes (``children``), the plain SDK loops (``loops``, ``async_loop``), a syphon
run and its figures (``syphon_run``, ``figures``), the emulator's ceiling (``ceiling``) and the report
(``report``)."""


class BenchFailure(RuntimeError):
    """A measurement that cannot be trusted: the bench stops with exit code 1."""
