"""Frame once: a connection's streams are framed by one pass each, which every HTTP-aware
fault in the path reads (middlebox/core/framed.py); the journal frames what each leg
carried (its captured bytes) once, off the hot path, and the scorer reads that."""

from __future__ import annotations

import random
import re
from collections import Counter
from collections.abc import Iterator

import pytest
from hypothesis import given
from hypothesis import strategies as st

from faults.idle_reaper import IdleReaper
from faults.set_header import SetHeader
from faults.slicer import Slicer
from faults.sse_ids import SseIds
from faults.testing import joined, replay
from middlebox.core.fault import FaultContext, Pipeline
from middlebox.core.framed import REQUEST_BODIES_KEPT, FramedStream, LegRecord
from middlebox.core.http1 import REQUEST_BODY_KEEP, Http1Framer, encode_chunk
from middlebox.core.sse import SseFramer
from middlebox.core.stream import DOWN, UP, Chunk, Direction, Eof, Item
from middlebox.observe.journal import JournalStore
from middlebox.run.score import analyse_upstream_leg

REQUEST = (
    b"POST /v1/chat/completions HTTP/1.1\r\nHost: up\r\nContent-Type: application/json\r\n"
    b'Content-Length: 14\r\n\r\n{"model": "m"}'
)
HEAD = b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nTransfer-Encoding: chunked\r\n\r\n"


def frame(index: int) -> bytes:
    return encode_chunk(b'data: {"choices":[{"delta":{"content":"t%d"}}]}\n\n' % index)


def timeline() -> list[tuple[float, Item]]:
    """A request, then a chunked event stream of four events and [DONE], then FINs."""
    downstream = [HEAD, *(frame(i) for i in range(4)), encode_chunk(b"data: [DONE]\n\n")]
    items: list[tuple[float, Item]] = [(0.0, Chunk(UP, REQUEST))]
    items += [(0.1 * (i + 1), Chunk(DOWN, data)) for i, data in enumerate(downstream)]
    items += [(1.0, Chunk(DOWN, b"0\r\n\r\n")), (1.1, Eof(DOWN)), (1.2, Eof(UP))]
    return items


@pytest.fixture
def framing_passes(monkeypatch: pytest.MonkeyPatch) -> Iterator[Counter[str]]:
    """Counts the bytes fed to every HTTP/1.1 and SSE framer, per framer role."""
    fed: Counter[str] = Counter()
    http_feed, sse_feed = Http1Framer.feed, SseFramer.feed

    def counting_http(self: Http1Framer, data: bytes) -> list:  # type: ignore[type-arg]
        fed[f"http.{self.role}"] += len(data)
        fed[f"http.{self.role}.framers.{id(self)}"] = 1
        return http_feed(self, data)

    def counting_sse(self: SseFramer, data: bytes) -> list:  # type: ignore[type-arg]
        fed["sse"] += len(data)
        return sse_feed(self, data)

    monkeypatch.setattr(Http1Framer, "feed", counting_http)
    monkeypatch.setattr(SseFramer, "feed", counting_sse)
    yield fed


def framers(fed: Counter[str], role: str) -> int:
    return sum(1 for key in fed if key.startswith(f"http.{role}.framers."))


def three_http_faults() -> Pipeline:
    """set_header nearest the client, sse_ids, idle_reaper nearest the server."""
    return Pipeline([SetHeader(), SseIds(mode="add"), IdleReaper(timeout=30)])


def run_with_journal(
    pipeline: Pipeline, written_down: int | None = None
) -> tuple[JournalStore, list[tuple[float, Item]]]:
    """Replay through `pipeline` with a journal as the proxy keeps one (its fault sink),
    and record each leg's bytes in the journal as the relay would (read in, written out).
    `written_down`: how many of the chunks the pipeline emits toward the client were
    written before the client's side reset (None: all of them)."""
    store = JournalStore(capture=True, clock_offset=0.0)
    journal = store.observer(1, 0.0, "frame-once")
    pipeline.bind(FaultContext(1, random.Random(0), store.fault_sink(1)))
    out = replay(pipeline, timeline(), bind=False)
    for at, item in timeline():
        if isinstance(item, Chunk):
            leg = "client" if item.direction is UP else "upstream"
            journal.read(leg, item.direction, item.data, at)
    down = 0
    for at, item in out:
        if isinstance(item, Chunk):
            if item.direction is DOWN:
                down += 1
                if written_down is not None and down > written_down:
                    continue
            leg = "upstream" if item.direction is UP else "client"
            journal.wrote(leg, item.direction, item.data, at)
    return store, out


def test_three_http_faults_frame_each_stream_once_and_the_journal_each_leg_once(
    framing_passes: Counter[str],
) -> None:
    store, out = run_with_journal(three_http_faults())
    journal = store.journals[1]
    # The request stream: no fault changes it, so both legs share one pass over its bytes.
    assert framers(framing_passes, "request") == 1
    assert framing_passes["http.request"] == len(REQUEST)
    # The response stream: one pass over the upstream leg (what the server sent) and one
    # over sse_ids' new bytes; set_header knows what it wrote and hands its pieces on,
    # so the client leg is not framed again.
    upstream_bytes = len(joined(timeline(), DOWN))
    client_bytes = len(joined(out, DOWN))
    assert framers(framing_passes, "response") == 2
    head_growth = len(b"X-Accel-Buffering: no\r\n")
    assert framing_passes["http.response"] == upstream_bytes + client_bytes - head_growth
    before = framing_passes.copy()
    lines = journal.to_lines()
    # Off the hot path, the journal frames each leg's captured bytes once...
    assert framers(framing_passes, "request") - framers(before, "request") == 2
    assert framers(framing_passes, "response") - framers(before, "response") == 2
    framed = framing_passes.copy()
    journal.to_lines()
    counts = analyse_upstream_leg(journal.leg("upstream"))
    assert framing_passes == framed  # ...and keeps it: the scorer reads, it does not frame
    events = [line for line in lines if line["type"] == "sse_event"]
    assert Counter(e["leg"] for e in events) == {"upstream": 5, "client": 5}
    assert [e["id"] for e in events if e["leg"] == "client"] == ["1", "2", "3", "4", "5"]
    heads = [line for line in lines if line["type"] == "http_head" and line["leg"] == "client"]
    assert ["X-Accel-Buffering", "no"] in heads[1]["headers"]
    assert counts == {
        "heartbeats": 0,
        "usage_reported": 0,
        "inband_errors": 0,
        "x_accel_buffering_no": 0,
    }


def test_a_leg_holds_what_crossed_it_not_what_the_faults_emitted_toward_it() -> None:
    # The head and two events reached the client before its side reset: the faults had
    # emitted all five (a `handoff` holding bytes through an outage, or a reset
    # discarding what was unsent, ends the same way), the client leg shows two.
    store, _ = run_with_journal(three_http_faults(), written_down=3)
    lines = store.journals[1].to_lines()
    events = [line for line in lines if line["type"] == "sse_event"]
    assert [e["id"] for e in events if e["leg"] == "client"] == ["1", "2"]
    assert sum(e["leg"] == "upstream" for e in events) == 5
    ends = [line for line in lines if line["type"] == "http_end" and line["leg"] == "client"]
    assert [end["direction"] for end in ends] == ["upstream"]  # the response never ended


def test_pass_through_frames_nothing_until_the_journal_is_read(
    framing_passes: Counter[str],
) -> None:
    store, _ = run_with_journal(Pipeline([Slicer(size=7)]))
    assert not framing_passes  # no HTTP-aware fault: the hot path frames nothing
    journal = store.journals[1]
    journal.to_lines()
    passes = framing_passes.copy()
    assert framers(passes, "request") == framers(passes, "response") == 2  # once per leg
    journal.to_lines()
    analyse_upstream_leg(journal.leg("upstream"))
    assert framing_passes == passes  # framed once and kept


def test_a_slicer_in_front_splits_bodies_but_not_heads_for_the_faults_past_it() -> None:
    pipeline = Pipeline([SetHeader(), Slicer(size=5), SseIds(mode="add")])
    whole = Pipeline([SetHeader(), SseIds(mode="add")])
    assert joined(replay(pipeline, timeline()), DOWN) == joined(replay(whole, timeline()), DOWN)


@given(st.lists(st.integers(1, 40), min_size=1, max_size=12))
def test_readers_get_the_pieces_a_framer_of_their_own_would_give(sizes: list[int]) -> None:
    data = HEAD + b"".join(frame(i) for i in range(3)) + b"0\r\n\r\n"
    stream = FramedStream(Direction.DOWNSTREAM)
    shared = stream.reader()
    stream.feed(data)  # framed once, ahead of the reader
    own = Http1Framer("response")
    position = 0
    for size in [*sizes, len(data)]:
        piece_bytes = data[position : position + size]
        position += len(piece_bytes)
        got = [f.piece for f in shared.advance(len(piece_bytes))]
        assert got == own.feed(piece_bytes)


def test_a_leg_record_from_bytes_is_one_pass_that_keeps_heads_events_and_ends() -> None:
    body = b"".join(frame(i) for i in range(2)) + b"0\r\n\r\n"
    record = LegRecord.from_bytes(REQUEST, HEAD + body)
    assert [h[3].status for h in record.heads[DOWN]] == [200]
    assert [event.index for _, _, event in record.events[DOWN]] == [0, 1]
    assert record.ends[DOWN] == [(0, len(HEAD + body))]
    assert record.request_body(0) == b'{"model": "m"}'


def test_a_long_event_stream_keeps_its_event_offsets_with_constant_bookkeeping() -> None:
    """A live leg record on one endless SSE response: each event's stream offset is right
    when events span pieces, and the record keeps no per-piece state past the last event
    (a day-long stream feeds it millions of pieces)."""
    requests, responses = FramedStream(UP), FramedStream(DOWN)
    requests.responses_to.append(responses)
    responses.tunnels.append(requests)
    record = LegRecord().listen(requests, responses)
    requests.feed(REQUEST)
    body = b"".join(frame(i) for i in range(3000))
    wire = HEAD + body
    rng = random.Random(7)
    position = len(HEAD + frame(0))
    responses.feed(wire[:position])  # the first event whole: the body's first piece has lines
    longest = 0
    while position < len(wire):
        size = rng.randint(1, 90)  # events split across pieces, several events in one
        responses.feed(wire[position : position + size])
        position += size
        longest = max(longest, len(record._segments.get(0, [])))
    starts = [m.start() for m in re.finditer(rb"data: ", wire)]
    assert [where for _, where, _ in record.events[DOWN]] == starts[:3000]
    # a piece's start is kept only until an event ends in a later one: at most the pieces
    # one event's bytes span (pieces of 1 byte or more), not one per piece of the stream
    assert longest <= max(len(frame(i)) for i in range(3000)) + 1


def keep_alive_posts(count: int, body: bytes) -> bytes:
    head = b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Length: %d\r\n\r\n"
    return (head % len(body) + body) * count


def test_a_limited_leg_record_keeps_request_bodies_within_its_byte_bound() -> None:
    """A keep-alive client posting request after request (the journal's live record has a
    limit): the bodies kept total at most REQUEST_BODIES_KEPT, the newest kept whole."""
    body = b"x" * REQUEST_BODY_KEEP
    count = REQUEST_BODIES_KEPT // REQUEST_BODY_KEEP * 3
    record = LegRecord(limit=1_000_000)
    requests = FramedStream(UP)
    record.listen(requests, FramedStream(DOWN))
    requests.feed(keep_alive_posts(count, body))
    assert sum(map(len, record.request_bodies.values())) <= REQUEST_BODIES_KEPT
    assert record.request_body(count - 1) == body
    assert record.request_body(0) == b""  # the oldest went first
    # without a limit (a run's scorer over a finished leg) every body is kept
    whole = LegRecord.from_bytes(keep_alive_posts(200, body), b"")
    assert all(whole.request_body(m) == body for m in range(200))


def test_a_limited_leg_record_counts_comments_of_at_most_its_limit_of_responses() -> None:
    pings = b": ping\n\n"
    response = HEAD + encode_chunk(pings) + b"0\r\n\r\n"
    record = LegRecord.from_bytes(REQUEST * 50, response * 50, limit=20)
    assert len(record.comments) <= 20
    assert LegRecord.from_bytes(REQUEST * 50, response * 50).comments == dict.fromkeys(range(50), 1)
