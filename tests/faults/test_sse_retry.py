"""sse_retry: set, change or strip the SSE `retry:` field, so an EventSource client's
reconnection time is what the scenario says; every other line passes as it came."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from faults import REGISTRY
from faults.sse_retry import SseRetry
from faults.testing import joined, replay
from middlebox.core.framed import LegRecord
from middlebox.core.http1 import LAST_CHUNK_BYTES, encode_chunk
from middlebox.core.sse import SseFramer
from middlebox.core.stream import DOWN, UP, Chunk, Eof
from middlebox.scenario.load import load_scenario_text
from tests.faults.httpprops import (
    SSE_HEAD,
    cut_lists,
    dechunked,
    frame,
    request,
    resplit,
    sse_chunks,
    sse_response,
)
from tests.faults.sse_timelines import two_events_and_done


def stream_retry(wire: bytes) -> int | None:
    """The reconnection time (ms) a WHATWG parser of the response body ends up with."""
    ((body, _complete),) = dechunked(wire)
    framer = SseFramer()
    framer.feed(body)
    return framer.retry


def test_set_announces_the_delay_in_the_first_events_block_and_leaves_the_rest() -> None:
    body = sse_chunks(2)
    fault = SseRetry(mode="set", delay=0.25)
    out = replay(fault, two_events_and_done(body))
    assert out == [
        (0.0, Chunk(UP, request())),
        (0.02, Chunk(DOWN, SSE_HEAD)),
        (1.0, Chunk(DOWN, encode_chunk(frame(0)[:-1] + b"retry: 250\n\n"))),
        # chunks without a changed line go out byte for byte
        (1.25, Chunk(DOWN, body[1])),
        (1.5, Chunk(DOWN, body[2] + LAST_CHUNK_BYTES)),
        (1.5, Eof(DOWN)),
    ]
    assert [(r.time, r.action, r.details["retry_ms"]) for r in fault.reports] == [
        (1.0, "set_retry", 250)
    ]


def server_with_retry(value: bytes) -> list[bytes]:
    """A stream whose server announces `retry: value` in its first event."""
    first = b"retry: " + value + b"\n" + frame(0)
    return [encode_chunk(first), encode_chunk(frame(1)), LAST_CHUNK_BYTES]


def test_change_rewrites_the_servers_retry_line_in_place_and_adds_none() -> None:
    body = server_with_retry(b"10000")
    fault = SseRetry(mode="change", delay=1.5)
    out = replay(
        fault,
        [
            (0.0, Chunk(UP, request())),
            (0.1, Chunk(DOWN, SSE_HEAD)),
            (0.5, Chunk(DOWN, body[0])),
            (0.7, Chunk(DOWN, body[1] + body[2])),
        ],
    )
    assert out == [
        (0.0, Chunk(UP, request())),
        (0.1, Chunk(DOWN, SSE_HEAD)),
        (0.5, Chunk(DOWN, encode_chunk(b"retry: 1500\n" + frame(0)))),
        (0.7, Chunk(DOWN, body[1] + body[2])),
    ]
    assert [(r.time, r.action, r.details["lines"]) for r in fault.reports] == [
        (0.7, "rewrote_retry", 1)
    ]


def test_change_leaves_a_stream_without_retry_byte_exact_and_unreported() -> None:
    fault = SseRetry(mode="change", delay=1.0)
    out = replay(fault, [(0.0, Chunk(UP, request())), (0.1, Chunk(DOWN, sse_response(3)))])
    assert joined(out, DOWN) == sse_response(3)
    assert fault.reports == []


def test_strip_drops_the_retry_line_so_the_client_keeps_its_default() -> None:
    body = server_with_retry(b"10000")
    out = replay(
        SseRetry(mode="strip"),
        [(0.0, Chunk(UP, request())), (0.1, Chunk(DOWN, SSE_HEAD + b"".join(body)))],
    )
    wire = joined(out, DOWN)
    assert b"retry" not in wire
    assert stream_retry(wire) is None
    assert stream_retry(SSE_HEAD + b"".join(body)) == 10000


def test_a_content_length_response_is_left_alone_and_reported_as_skipped() -> None:
    payload = frame(0)
    head = b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nContent-Length: %d\r\n\r\n"
    response = head % len(payload) + payload
    fault = SseRetry()
    out = replay(fault, [(0.0, Chunk(UP, request())), (0.3, Chunk(DOWN, response))])
    assert joined(out, DOWN) == response
    assert [(r.time, r.action, r.details["reason"]) for r in fault.reports] == [
        (0.3, "skipped", "content-length")
    ]


@settings(max_examples=60, deadline=None)
@given(
    mode=st.sampled_from(["set", "change", "strip"]),
    delay_ms=st.integers(0, 60_000),
    cuts=cut_lists,
)
def test_whatever_the_chunking_the_events_are_the_servers_and_the_retry_is_the_modes(
    mode: str, delay_ms: int, cuts: list[int]
) -> None:
    served = SSE_HEAD + b"".join(server_with_retry(b"10000"))
    pieces = resplit(served, cuts)
    timeline = [(0.0, Chunk(UP, request()))]
    timeline += [(0.1 + 0.01 * i, Chunk(DOWN, piece)) for i, piece in enumerate(pieces)]
    out = replay(SseRetry(mode=mode, delay=delay_ms / 1000), timeline)  # type: ignore[arg-type]
    wire = joined(out, DOWN)
    before, after = LegRecord.from_bytes(b"", served), LegRecord.from_bytes(b"", wire)
    assert [e.data for _, _, e in after.events[DOWN]] == [e.data for _, _, e in before.events[DOWN]]
    assert stream_retry(wire) == (None if mode == "strip" else delay_ms)


def test_the_scenario_loader_knows_it_and_refuses_an_unknown_mode() -> None:
    assert REGISTRY["sse_retry"] is SseRetry
    scenario = load_scenario_text(
        "name: r\npath:\n  - sse_retry: {mode: set, delay: 500ms}\n", REGISTRY
    )
    (spec,) = scenario.path
    assert spec.name == "sse_retry"
    with pytest.raises(ValueError, match="mode must be one of"):
        SseRetry(mode="double")  # type: ignore[arg-type]
