"""set_header steps aside for response bodies (`Fault.body_aside`): the pipeline passes
it over for bytes that are all body of the response under way at its place, keeps its
reader in step and publishes the pieces for it (moved by what its head rewrites added),
so the journal's client leg and the faults nearer the client read every body piece. These
pin what that must keep: every answer of a keep-alive or pipelined connection rewritten,
interim and bodiless answers handled as before, the client leg carrying every body piece,
and the same bytes and pieces as a set_header given every item, over every split.
"""

from __future__ import annotations

import random

from faults.idle_reaper import IdleReaper
from faults.latency import Latency
from faults.set_header import SetHeader
from faults.testing import TimedItem, replay
from middlebox.core.fault import Fault, FaultContext, Pipeline
from middlebox.core.framed import LegRecord, PathFraming
from middlebox.core.stream import DOWN, UP, Chunk, Direction, Eof, Item
from tests.faults.httpprops import SSE_HEAD, request, spread_splits, sse_chunks

BARE_HEAD = SSE_HEAD.replace(b"x-accel-buffering: no\r\n", b"")
SET = b"X-Accel-Buffering: no\r\n"
LENGTH_HEAD = b"HTTP/1.1 200 OK\r\nContent-Length: 5\r\n\r\n"


def with_field(head: bytes) -> bytes:
    """`head` as set_header sends it on: the field appended before the blank line."""
    return head[:-2] + SET + b"\r\n"


def bench_path() -> tuple[Pipeline, SetHeader, list[Item]]:
    """`make bench`'s three faults; the items set_header is given are recorded."""
    header = SetHeader()
    return recorded(header)


def recorded(header: SetHeader) -> tuple[Pipeline, SetHeader, list[Item]]:
    given: list[Item] = []
    inner = header.on_item

    def on_item(item: Item, now: float) -> list[Item]:
        given.append(item)
        assert header.aside == frozenset()  # never passed over for requests
        return inner(item, now)

    header.on_item = on_item  # type: ignore[method-assign]
    faults: list[Fault] = [Latency(delay=0.0), header, IdleReaper(timeout=600.0)]
    return Pipeline(faults), header, given


def down_bytes(out: list[TimedItem]) -> bytes:
    return b"".join(i.data for _, i in out if isinstance(i, Chunk) and i.direction is DOWN)


def test_every_response_byte_of_a_keep_alive_connection_reaches_it_and_each_head_is_rewritten() -> (
    None
):
    pipeline, header, given = bench_path()
    body = sse_chunks(3)
    timeline: list[TimedItem] = [
        (0.0, Chunk(UP, request())),
        (0.1, Chunk(DOWN, BARE_HEAD)),
        *[(0.2 + i / 10, Chunk(DOWN, chunk)) for i, chunk in enumerate(body)],
        (1.0, Chunk(UP, request(path="/v1/completions"))),
        (1.1, Chunk(DOWN, LENGTH_HEAD + b"hel")),
        (1.2, Chunk(DOWN, b"lo")),
    ]
    out = replay(pipeline, timeline)
    assert down_bytes(out) == (
        with_field(BARE_HEAD) + b"".join(body) + with_field(LENGTH_HEAD) + b"hello"
    )
    # the body's bytes pass it by, a Content-Length body's last ones too: it is given
    # the heads and a chunked body's last chunk
    assert [i for i in given if i.direction is DOWN] == [
        Chunk(DOWN, BARE_HEAD),
        Chunk(DOWN, body[-1]),
        Chunk(DOWN, LENGTH_HEAD + b"hel"),
    ]
    assert body[-1] == b"0\r\n\r\n"
    assert [r.details["message"] for r in header.reports] == [0, 1]
    assert header.aside == frozenset()


def test_a_pipelined_pair_has_both_heads_rewritten_though_no_request_comes_between() -> None:
    pipeline, header, _ = bench_path()
    first = BARE_HEAD + b"".join(sse_chunks(2))
    out = replay(
        pipeline,
        [
            (0.0, Chunk(UP, request() + request(path="/v1/completions"))),
            (0.1, Chunk(DOWN, first[:120])),
            (0.2, Chunk(DOWN, first[120:] + LENGTH_HEAD[:10])),
            (0.3, Chunk(DOWN, LENGTH_HEAD[10:] + b"hello")),
        ],
    )
    assert (
        down_bytes(out)
        == with_field(first[: len(BARE_HEAD)])
        + first[len(BARE_HEAD) :]
        + with_field(LENGTH_HEAD)
        + b"hello"
    )
    assert [r.details["message"] for r in header.reports] == [0, 1]


def test_bodiless_and_interim_answers_are_handled_as_before() -> None:
    # HEAD's answer has a length but no body; a 304 none; a 100 is interim (left alone),
    # its final answer rewritten; each next head follows at once.
    pipeline, header, _ = bench_path()
    head_answer = b"HTTP/1.1 200 OK\r\nContent-Length: 99\r\n\r\n"
    not_modified = b"HTTP/1.1 304 Not Modified\r\nETag: x\r\n\r\n"
    interim = b"HTTP/1.1 100 Continue\r\n\r\n"
    out = replay(
        pipeline,
        [
            (0.0, Chunk(UP, request(method="HEAD"))),
            (0.1, Chunk(DOWN, head_answer)),
            (0.2, Chunk(UP, request(method="GET"))),
            (0.3, Chunk(DOWN, not_modified)),
            (0.4, Chunk(UP, request())),
            (0.5, Chunk(DOWN, interim + LENGTH_HEAD + b"hello")),
        ],
    )
    assert (
        down_bytes(out)
        == (with_field(head_answer) + with_field(not_modified) + interim + with_field(LENGTH_HEAD))
        + b"hello"
    )
    assert [r.details["message"] for r in header.reports] == [0, 1, 2]


def frame_sse(framing: PathFraming) -> None:
    """Frame event-stream bodies as SSE on every stream, before any byte (as for a fault
    that reads SSE), so a listener on the client leg sees the events it carries."""
    for stream in framing.streams:
        stream.sse = True


def test_the_client_leg_it_publishes_to_carries_every_body_piece() -> None:
    # Nothing feeds the stream after it but its publish, passed over or not.
    pipeline, header, _ = bench_path()
    pipeline.bind(FaultContext(rng=random.Random(0)))
    framing = pipeline.framing
    assert framing is not None
    frame_sse(framing)
    record = LegRecord().listen(*framing.leg("client"))
    pipeline.on_open(0.0)
    pipeline.on_item(Chunk(UP, request()), 0.0)
    pipeline.on_item(Chunk(DOWN, BARE_HEAD), 0.1)
    body = sse_chunks(4)
    for index, chunk in enumerate(body):
        pipeline.on_item(Chunk(DOWN, chunk), 0.2 + index / 10)
    pipeline.on_item(Eof(DOWN), 1.0)
    position = header.context.framing
    assert position is not None and framing.leg("client")[1] is position.publish[DOWN]
    assert len(record.events[Direction.DOWNSTREAM]) == 5  # four frames and [DONE]
    assert record.ends[Direction.DOWNSTREAM] == [
        (0, len(with_field(BARE_HEAD)) + len(b"".join(body)))
    ]
    assert header.aside == frozenset()


def client_leg(
    header: SetHeader, reads: list[bytes], aside: bool
) -> tuple[bytes, list[object], int]:
    """The bytes out, the client leg's pieces (kind, message, offset, data, SSE lines) and
    how many response items set_header was given, with its body aside or without."""
    pipeline = Pipeline([Latency(delay=0.0), header, IdleReaper(timeout=600.0)])
    pipeline.bind(FaultContext(rng=random.Random(0)))
    if not aside:
        header.body_aside = None
    framing = pipeline.framing
    assert framing is not None
    frame_sse(framing)
    pieces: list[object] = []
    framing.leg("client")[1].listen(
        lambda e: pieces.append(
            (e.piece.kind, e.piece.message, e.piece.offset, e.piece.data, e.lines)
        )
    )
    calls = 0
    inner = header.on_item

    def counted(item: Item, now: float) -> list[Item]:
        nonlocal calls
        calls += item.direction is DOWN
        return inner(item, now)

    header.on_item = counted  # type: ignore[method-assign]
    out: list[Item] = list(pipeline.on_open(0.0))
    out += pipeline.on_item(Chunk(UP, request() + request(path="/v1/completions")), 0.0)
    for step, data in enumerate(reads):
        out += pipeline.on_item(Chunk(DOWN, data), 0.1 + step / 100)
    out += pipeline.on_item(Eof(DOWN), 1.0)
    sent = b"".join(i.data for i in out if isinstance(i, Chunk) and i.direction is DOWN)
    return sent, pieces, calls


def test_passed_over_or_given_every_item_the_bytes_and_the_client_legs_pieces_are_the_same() -> (
    None
):
    # Every two-way split and a spread of three-way splits of a keep-alive pair of answers
    # (an SSE stream, then a length body), and one read per chunk: the bytes out and the
    # pieces the leg after it hears, offsets and SSE lines included.
    body = sse_chunks(2)
    wire = BARE_HEAD + b"".join(body) + LENGTH_HEAD + b"hello"
    expected = with_field(BARE_HEAD) + b"".join(body) + with_field(LENGTH_HEAD) + b"hello"
    per_chunk = [BARE_HEAD, *body, LENGTH_HEAD, b"hel", b"lo"]
    splits = [per_chunk, *spread_splits(wire)]
    for reads in splits:
        sent, pieces, calls = client_leg(SetHeader(), reads, aside=True)
        assert (sent, pieces) == client_leg(SetHeader(), reads, aside=False)[:2], reads
        assert sent == expected
        assert calls <= len(reads) + 1
    # one read per chunk: the three body chunks before the last, "hel" and "lo" (the
    # length body's end) pass it by
    assert client_leg(SetHeader(), per_chunk, aside=True)[2] == len(per_chunk) + 1 - 5
