"""handoff reads the scenario's outage from the shared store once it is stored, not per item.

With `--state redis://` each store read is a Redis round trip; the window is stored once
per scenario (`setdefault`) and never changed, so a connection keeps the window it read.
While none is stored it still reads on every item: another connection's outage must
reach it at its next item (the fault's documented behaviour)."""

from __future__ import annotations

import random
from typing import Any

from faults.handoff import Handoff
from faults.testing import replay
from middlebox.core.fault import FaultContext
from middlebox.core.stream import DOWN, UP, Chunk
from middlebox.shell.state import MemoryBackend, ScopedStore


class CountingBackend(MemoryBackend):
    """The shared-memory store, counting reads (each one a round trip on Redis)."""

    def __init__(self) -> None:
        super().__init__(size=64 * 1024)
        self.reads = 0

    def get(self, key: str) -> Any | None:
        self.reads += 1
        return super().get(key)


def bound(fault: Handoff, store: ScopedStore) -> Handoff:
    fault.bind(FaultContext(rng=random.Random(0), shared=store))
    return fault


def test_a_connection_after_the_outage_reads_the_store_once_for_a_whole_stream() -> None:
    backend = CountingBackend()
    store = ScopedStore(backend, "scenario/0")
    store.setdefault("outage", {"start": 1.0, "end": 2.0, "outcome": "resume"})
    fault = bound(Handoff(at=1.0, outage=1.0), store)
    timeline = [(5.0 + n / 100, Chunk(DOWN, b"data: x\n\n")) for n in range(200)]
    out = replay(
        fault, [(5.0, Chunk(UP, b"GET / HTTP/1.1\r\n\r\n")), *timeline], start=5.0, bind=False
    )
    assert [item for _, item in out][1:] == [item for _, item in timeline]
    assert backend.reads == 1
    backend.close()


def test_a_connection_in_the_outage_stops_reading_the_store_once_it_went_dark() -> None:
    backend = CountingBackend()
    store = ScopedStore(backend, "scenario/0")
    fault = bound(Handoff(at=1.0, outage=3.0, outcome="reset"), store)
    timeline = [(0.5 + n / 100, Chunk(DOWN, b"data: x\n\n")) for n in range(300)]
    replay(fault, timeline, start=0.0, bind=False)
    assert store["outage"] == {"start": 1.0, "end": 4.0, "outcome": "reset"}
    before_the_outage = sum(1 for time, _ in timeline if time < 1.0)
    # A read at open, one per item and wake-up until it triggered, none in or after the
    # outage (it read once per item for all 300 before).
    assert backend.reads <= before_the_outage + 3
    assert fault.reports[-1].action == "reset"
    backend.close()


def test_before_any_outage_each_item_still_looks_so_another_connections_outage_is_seen() -> None:
    shared: dict[str, Any] = {}
    waiting = Handoff(at=100.0, outage=2.0)
    waiting.bind(FaultContext(rng=random.Random(0), shared=shared))
    waiting.on_open(0.0)
    assert waiting.on_item(Chunk(DOWN, b"a"), 0.5) == [Chunk(DOWN, b"a")]
    shared["outage"] = {"start": 0.8, "end": 3.0, "outcome": "resume"}  # another connection
    assert waiting.on_item(Chunk(DOWN, b"b"), 1.0) == []  # held: it went dark at once
    assert waiting.deadline() == 3.0
    assert waiting.on_deadline(3.0) == [Chunk(DOWN, b"b")]
