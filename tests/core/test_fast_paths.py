"""The cheaper faulted path (docs/performance.md) keeps every observable the same: pieces
made the fast way equal pieces made the ordinary way, and a head rewriter that nobody reads past
counts its shifted pieces instead of making them, with the same bytes and reports."""

from __future__ import annotations

import dataclasses
import random

import pytest

from faults.idle_reaper import IdleReaper
from faults.latency import Latency
from faults.set_header import SetHeader
from faults.sse_ids import SseIds
from faults.testing import replay
from middlebox.core.fault import Fault, FaultContext, FaultReport, Pipeline
from middlebox.core.framed import Framed, FramedStream
from middlebox.core.http1 import Piece, PieceKind, moved_piece, new_piece
from middlebox.core.stream import DOWN, UP, Chunk, Eof, Item


def test_a_piece_made_the_fast_way_equals_and_hashes_like_one_made_by_its_class() -> None:
    fast = new_piece(PieceKind.BODY, b"data: x\n\n", 2, 140, None, True)
    plain = Piece(PieceKind.BODY, b"data: x\n\n", 2, 140, None, True)
    assert fast == plain and hash(fast) == hash(plain) and repr(fast) == repr(plain)
    with pytest.raises(dataclasses.FrozenInstanceError):
        fast.offset = 0  # type: ignore[misc]
    assert moved_piece(plain, 35) == dataclasses.replace(plain, offset=175)


def test_pieces_nobody_reads_are_counted_as_publishing_them_would() -> None:
    pieces = [
        Framed(Piece(PieceKind.BODY, b"abc", 0, 100)),
        Framed(Piece(PieceKind.BODY, b"de", 0, 103)),
    ]
    published, counted = FramedStream(DOWN), FramedStream(DOWN)
    assert not published.read
    published.publish(pieces)
    counted.pass_unread(2, 105)
    assert (
        (counted.emitted, counted.received) == (published.emitted, published.received) == (105, 105)
    )
    published.reader()
    assert published.read


HEAD = b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nTransfer-Encoding: chunked\r\n\r\n"


def frame(index: int) -> bytes:
    event = b"data: %d\n\n" % index
    return b"%x\r\n" % len(event) + event + b"\r\n"


def keep_alive_timeline() -> list[tuple[float, Item]]:
    """Two streamed answers on one connection: the second head is rewritten too, after
    body pieces that were only counted."""
    out: list[tuple[float, Item]] = []
    at = 0.0
    for answer in range(2):
        out.append((at, Chunk(UP, b"GET /v1/%d HTTP/1.1\r\nHost: x\r\n\r\n" % answer)))
        out.append((at + 0.01, Chunk(DOWN, HEAD)))
        for index in range(5):
            at += 0.05
            out.append((at, Chunk(DOWN, frame(index))))
        out.append((at + 0.01, Chunk(DOWN, b"0\r\n\r\n")))
        at += 1.0
    out.append((at, Eof(UP)))
    out.append((at, Eof(DOWN)))
    return out


def run(faults: list[Fault]) -> tuple[list[tuple[float, Item]], list[FaultReport]]:
    reports: list[FaultReport] = []
    pipeline = Pipeline(faults)
    pipeline.bind(FaultContext(1, random.Random(0), reports.append))
    return replay(pipeline, keep_alive_timeline(), bind=False), reports


def rewrites(reports: list[FaultReport]) -> list[FaultReport]:
    return [r for r in reports if r.action == "rewrote_head"]


def client_bytes(out: list[tuple[float, Item]]) -> bytes:
    return b"".join(i.data for _, i in out if isinstance(i, Chunk) and i.direction is DOWN)


def test_a_rewriter_past_which_nobody_reads_counts_its_pieces_and_keeps_bytes_and_reports(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Past set_header, latency reads no pieces (they are counted); sse_ids reads them
    (they are made, shifted). set_header rewrites both heads of the keep-alive connection
    at the same offsets either way, and the client gets every byte of both answers."""
    calls: list[int] = []
    original = FramedStream.pass_unread

    def counting(stream: FramedStream, count: int, end: int) -> None:
        calls.append(count)
        original(stream, count, end)

    monkeypatch.setattr(FramedStream, "pass_unread", counting)
    counted, counted_reports = run([Latency(delay=0), SetHeader(), IdleReaper(timeout=30)])
    assert sum(calls) >= 2 * 5 * 3  # each frame's three pieces, counted, not made
    calls.clear()
    made, made_reports = run([SseIds(mode="add"), SetHeader(), IdleReaper(timeout=30)])
    assert calls == []
    second_head = len(HEAD) + 5 * len(frame(0)) + len(b"0\r\n\r\n")
    assert [r.details["offset"] for r in rewrites(counted_reports)] == [0, second_head]
    assert rewrites(counted_reports) == rewrites(made_reports)
    added = len(b"X-Accel-Buffering: no\r\n")
    upstream = b"".join(
        i.data for _, i in keep_alive_timeline() if isinstance(i, Chunk) and i.direction is DOWN
    )
    assert len(client_bytes(counted)) == len(upstream) + 2 * added
    assert client_bytes(counted).replace(b"X-Accel-Buffering: no\r\n", b"") == upstream
    assert client_bytes(made).count(b"X-Accel-Buffering: no\r\n") == 2


def chunk(event: bytes) -> bytes:
    return b"%x\r\n" % len(event) + event + b"\r\n"


@pytest.mark.parametrize(
    "head",
    [HEAD, HEAD.replace(b"\r\n\r\n", b"\r\nX-Accel-Buffering: no\r\n\r\n")],
    ids=["head rewritten", "head already right"],
)
def test_reads_that_end_inside_a_chunk_line_pass_byte_exact_in_order(head: bytes) -> None:
    """Regression: a read that starts with the end of the last read's unfinished chunk
    line and ends inside the next one carries as many bytes as its pieces, but not the
    same bytes; it must not pass as it came (a byte was lost, then sent twice)."""
    events = [chunk(b"data: %d%s\n\n" % (i, b"x" * 20)) for i in range(3)]
    body = b"".join(events) + b"0\r\n\r\n"
    first, second = len(events[0]) + 1, len(events[0]) + len(events[1]) + 1
    reads = [body[:first], body[first:second], body[second:]]
    timeline: list[tuple[float, Item]] = [(0.0, Chunk(UP, b"GET / HTTP/1.1\r\nHost: x\r\n\r\n"))]
    timeline += [(0.1, Chunk(DOWN, head))]
    timeline += [(0.2 + 0.1 * i, Chunk(DOWN, data)) for i, data in enumerate(reads)]
    out, _ = run_timeline([SetHeader()], timeline)
    expected = head.replace(b"\r\n\r\n", b"\r\nX-Accel-Buffering: no\r\n\r\n", 1)
    if b"X-Accel" in head:
        expected = head
    assert client_bytes(out) == expected + body


def run_timeline(
    faults: list[Fault], timeline: list[tuple[float, Item]]
) -> tuple[list[tuple[float, Item]], list[FaultReport]]:
    reports: list[FaultReport] = []
    pipeline = Pipeline(faults)
    pipeline.bind(FaultContext(1, random.Random(0), reports.append))
    return replay(pipeline, timeline, bind=False), reports
