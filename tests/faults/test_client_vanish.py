"""client_vanish: the upstream sees the client leave; the client hears nothing more."""

from __future__ import annotations

import random
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from faults.client_vanish import ClientVanish
from faults.testing import TimedItem, joined, replay
from middlebox.core.fault import FaultContext
from middlebox.core.stream import DOWN, UP, Chunk, Eof, Reset
from tests.faults.netprops import assert_deterministic, timelines


def test_after_n_bytes_the_upstream_gets_a_fin_and_the_client_hears_nothing_more() -> None:
    fault = ClientVanish(after_bytes=5)
    out = replay(
        fault,
        [
            (0.0, Chunk(DOWN, b"hello world")),
            (0.5, Chunk(UP, b"more request")),
            (1.0, Chunk(DOWN, b"tokens")),
            (2.0, Eof(DOWN)),
        ],
    )
    assert out == [(0.0, Chunk(DOWN, b"hello")), (0.0, Eof(UP))]
    assert [(r.time, r.action, r.details["offset"]) for r in fault.reports] == [
        (0.0, "vanished", 5)
    ]


def test_with_a_connection_limit_later_connections_pass_untouched() -> None:
    shared: dict[str, Any] = {}
    outputs = []
    for connection in range(3):
        fault = ClientVanish(at=1.0, connections=2)
        fault.bind(FaultContext(connection, random.Random(0), shared=shared))
        timeline: list[TimedItem] = [(0.5, Chunk(DOWN, b"a")), (2.0, Chunk(DOWN, b"b"))]
        outputs.append(replay(fault, timeline, bind=False))
    vanished = [(0.5, Chunk(DOWN, b"a")), (1.0, Eof(UP))]
    assert outputs == [vanished, vanished, [(0.5, Chunk(DOWN, b"a")), (2.0, Chunk(DOWN, b"b"))]]


def test_at_a_time_the_upstream_is_reset_and_the_client_can_be_reset_too() -> None:
    out = replay(
        ClientVanish(at=1.0, how="rst", client="reset"),
        [(0.5, Chunk(DOWN, b"a")), (2.0, Chunk(DOWN, b"b"))],
    )
    assert out == [(0.5, Chunk(DOWN, b"a")), (1.0, Reset(UP)), (1.0, Reset(DOWN))]


def test_a_closed_socket_answers_the_next_response_bytes_with_an_rst() -> None:
    fault = ClientVanish(at=1.0, how="close")
    out = replay(
        fault,
        [(1.5, Chunk(DOWN, b"late")), (2.0, Chunk(DOWN, b"later")), (3.0, Eof(DOWN))],
    )
    assert out == [(1.0, Eof(UP)), (1.5, Reset(UP))]
    assert [r.action for r in fault.reports] == ["vanished", "reset_by_closed_socket"]


def test_the_rest_of_the_write_that_crossed_the_mark_draws_the_rst_at_once() -> None:
    out = replay(ClientVanish(after_bytes=2, how="close"), [(0.0, Chunk(DOWN, b"abcd"))])
    assert out == [(0.0, Chunk(DOWN, b"ab")), (0.0, Eof(UP)), (0.0, Reset(UP))]


def test_a_client_that_already_left_does_not_vanish_again() -> None:
    fault = ClientVanish(at=1.0)
    timeline: list[TimedItem] = [(0.5, Eof(UP)), (0.75, Chunk(DOWN, b"tail")), (2.0, Eof(DOWN))]
    assert replay(fault, timeline) == timeline
    assert not fault.fired


@pytest.mark.parametrize(
    ("config", "message"),
    [
        ({}, "needs a trigger"),
        ({"at": 1.0, "how": "slam"}, "how must be one of"),
        ({"at": 1.0, "client": "polite"}, "client must be one of"),
        ({"after_bytes": -1}, "after_bytes must be >= 0"),
    ],
)
def test_bad_config_is_refused_with_a_clear_message(config: dict[str, Any], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        ClientVanish(**config)


@given(timelines(), st.integers(0, 60), st.sampled_from(["fin", "rst", "close"]))
def test_the_client_gets_exactly_the_bytes_before_the_mark_and_the_upstream_a_prefix(
    timeline: list[TimedItem], after_bytes: int, how: Any
) -> None:
    out = replay(ClientVanish(after_bytes=after_bytes, how=how), timeline)
    sent_down, got_down = joined(timeline, DOWN), joined(out, DOWN)
    assert got_down == sent_down[:after_bytes]
    assert joined(timeline, UP).startswith(joined(out, UP))
    upstream_ends = [
        item for _, item in out if item.direction is UP and not isinstance(item, Chunk)
    ]
    if len(sent_down) >= max(after_bytes, 1):  # the mark is checked as response bytes arrive
        assert upstream_ends[:1] == [Reset(UP) if how == "rst" else Eof(UP)]


@settings(max_examples=30)
@given(timelines(), st.integers(0, 2**32))
def test_the_same_input_vanishes_at_the_same_offset(timeline: list[TimedItem], seed: int) -> None:
    assert_deterministic(lambda: ClientVanish(after_bytes=7, how="close"), timeline, seed)


HEAD = b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nTransfer-Encoding: chunked\r\n\r\n"


def sse_chunk(number: int) -> bytes:
    event = b'data: {"n": %d}\n\n' % number
    return b"%x\r\n%s\r\n" % (len(event), event)


def test_after_n_events_a_write_carrying_many_events_is_split_after_the_nth() -> None:
    # A stalled vLLM sends dozens of frames in one write (one 21,871-byte read carried the
    # 5th to the 150th): the client must still vanish after the 12th, not after the write.
    frames = [sse_chunk(n) for n in range(40)]
    fault = ClientVanish(after_events=12)
    out = replay(
        fault,
        [(0.0, Chunk(DOWN, HEAD + b"".join(frames[:4]))), (1.0, Chunk(DOWN, b"".join(frames[4:])))],
    )
    down = b"".join(
        item.data for _, item in out if isinstance(item, Chunk) and item.direction is DOWN
    )
    assert down == HEAD + b"".join(frames[:12])
    assert out[-1] == (1.0, Eof(UP))
    assert [(r.action, r.details["event"]) for r in fault.reports] == [("vanished", 12)]


@given(st.lists(st.integers(min_value=1, max_value=900), max_size=12), st.integers(1, 20))
@settings(max_examples=60)
def test_the_client_vanishes_after_the_same_event_however_the_stream_is_written(
    cuts: list[int], after: int
) -> None:
    stream = HEAD + b"".join(sse_chunk(n) for n in range(20))
    points = sorted({c % len(stream) for c in cuts} - {0})
    writes = [stream[a:b] for a, b in zip([0, *points], [*points, len(stream)], strict=True)]
    fault = ClientVanish(after_events=after)
    out = replay(fault, [(float(i), Chunk(DOWN, w)) for i, w in enumerate(writes)])
    down = b"".join(
        item.data for _, item in out if isinstance(item, Chunk) and item.direction is DOWN
    )
    expected = HEAD + b"".join(sse_chunk(n) for n in range(after))
    # the event's chunk CRLF goes with it when it came in the same write
    assert down in (expected, expected[:-2])
    assert [r.details["event"] for r in fault.reports] == [after]


@pytest.mark.parametrize("after", [1, 5, 12])
def test_the_mark_is_the_same_wherever_one_write_ends_and_the_next_begins(after: int) -> None:
    # Every split point, chunk-size lines and the CRLF after a chunk's data included: the
    # framing reader holds an unfinished structural piece across writes, and the event's
    # end must still be measured in the write that completes it.
    stream = HEAD + b"".join(sse_chunk(n) for n in range(16))
    expected = HEAD + b"".join(sse_chunk(n) for n in range(after))
    for point in range(1, len(stream)):
        fault = ClientVanish(after_events=after)
        writes = [(0.0, Chunk(DOWN, stream[:point])), (1.0, Chunk(DOWN, stream[point:]))]
        out = replay(fault, writes)
        down = b"".join(
            item.data for _, item in out if isinstance(item, Chunk) and item.direction is DOWN
        )
        assert down in (expected, expected[:-2]), point
        assert [r.details["event"] for r in fault.reports] == [after], point
