"""The console's classifier on a virtual clock: each finding where it must appear and where
it must not, and the live model fed through the observer contract."""

from __future__ import annotations

import pytest

from middlebox.console import model as model_module
from middlebox.console.classify import Side, StreamFacts, classify, ending
from middlebox.console.model import ConsoleModel
from middlebox.core.fault import FaultReport
from middlebox.core.stream import Direction
from middlebox.observe.journal import ConnectionJournal

SMOOTH = tuple(0.2 + 0.05 * i for i in range(20))


def kinds(facts: StreamFacts, now: float) -> list[str]:
    return [finding.kind for finding in classify(facts, now)]


def finished(client: tuple[float, ...], *, upstream: tuple[float, ...] = SMOOTH) -> StreamFacts:
    return StreamFacts(
        0.0,
        upstream=Side(upstream, done=True, first_byte=0.1, last_byte=upstream[-1]),
        client=Side(client, done=True, first_byte=0.1, last_byte=client[-1]),
        client_end=("sent_fin", 1.5),
        upstream_closed=1.4,
    )


def test_a_smooth_stream_shows_nothing() -> None:
    facts = finished(tuple(t + 0.001 for t in SMOOTH))
    assert kinds(facts, 2.0) == []
    assert ending(facts) == "complete"


def test_buffering_is_one_late_lump() -> None:
    facts = finished((1.2,) * 20)
    found = classify(facts, 2.0)
    assert [f.kind for f in found] == ["buffering"]
    assert "1000 ms after the upstream's" in found[0].words and "the largest 20" in found[0].words
    # nginx's 4 KiB buffer: a few lumps, the first late
    lumps = tuple(0.6 + 0.4 * (i // 7) for i in range(20))
    assert kinds(finished(lumps), 2.0) == ["buffering"]


def test_coalescing_is_several_lumps() -> None:
    lumps = tuple(0.2 + 0.2 * (i // 4) for i in range(20))  # 5 lumps of 4
    assert kinds(finished(lumps), 2.0) == ["coalescing"]
    # an upstream that itself sent in lumps is not the path coalescing
    assert kinds(finished(lumps, upstream=lumps), 2.0) == []


def test_held_tokens_are_buffering_while_open() -> None:
    facts = StreamFacts(0.0, upstream=Side(SMOOTH[:10], last_byte=0.65), client=Side())
    assert kinds(facts, 0.7) == []  # the oldest held 0.5 s: not yet
    assert kinds(facts, 0.8) == ["buffering"]
    passed = StreamFacts(0.0, upstream=Side(SMOOTH[:10]), client=Side(SMOOTH[:10]))
    assert "buffering" not in kinds(passed, 0.8)


def test_a_stall_is_nothing_on_either_side() -> None:
    facts = StreamFacts(
        0.0,
        upstream=Side(SMOOTH[:5], first_byte=0.1, last_byte=0.4),
        client=Side(SMOOTH[:5], first_byte=0.1, last_byte=0.4),
    )
    assert kinds(facts, 2.0) == []
    assert kinds(facts, 2.5) == ["stall"]
    done = StreamFacts(
        0.0,
        upstream=Side(SMOOTH[:5], done=True, last_byte=0.4),
        client=Side(SMOOTH[:5], done=True, last_byte=0.4),
        upstream_closed=0.5,
    )
    assert kinds(done, 10.0) == []


def test_a_cut_is_an_end_before_the_terminal_event() -> None:
    facts = StreamFacts(
        0.0,
        upstream=Side(SMOOTH[:8], last_byte=0.55),
        client=Side(SMOOTH[:8], last_byte=0.55),
        client_end=("sent_rst", 0.6),
    )
    found = classify(facts, 0.7)
    assert [f.kind for f in found] == ["cut"]
    assert "an RST" in found[0].words and "8 of the upstream's 8" in found[0].words
    assert ending(facts) == "RST"
    fin = StreamFacts(0.0, client=Side(SMOOTH[:8]), client_end=("sent_fin", 0.6))
    assert ending(fin) == "truncated (FIN)"
    # the client hanging up first is not the path's cut
    left = StreamFacts(0.0, client=Side(SMOOTH[:8]), client_end=("sent_fin", 0.6), client_left=0.55)
    assert "cut" not in kinds(left, 0.7)


def test_a_lost_cancellation_is_an_upstream_that_keeps_going() -> None:
    base = StreamFacts(
        0.0,
        upstream=Side(SMOOTH, last_byte=SMOOTH[-1]),
        client=Side(SMOOTH[:4], last_byte=0.35),
        client_left=0.4,
    )
    assert kinds(base, 1.0) == []  # the upstream may still be told: not yet 1 s
    found = classify(base, 1.5)
    assert [f.kind for f in found] == ["lost cancellation"]
    assert "15 tokens nobody reads" in found[0].words
    cancelled = StreamFacts(
        0.0,
        upstream=Side(SMOOTH[:5]),
        client=Side(SMOOTH[:4]),
        client_left=0.4,
        upstream_closed=0.45,
    )
    assert kinds(cancelled, 5.0) == []


# ------------------------------------------------------------------ the live model

HEAD = b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ntransfer-encoding: chunked\r\n\r\n"
REQUEST = b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Length: 2\r\n\r\n{}"
EVENT = b'data: {"choices":[{"index":0,"delta":{"content":"hi"}}]}\n\n'


def chunk(data: bytes) -> bytes:
    return f"{len(data):x}\r\n".encode() + data + b"\r\n"


def tracked(model: ConsoleModel, cid: int, now: float) -> ConnectionJournal:
    """A connection's journal (the relay's observer for it), tracked by the model."""
    journal = ConnectionJournal(cid, now, capture=True)
    model.track(cid, "nginx-default", journal, now)
    return journal


def requested(journal: ConnectionJournal, now: float) -> None:
    journal.read("client", Direction.UPSTREAM, REQUEST, now)
    journal.wrote("upstream", Direction.UPSTREAM, REQUEST, now)


def test_the_model_frames_both_sides_and_names_buffering() -> None:
    model = ConsoleModel()
    journal = tracked(model, 7, 100.0)
    requested(journal, 100.0)
    journal.read("upstream", Direction.DOWNSTREAM, HEAD, 100.1)
    body = b""
    for i in range(10):
        journal.read("upstream", Direction.DOWNSTREAM, chunk(EVENT), 100.2 + 0.05 * i)
        body += chunk(EVENT)
    tail = chunk(b"data: [DONE]\n\n") + b"0\r\n\r\n"
    journal.read("upstream", Direction.DOWNSTREAM, tail, 100.7)
    journal.fault(FaultReport("proxy_buffering", 100.2, "held", {}))
    model.refresh()
    live = model.listing(101.0)["connections"][0]
    assert live["tokens"] == {"upstream": 10, "client": 0}
    assert live["kinds"] == ["buffering"] and live["state"] == "open"
    assert live["faults"] == 1 and live["bytes"]["request"] == len(REQUEST)
    journal.wrote("client", Direction.DOWNSTREAM, HEAD + body + tail, 101.0)
    journal.ended("client", Direction.DOWNSTREAM, "sent_fin", 101.1)
    journal.ended("upstream", Direction.UPSTREAM, "sent_fin", 101.1)
    done = model.stream(7, 101.2)
    assert done is not None
    assert done["fault_marks"] == [{"at": 0.2, "fault": "proxy_buffering", "action": "held"}]
    assert done["done"] == {"upstream": True, "client": True}
    assert done["ending"] == "complete" and done["state"] == "done"
    assert done["kinds"] == ["buffering"]
    assert done["sides"]["upstream"]["ttft"] == 0.2 and done["sides"]["client"]["ttft"] == 1.0
    assert done["sides"]["client"]["largest_gap"] == 1.0


def test_only_the_newest_streams_are_framed_until_a_page_opens_one() -> None:
    model = ConsoleModel(max_framed=2)
    journals = [tracked(model, cid, 0.0) for cid in (1, 2, 3)]
    for journal in journals:
        requested(journal, 0.0)
        journal.read("upstream", Direction.DOWNSTREAM, HEAD + chunk(EVENT), 0.1)
    model.refresh()
    listed = {c["id"]: c for c in model.listing(0.2)["connections"]}
    assert [listed[cid]["framed"] for cid in (1, 2, 3)] == [False, True, True]
    assert listed[1]["tokens"]["upstream"] == 0 and listed[1]["bytes"]["upstream"] > 0
    assert "open this one" in listed[1]["words"][0] and listed[1]["kinds"] == []
    opened = model.stream(1, 0.2)  # framed from its first captured byte
    assert opened is not None and opened["framed"]
    assert opened["tokens"]["upstream"] == 1
    # what a page's detail request read moves the version the feed watches
    version = model.version
    journals[0].ended("client", Direction.DOWNSTREAM, "sent_rst", 0.3)
    assert model.stream(1, 0.3) is not None and model.version == version + 1


def test_a_long_stream_keeps_its_shape_within_bounds(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(model_module, "MAX_TIMES", 100)
    model = ConsoleModel()
    journal = tracked(model, 1, 0.0)
    journal.max_capture_bytes = 1 << 30
    requested(journal, 0.0)
    journal.read("upstream", Direction.DOWNSTREAM, HEAD, 0.01)
    for i in range(1000):
        journal.read("upstream", Direction.DOWNSTREAM, chunk(EVENT), 0.02 + 0.001 * i)
        if i % 50 == 0:
            model.refresh()
    live = model.stream(1, 2.0)
    assert live is not None
    state = model.connections[1].sides["upstream"]
    assert live["tokens"]["upstream"] == 1000  # the count stays exact
    assert len(state.tokens) <= 100 and len(state.starts) <= 100
    assert state.tokens[0] == pytest.approx(0.02) and state.tokens[-1] == pytest.approx(1.019)
    frames = model.connections[1].frames
    assert frames is not None
    record = frames["upstream"].record
    assert not any(record.events.values()) and not any(record.heads.values())  # read once


def test_the_model_keeps_the_newest_connections() -> None:
    model = ConsoleModel(max_connections=3)
    for cid in range(1, 6):
        journal = tracked(model, cid, float(cid))
        if cid == 2:
            journal.ended("client", Direction.DOWNSTREAM, "sent_fin", 2.5)
            journal.ended("upstream", Direction.UPSTREAM, "sent_fin", 2.5)
            model.refresh()
    # the closed one went first, then the oldest open ones
    assert list(model.connections) == [3, 4, 5]
    assert model.forgotten == 2
