"""The SSE framer's bounds: a line or an event over its limit stops the parsing of that
body, everything from its first byte comes out unparsed (OVERFLOW) and nothing more is
held; at the limit, and on every ordinary stream, nothing changes."""

from __future__ import annotations

import itertools

import pytest

from middlebox.core.framed import FramedStream, LegRecord
from middlebox.core.http1 import LAST_CHUNK_BYTES, encode_chunk
from middlebox.core.sse import UNBOUNDED, SseFramer, SseKind, SseLimits, SsePiece
from middlebox.core.stream import Direction
from tests.core.test_sse import VLLM_FRAMES

LIMITS = SseLimits(line=16, event=40)
HEAD = b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ntransfer-encoding: chunked\r\n\r\n"


def feed_all(framer: SseFramer, parts: list[bytes]) -> list[SsePiece]:
    pieces: list[SsePiece] = []
    for part in parts:
        pieces += framer.feed(part)
    return pieces


def events(pieces: list[SsePiece]) -> list[str]:
    return [p.event.data for p in pieces if p.event is not None]


def test_a_line_over_the_limit_comes_out_unparsed_and_nothing_is_held() -> None:
    framer = SseFramer(LIMITS)
    first = b"data: one\n\n"
    pieces = framer.feed(first + b"data: " + b"x" * 10)  # 16 bytes: at the limit, held
    assert events(pieces) == ["one"]
    assert framer.buffered == 16 and framer.overflowed is None
    pieces = framer.feed(b"x")  # 17: over
    assert [(p.kind, p.field, p.offset, p.data) for p in pieces] == [
        (SseKind.OVERFLOW, "line", len(first), b"data: " + b"x" * 11)
    ]
    assert framer.overflowed == "line"
    assert framer.buffered == 0 and not framer.in_event and not framer.mid_line
    # everything after passes as it comes, unparsed, even what looks like events
    for more in (b"x" * 1000, b"\n\ndata: two\n\n", b""):
        pieces = framer.feed(more)
        assert [p.data for p in pieces] == ([more] if more else [])
        assert all(p.kind is SseKind.OVERFLOW for p in pieces)
        assert framer.buffered == 0
    assert framer.events == 1
    assert framer.feed_eof() == [] and not framer.truncated
    assert framer.offset == framer.received


def test_an_event_over_the_limit_many_lines_and_no_blank_line() -> None:
    framer = SseFramer(LIMITS)
    pieces = feed_all(framer, [b"data: 1234\n"] * 3)  # 33 bytes of block: within 40
    assert [p.kind for p in pieces] == [SseKind.FIELD] * 3
    assert framer.in_event and framer.overflowed is None
    pieces = framer.feed(b"data: 1234\n")  # 44: over
    assert [(p.kind, p.field, p.offset, p.data) for p in pieces] == [
        (SseKind.OVERFLOW, "event", 33, b"data: 1234\n")
    ]
    assert framer.overflowed == "event" and not framer.in_event
    assert events(framer.feed(b"\n")) == []  # the block that overflowed dispatches nothing
    assert framer.events == 0


def test_a_pending_line_that_would_pass_the_event_bound_overflows_before_it_ends() -> None:
    framer = SseFramer(LIMITS)
    framer.feed(b": ping\n" * 4)  # comments count: 28 bytes of block
    pieces = framer.feed(b"data: 1234567")  # 28 + 13 > 40, the line itself under 16
    assert [(p.kind, p.field) for p in pieces] == [(SseKind.OVERFLOW, "event")]
    assert framer.buffered == 0


@pytest.mark.parametrize("ending", [b"\n", b"\r\n", b"\r"])
def test_a_line_and_an_event_exactly_at_their_limits_are_parsed(ending: bytes) -> None:
    line = b"data: " + b"y" * 10  # 16 bytes without its ending
    event = b"data: 12" + ending  # with the line: 16 + 8 + 2 * len(ending)
    limits = SseLimits(line=16, event=len(line) + len(ending) + len(event))
    framer = SseFramer(limits)
    pieces = feed_all(framer, [line + ending + event + ending, b""])
    pieces += framer.feed_eof()  # a held CR is a line end at EOF
    assert framer.overflowed is None
    assert events(pieces) == ["y" * 10 + "\n12"]
    one_more = SseFramer(SseLimits(line=16, event=limits.event - 1 if limits.event else None))
    pieces = one_more.feed(line + ending + event + ending)
    assert one_more.overflowed == "event" and events(pieces) == []


def test_the_pieces_are_the_same_however_the_input_is_split() -> None:
    stream = b"data: ok\n\n: c\ndata: " + b"z" * 20 + b"\n\ndata: after\n\n"
    whole = SseFramer(LIMITS).feed(stream)
    before = [p for p in whole if p.kind is not SseKind.OVERFLOW]
    assert events(whole) == ["ok"] and whole[-1].kind is SseKind.OVERFLOW
    for a, b in itertools.combinations(range(1, len(stream)), 2):
        framer = SseFramer(LIMITS)
        pieces = feed_all(framer, [stream[:a], stream[a:b], stream[b:]])
        assert [p for p in pieces if p.kind is not SseKind.OVERFLOW] == before
        assert b"".join(p.data for p in pieces) == stream
        assert framer.overflowed == "line"


def test_an_endless_line_holds_at_most_the_limit() -> None:
    framer = SseFramer(SseLimits(line=64 * 1024, event=64 * 1024))
    sent = 0
    for _ in range(400):  # 25 MiB in 64 KiB reads
        sent += len(b"".join(p.data for p in framer.feed(b"x" * 65536)))
        assert framer.buffered <= 64 * 1024
    assert framer.overflowed == "line"
    assert sent == framer.received == 400 * 65536


def test_ordinary_streams_are_framed_as_without_bounds() -> None:
    body = b"".join(VLLM_FRAMES) + b": ping\n\nid: 3\nevent: x\ndata: a\r\ndata: b\r\n\r\n"
    longest = max(len(line) for line in body.splitlines())
    for limits in (SseLimits(), SseLimits(line=longest, event=max(map(len, VLLM_FRAMES)))):
        for size in (1, 7, 64, len(body)):
            parts = [body[i : i + size] for i in range(0, len(body), size)]
            bounded, free = SseFramer(limits), SseFramer(UNBOUNDED)
            assert feed_all(bounded, parts) == feed_all(free, parts)
            assert bounded.feed_eof() == free.feed_eof()
            assert bounded.overflowed is None


def test_the_bound_is_per_response_on_a_framed_stream() -> None:
    """A kept-alive connection: the first response overflows, the next is parsed."""
    endless = encode_chunk(b"data: " + b"x" * 100) + LAST_CHUNK_BYTES
    normal = encode_chunk(b"data: fine\n\n") + LAST_CHUNK_BYTES
    stream = FramedStream(Direction.DOWNSTREAM, sse_limits=LIMITS)
    lines: list[SsePiece] = []
    stream.listen(lambda framed: lines.extend(framed.lines))
    stream.feed(HEAD + endless + HEAD + normal)
    assert [(p.kind, p.field) for p in lines] == [
        (SseKind.OVERFLOW, "line"),
        (SseKind.FIELD, "data"),
        (SseKind.BLANK, None),
    ]
    assert lines[0].data == b"data: " + b"x" * 100
    assert events(lines) == ["fine"]


def test_a_framed_stream_bounds_sse_at_one_mebibyte_by_default() -> None:
    assert FramedStream(Direction.DOWNSTREAM).sse_limits == SseLimits(1 << 20, 1 << 20)


def test_the_journal_s_leg_record_keeps_one_body_segment_between_events() -> None:
    """A long stream fed in many reads: the record of where each read starts in the body
    is kept only while an event is open, so it does not grow with the stream, and the
    events still get their stream offsets."""
    requests, responses = FramedStream(Direction.UPSTREAM), FramedStream(Direction.DOWNSTREAM)
    record = LegRecord().listen(requests, responses)
    event = b"data: %d\n\n"
    responses.feed(HEAD + encode_chunk(event % 0))
    offset = len(HEAD) + len(encode_chunk(event % 0))
    for i in range(1, 1000):
        wire = encode_chunk(event % i)
        responses.feed(wire[:5])  # each event split over two reads
        responses.feed(wire[5:])
        assert record.events[Direction.DOWNSTREAM][-1][1] == offset + wire.index(b"data")
        offset += len(wire)
        assert len(record._segments[0]) == 1
    endless = encode_chunk(b"data: " + b"x" * 2000)
    limited = FramedStream(Direction.DOWNSTREAM, sse_limits=SseLimits(100, 100))
    record = LegRecord().listen(FramedStream(Direction.UPSTREAM), limited)
    limited.feed(HEAD)
    for _ in range(100):
        limited.feed(endless)
    assert len(record._segments[0]) == 1
