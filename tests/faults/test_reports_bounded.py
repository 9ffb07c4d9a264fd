"""A fault's reports are bounded per connection: the first REPORTS_KEPT of each action kept,
the rest counted, on the fault (`reports`, `reports_more`) and in the journal (`fault_more`
lines, the summary's `faults_more`), while the metrics sink still counts every report. A
million coalescer flushes on a virtual clock: what a 1.5 GB stream does to one connection."""

from __future__ import annotations

import random
from pathlib import Path

from faults.coalescer import Coalescer
from middlebox.core.fault import REPORTS_KEPT, FaultContext
from middlebox.core.stream import DOWN, Chunk
from middlebox.observe.journal import JournalStore, JournalWriter, facts, read_ndjson
from middlebox.observe.metrics import Metrics, ServerCounters

FLUSHES = 1_000_000


def coalescer_on(sink: object) -> Coalescer:
    fault = Coalescer(size=4)
    fault.bind(FaultContext(1, random.Random(0), sink))  # type: ignore[arg-type]
    return fault


def test_a_million_flushes_keep_a_hundred_reports_and_the_journal_counts_the_rest(
    tmp_path: Path,
) -> None:
    store = JournalStore()
    journal = store.observer(1, 0.0, "long", 0.0)
    metrics = Metrics()
    fault = coalescer_on(metrics.sink(1, store.fault_sink(1)))
    chunk = Chunk(DOWN, b"abcd")  # a full `size`: one flush, one report, per item
    for index in range(FLUSHES):
        assert fault.on_item(chunk, index * 0.001) == [chunk]
    fault.report(FLUSHES * 0.001, "rare", note="after the flood")

    # the fault: the first hundred flushes, in order, then the other action still kept
    assert REPORTS_KEPT == 100
    assert len(fault.reports) == REPORTS_KEPT + 1
    assert [r.details["offset"] for r in fault.reports[:3]] == [0, 4, 8]
    assert fault.reports[REPORTS_KEPT - 1].time == (REPORTS_KEPT - 1) * 0.001
    assert fault.reports[-1].action == "rare"
    assert fault.reports_more == {"flush": FLUSHES - REPORTS_KEPT}
    assert fault.fired
    # the metrics sink heard every report, and counts the connection once
    assert metrics.faults == {("coalescer", "flush"): FLUSHES, ("coalescer", "rare"): 1}
    assert metrics.faulted_connections == {"coalescer": 1}

    # the journal: the same hundred, and one line with the count of the rest
    assert len(journal.faults) == REPORTS_KEPT + 1
    assert journal.summary()["faults_more"] == {"coalescer:flush": FLUSHES - REPORTS_KEPT}
    (more,) = [line for line in journal.to_lines() if line["type"] == "fault_more"]
    assert more == {
        "type": "fault_more",
        "connection": 1,
        "time": (FLUSHES - 1) * 0.001,  # the last flush counted
        "fault": "coalescer",
        "action": "flush",
        "count": FLUSHES - REPORTS_KEPT,
        "kept": REPORTS_KEPT,
    }
    assert sum(1 for line in journal.to_lines() if line["type"] == "fault") == REPORTS_KEPT + 1

    # written as it goes (`proxy --journal`), the count comes with the connection's end
    path = tmp_path / "journal.ndjson"
    writer = JournalWriter(lambda _cid: path, clock_offset=0.0)
    written = writer.observer(2, 0.0)
    sink = writer.fault_sink(2)
    for report in [*fault.reports[:REPORTS_KEPT]] * 3:
        sink(report)  # 300 flush reports: 100 kept, 200 counted
    writer.tick()
    assert [v.faults_more for v in read_ndjson(path)] == [[]]  # not before the end
    writer.connection_ended(2)
    (view,) = read_ndjson(path)
    assert len(view.faults) == REPORTS_KEPT
    assert [(m["fault"], m["action"], m["count"]) for m in view.faults_more] == [
        ("coalescer", "flush", 2 * REPORTS_KEPT)
    ]
    assert view.summary["faults_more"] == {"coalescer:flush": 2 * REPORTS_KEPT}
    assert facts([view])["fault_actions"] == ["coalescer:flush"]
    assert written.summary()["faults_more"] == {"coalescer:flush": 2 * REPORTS_KEPT}


def test_a_fault_within_the_bound_keeps_every_report_and_the_journal_counts_nothing() -> None:
    store = JournalStore()
    journal = store.observer(1, 0.0, "short", 0.0)
    fault = coalescer_on(store.fault_sink(1))
    chunk = Chunk(DOWN, b"abcd")
    for index in range(REPORTS_KEPT):
        fault.on_item(chunk, float(index))
    assert len(fault.reports) == REPORTS_KEPT
    assert fault.reports_more == {}
    assert journal.summary()["faults_more"] == {}
    assert not [line for line in journal.to_lines() if line["type"] == "fault_more"]
    assert len(journal.faults) == REPORTS_KEPT


def test_metrics_count_a_connection_once_per_fault_and_again_after_a_reset() -> None:
    metrics = Metrics()
    first, second = coalescer_on(metrics.sink(1, None)), coalescer_on(metrics.sink(2, None))
    for fault in (first, second, first):
        fault.report(0.0, "flush")
    assert metrics.faulted_connections == {"coalescer": 2}
    metrics.reset(ServerCounters(), None)
    first.report(1.0, "flush")
    first.report(2.0, "flush")
    assert metrics.faulted_connections == {"coalescer": 1}
    assert metrics.faults == {("coalescer", "flush"): 2}
