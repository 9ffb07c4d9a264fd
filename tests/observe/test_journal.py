"""The connection journal: chunks on both legs, boundaries, fault decisions, ends, drops,
redaction, and the proof that declared faults fired (no sockets: the relay's calls are
made directly, with literal times)."""

from __future__ import annotations

import base64
import json
from pathlib import Path

import pytest

from middlebox.core.dialects import Dialect
from middlebox.core.fault import FaultReport
from middlebox.core.stream import DOWN, UP
from middlebox.observe.journal import (
    ConnectionJournal,
    JournalStore,
    facts,
    fault_proof,
    read_ndjson,
)
from middlebox.run.suite import proof_problems
from tests.core.answers import answer_events, request_bytes

REQUEST = (
    b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer sk-secret\r\n"
    b"Content-Length: 2\r\n\r\n{}"
)
HEAD = b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ntransfer-encoding: chunked\r\n\r\n"
EVENT1 = b'data: {"x":1}\n\n'
EVENT2 = b"data: [DONE]\n\n"


def chunked(data: bytes) -> bytes:
    return f"{len(data):x}\r\n".encode() + data + b"\r\n"


def one_exchange(journal: ConnectionJournal) -> None:
    """A request read from the client and written upstream; an SSE response read from the
    upstream in three reads and written to the client; the client's FIN, the server's RST."""
    journal.read("client", UP, REQUEST[:20], 1.0)
    journal.read("client", UP, REQUEST[20:], 1.1)
    journal.wrote("upstream", UP, REQUEST, 1.2)
    body = [HEAD + chunked(EVENT1)[:5], chunked(EVENT1)[5:], chunked(EVENT2)]
    for i, part in enumerate(body):
        journal.read("upstream", DOWN, part, 2.0 + i)
        journal.wrote("client", DOWN, part, 2.0 + i + 0.5)
    journal.fault(FaultReport("latency", 2.2, "delaying", {"offset": 7, "obj": object()}))
    journal.ended("client", UP, "read_fin", 5.0)
    journal.ended("upstream", DOWN, "read_rst", 5.1)
    journal.ended("client", DOWN, "sent_rst", 5.2)


def lines_of(journal: ConnectionJournal) -> list[dict[str, object]]:
    return journal.to_lines()


def test_every_chunk_on_both_legs_is_recorded_with_its_offset_in_time_order() -> None:
    journal = ConnectionJournal(7, 0.5, capture=True, clock_offset=100.0)
    one_exchange(journal)
    lines = lines_of(journal)
    chunks = [line for line in lines if line["type"] in ("read", "wrote")]
    assert [(c["leg"], c["direction"], c["offset"], c["size"]) for c in chunks[:3]] == [
        ("client", "upstream", 0, 20),
        ("client", "upstream", 20, len(REQUEST) - 20),
        ("upstream", "upstream", 0, len(REQUEST)),
    ]
    assert chunks[0]["time"] == 101.0  # relay clock + the wall-clock offset
    times = [float(line["time"]) for line in lines if "time" in line and line["type"] != "open"]
    assert times == sorted(times)
    assert all(line["connection"] == 7 for line in lines)


def test_heads_and_sse_events_are_derived_at_their_stream_offsets() -> None:
    journal = ConnectionJournal(1, 0.0, capture=True)
    one_exchange(journal)
    heads = [line for line in lines_of(journal) if line["type"] == "http_head"]
    assert {(h["leg"], h["direction"]) for h in heads} == {
        ("client", "upstream"),
        ("upstream", "upstream"),
        ("client", "downstream"),
        ("upstream", "downstream"),
    }
    events = [
        line
        for line in lines_of(journal)
        if line["type"] == "sse_event" and line["leg"] == "client"
    ]
    assert [e["index"] for e in events] == [0, 1]
    assert [e["done"] for e in events] == [False, True]
    wire = journal.bytes_from("client", DOWN)
    assert wire[int(events[0]["offset"]) :].startswith(EVENT1)
    assert wire[int(events[1]["offset"]) :].startswith(EVENT2)
    # the first event's bytes straddle two reads; it is stamped with the read it began in
    assert events[0]["time"] == 2.5


def test_secrets_are_redacted_by_default_and_kept_when_asked() -> None:
    journal = ConnectionJournal(1, 0.0, capture=True)
    one_exchange(journal)
    text = json.dumps(journal.to_lines())
    assert "sk-secret" not in text
    assert "[redacted]" in text
    raw = [
        base64.b64decode(str(line["base64"]))
        for line in journal.to_lines(redact_secrets=False)
        if line["type"] == "bytes"
    ]
    assert any(b"sk-secret" in data for data in raw)


def test_ends_and_fault_decisions_are_in_the_summary() -> None:
    journal = ConnectionJournal(1, 0.0, capture=True)
    one_exchange(journal)
    summary = lines_of(journal)[-1]
    assert summary["type"] == "summary"
    assert summary["ends"] == [
        {"leg": "client", "direction": "upstream", "kind": "read_fin"},
        {"leg": "upstream", "direction": "downstream", "kind": "read_rst"},
        {"leg": "client", "direction": "downstream", "kind": "sent_rst"},
    ]
    assert summary["faults_fired"] == ["latency"]
    fault = next(line for line in lines_of(journal) if line["type"] == "fault")
    assert fault["offset"] == 7 and fault["obj"].startswith("<object")
    assert summary["bytes"]["client.downstream"] == len(journal.bytes_from("client", DOWN))


def test_the_journal_is_bounded_and_counts_what_it_dropped() -> None:
    journal = ConnectionJournal(1, 0.0, capture=True, max_records=3, max_capture_bytes=10)
    for i in range(5):
        journal.read("client", UP, b"abcdef", float(i))
    journal.ended("client", UP, "read_fin", 9.0)
    assert len(journal.records) == 3
    assert journal.dropped == 3  # two chunks and the end
    assert journal.capture_dropped == 24  # only the first 6 bytes fit in 10
    assert journal.total_bytes("client", UP) == 30  # offsets still count every byte
    summary = journal.summary()
    assert summary["dropped"] == 3 and summary["capture_dropped_bytes"] == 24


def test_a_store_keeps_its_latest_connections_and_counts_evictions() -> None:
    store = JournalStore(max_connections=2, clock_offset=0.0)
    for cid in (1, 2, 3):
        store.observer(cid, 0.0)
    assert sorted(store.journals) == [2, 3]
    assert store.evicted == 1


def test_ndjson_reads_back_into_views_and_facts(tmp_path: Path) -> None:
    store = JournalStore(capture=True, clock_offset=0.0)
    one_exchange(store.observer(1, 0.0, "s"))
    store.observer(2, 0.0, "s").read("client", UP, b"x", 1.0)
    path = tmp_path / "j.ndjson"
    store.write_ndjson(path)
    views = read_ndjson(path)
    assert [v.connection for v in views] == [1, 2]
    assert views[0].captured[("client", "downstream")] == store.journals[1].bytes_from(
        "client", DOWN
    )
    summary = facts(views)
    assert summary["connections"] == 2
    assert summary["faults_fired"] == {"latency": 1}
    assert summary["sse_events_to_client"] == 2
    assert summary["end_kinds"][0] == ["client.read_fin", "client.sent_rst", "upstream.read_rst"]


def test_proof_fails_a_fault_that_fired_for_no_client_and_a_client_that_never_connected() -> None:
    fired, quiet, absent = (JournalStore(clock_offset=0.0) for _ in range(3))
    fired.observer(1, 0.0).fault(FaultReport("latency", 0.0, "delaying", {}))
    quiet.observer(1, 0.0)
    proof = fault_proof(["latency", "slicer"], {"a": fired, "b": quiet, "c": absent})
    assert proof["connections"] == {"a": 1, "b": 1, "c": 0}
    assert proof["faults"]["latency"] == {
        "fired": 1,
        "bypassed": 1,
        "clients_fired": ["a"],
        "clients_bypassed": ["b", "c"],
    }
    problems = proof_problems("s", proof)
    assert len(problems) == 3
    assert "s/c: no connection reached the proxy" in problems[0]
    assert "'slicer' never fired for any client" in problems[1]
    # per client: a fault that fired for some clients but never for one that connected is
    # a problem for that one (c never connected: that is its own problem already)
    assert "s/b: declared fault 'latency' fired for a but never for b" in problems[2]


def test_an_open_connection_read_again_keeps_one_time_index_per_leg_and_direction() -> None:
    """The control API reads an open connection's journal again and again while it grows:
    each read finds boundary times on the records as they are then, and keeps one index
    per leg and direction, not one per read."""
    journal = ConnectionJournal(1, 0.0, capture=True)
    one_exchange(journal)
    first = [line for line in journal.to_lines() if line["type"] == "sse_event"]
    for tick in range(50):
        journal.read("upstream", DOWN, b"", 10.0 + tick)  # the record grows, no new bytes
        again = [line for line in journal.to_lines() if line["type"] == "sse_event"]
        assert again == first
    assert len(journal._time_index) <= 4  # two legs x two directions


@pytest.mark.parametrize("dialect", list(Dialect), ids=lambda d: d.value)
def test_the_journal_marks_each_api_s_closing_event_and_no_other(dialect: Dialect) -> None:
    """`done` is the stream's last event by the one rule of `middlebox.core.dialects`, in
    the API the request's path names: `[DONE]`, `message_stop`, `response.completed`."""
    journal = ConnectionJournal(1, 0.0, capture=True)
    events = answer_events(dialect, ["Une ", "café"])
    journal.read("client", UP, request_bytes(dialect), 1.0)
    journal.read("upstream", DOWN, HEAD + b"".join(chunked(e) for e in events), 2.0)
    seen = [line for line in lines_of(journal) if line["type"] == "sse_event"]
    assert [line["done"] for line in seen] == [False] * (len(events) - 1) + [True]
    assert not any(line["error"] for line in seen)


@pytest.mark.parametrize(
    ("dialect", "error"),
    [
        (Dialect.CHAT, b'data: {"error":{"message":"boom","code":500}}\n\n'),
        (
            Dialect.MESSAGES,
            b'event: error\ndata: {"type":"error","error":{"type":"api_error","message":"b"}}\n\n',
        ),
    ],
    ids=["chat", "messages"],
)
def test_the_journal_marks_an_in_band_error_in_each_api_s_shape(
    dialect: Dialect, error: bytes
) -> None:
    journal = ConnectionJournal(1, 0.0, capture=True)
    first = answer_events(dialect, ["Une "])[:2]
    journal.read("client", UP, request_bytes(dialect), 1.0)
    journal.read("upstream", DOWN, HEAD + b"".join(chunked(e) for e in [*first, error]), 2.0)
    seen = [line for line in lines_of(journal) if line["type"] == "sse_event"]
    assert [line["error"] for line in seen] == [False, False, True]
