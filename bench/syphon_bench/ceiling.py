"""The emulator's ceiling where each operation meets its namespace's latency (``bench_emulator.ceiling``):
batched sends at the primary's, peeks and PeekLock receives with bulk completions at the secondary's."""
from __future__ import annotations

from dataclasses import dataclass

from syphon_bench.rows import Geometry, Scenario


@dataclass(frozen=True)
class GeometryCeiling:
    """The emulator's ceiling where each operation meets its namespace's latency."""

    geometry: Geometry
    body_size: int
    send: float  # at the primary's latency
    peek: float  # at the secondary's
    receive_complete: float  # at the secondary's

    @property
    def combined(self) -> float:
        return 1 / (1 / self.send + 1 / self.peek + 1 / self.receive_complete)

    def line(self) -> str:
        return (f"{self.geometry.label()}, {self.body_size} B: send {self.send:.0f} (primary), peek {self.peek:.0f}, "
                f"receive+complete {self.receive_complete:.0f} (secondary), combined {self.combined:.0f} msg/s")


def geometry_ceilings(scenarios: list[Scenario], messages: int) -> dict[tuple, GeometryCeiling]:
    """``bench_emulator.ceiling`` at every round trip the rows need, combined per geometry and body size."""
    from bench_emulator import ceiling

    at: dict[tuple[float, int], object] = {}
    out = {}
    for scenario in scenarios:
        geometry, size = scenario.geometry, scenario.body_size
        for one_way in (geometry.primary_ms, geometry.secondary_ms):
            if (one_way, size) not in at:
                at[(one_way, size)] = ceiling(2 * one_way, min(messages, scenario.messages), size)
        near, far = at[(geometry.primary_ms, size)], at[(geometry.secondary_ms, size)]
        out[(geometry, size)] = GeometryCeiling(geometry, size, near.send, far.peek, far.receive_complete)
    return out
