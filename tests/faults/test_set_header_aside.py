"""set_header does not step aside (`Fault.aside`) for body bytes, and these are the reasons
and the cases a version that did would have to keep.

It reads the response stream at its place (its `Reader`, advanced by each item it is
given) and publishes the pieces of its output to the stream after it, which the journal's
client leg and any HTTP-reading fault nearer the client read. A fault passed over is
given nothing, and the pipeline feeds only the streams after non-publishing rewriters
(`Pipeline._fed_after`), so stepping aside after a head would leave both behind; the
tests below pin what must hold whoever changes that: every answer of a keep-alive or
pipelined connection rewritten, interim and bodiless answers handled as now, and the
client leg carrying every body piece.
"""

from __future__ import annotations

import random

from faults.idle_reaper import IdleReaper
from faults.latency import Latency
from faults.set_header import SetHeader
from faults.testing import TimedItem, replay
from middlebox.core.fault import Fault, FaultContext, Pipeline
from middlebox.core.framed import LegRecord
from middlebox.core.stream import DOWN, UP, Chunk, Direction, Eof, Item
from tests.faults.httpprops import SSE_HEAD, request, sse_chunks

BARE_HEAD = SSE_HEAD.replace(b"x-accel-buffering: no\r\n", b"")
SET = b"X-Accel-Buffering: no\r\n"
LENGTH_HEAD = b"HTTP/1.1 200 OK\r\nContent-Length: 5\r\n\r\n"


def with_field(head: bytes) -> bytes:
    """`head` as set_header sends it on: the field appended before the blank line."""
    return head[:-2] + SET + b"\r\n"


def bench_path() -> tuple[Pipeline, SetHeader, list[Item]]:
    """`make bench`'s three faults; the items set_header is given are recorded."""
    header = SetHeader()
    given: list[Item] = []
    inner = header.on_item

    def on_item(item: Item, now: float) -> list[Item]:
        given.append(item)
        assert header.aside == frozenset()  # never stepping aside, before or after a head
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
    assert [i for i in given if i.direction is DOWN] == [
        i for _, i in timeline if i.direction is DOWN
    ]
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


def test_the_client_leg_it_publishes_to_carries_every_body_piece() -> None:
    # What stepping aside would lose: nothing feeds the stream after it but its publish.
    pipeline, header, _ = bench_path()
    pipeline.bind(FaultContext(rng=random.Random(0)))
    framing = pipeline.framing
    assert framing is not None
    framing.want_sse()  # as the journal does
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
