"""Development tools, not part of the wheel: forging legacy backlogs, `make run`, helpers shared by tests and benchmarks, the tests' fault harness."""
