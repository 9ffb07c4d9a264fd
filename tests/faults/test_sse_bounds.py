"""SSE-aware faults past the framing's bound (`proxy.sse_max_line`, `sse_max_event`):
`sse_ids` and `cut` step aside for the rest of that response, say so (`stepped_aside`),
and its bytes pass as they come, the bytes they held included; within the bound they
work as ever. On the virtual clock, through a pipeline bound with small limits."""

from __future__ import annotations

import random
from dataclasses import replace

import pytest

from faults import REGISTRY
from faults.client_vanish import ClientVanish
from faults.cut import Cut
from faults.inband_error import InbandError
from faults.sse_ids import SseIds
from faults.sse_retry import SseRetry
from faults.testing import TimedItem, joined, replay
from middlebox.compose import PROXY_STAGES
from middlebox.core.fault import Fault, FaultContext, Pipeline, PipelineLayout
from middlebox.core.http1 import LAST_CHUNK_BYTES, encode_chunk
from middlebox.core.sse import SseLimits
from middlebox.core.stream import DOWN, UP, Chunk, Eof, Reset
from middlebox.scenario.load import load_scenario_text
from middlebox.shell.server import Address, ProxyConfig, ProxyServer
from tests.faults.httpprops import SSE_HEAD, dechunked, frame, request

LIMITS = SseLimits(line=100, event=200)
ENDLESS = [encode_chunk(b"data: " + b"x" * 34)] + [encode_chunk(b"x" * 40)] * 20


def bounded(fault: Fault, limits: SseLimits = LIMITS) -> Pipeline:
    """`fault` alone in a pipeline whose framing has `limits`, as the proxy binds it."""
    pipeline = Pipeline([fault])
    layout = PipelineLayout.of([fault])
    assert layout.framing is not None
    layout = replace(layout, framing=replace(layout.framing, sse_limits=limits))
    pipeline.bind(FaultContext(0, random.Random(0)), None, layout)
    return pipeline


def response(chunks: list[bytes], start: float = 1.0) -> list[TimedItem]:
    """A request, the SSE head, then each wire chunk 10 ms apart."""
    head = [(0.0, Chunk(UP, request())), (0.5, Chunk(DOWN, SSE_HEAD))]
    return [*head, *((start + i / 100, Chunk(DOWN, c)) for i, c in enumerate(chunks))]


def with_id(data: bytes, n: int) -> bytes:
    return data[:-1] + b"id: %d\n\n" % n


def arrivals(out: list[TimedItem]) -> dict[float, bytes]:
    """Response bytes out, by the time they went out."""
    got: dict[float, bytes] = {}
    for time, item in out:
        if isinstance(item, Chunk) and item.direction is DOWN:
            got[time] = got.get(time, b"") + item.data
    return got


def test_sse_ids_steps_aside_at_an_endless_line_and_passes_the_rest_as_it_comes() -> None:
    fault = SseIds()
    chunks = [encode_chunk(frame(0)), encode_chunk(frame(1)), *ENDLESS]
    out = replay(bounded(fault), response(chunks), bind=False)
    edited = encode_chunk(with_id(frame(0), 1)) + encode_chunk(with_id(frame(1), 2))
    assert joined(out, DOWN) == SSE_HEAD + edited + b"".join(ENDLESS)
    # the line passed 100 bytes in its third chunk: from then on every chunk goes out
    # the moment it arrives, and what was held for the line goes out then
    got = arrivals(out)
    assert got[1.04] == b"".join(ENDLESS[:3])
    assert all(got[1.0 + i / 100] == ENDLESS[i - 2] for i in range(5, len(chunks)))
    assert [(r.action, r.details) for r in fault.reports][1:] == [
        (
            "stepped_aside",
            {
                "request": 0,
                "message": 0,
                "reason": "sse line over its bound",
                "limit": 100,
                "body_offset": len(frame(0) + frame(1)),
            },
        )
    ]


def test_sse_ids_steps_aside_rather_than_hold_a_chunk_longer_than_an_event() -> None:
    """Ordinary events inside one chunk that a peer declared 1 MiB long: the chunk can
    only go out whole once edited, so past twice the event bound the fault stops editing,
    sends what it holds re-framed and the rest of the chunk as it comes."""
    fault = SseIds()
    events = b"".join(b"data: %04d\n\n" % i for i in range(1024 * 1024 // 12))
    wire = encode_chunk(events) + LAST_CHUNK_BYTES
    segments = [wire[i : i + 64] for i in range(0, len(wire), 64)]
    out = replay(bounded(fault), response(segments), bind=False)
    ((body, valid),) = dechunked(joined(out, DOWN))
    assert valid
    edited = b"".join(with_id(b"data: %04d\n\n" % i, i + 1) for i in range(32))
    assert body[: len(edited)] == edited  # the events seen before the bound got their ids
    assert body.endswith(events[-1000:])  # and the rest passed unedited
    # never more at once than what may be held (twice the bound and one read), the ids
    # added to its 40-odd events (8 bytes each at most) and a size line
    assert max(len(data) for data in arrivals(out).values()) <= 2 * 200 + 64 + 8 * 40 + 16
    (aside,) = [r for r in fault.reports if r.action == "stepped_aside"]
    assert aside.details["reason"] == "sse chunk over its bound"
    assert aside.details["limit"] == 200


@pytest.mark.parametrize("make", [SseRetry, InbandError])
def test_every_sse_rewriter_steps_aside_the_same_way(make: type[Fault]) -> None:
    fault = make()
    chunks = [encode_chunk(frame(0)), *ENDLESS, LAST_CHUNK_BYTES]
    out = replay(bounded(fault), response(chunks), bind=False)
    wire = joined(out, DOWN)
    assert wire.endswith(b"".join(chunks[1:]))  # from the endless line on, as it came
    assert dechunked(wire)[0][1]  # one valid HTTP message
    assert "stepped_aside" in [r.action for r in fault.reports]


def test_sse_ids_does_not_step_aside_for_a_line_and_an_event_at_their_limits() -> None:
    fault = SseIds()
    line = b"data: " + b"y" * 94  # 100 bytes
    chunks = [encode_chunk(frame(0)), encode_chunk(line + b"\n\n"), LAST_CHUNK_BYTES]
    out = replay(bounded(fault, SseLimits(line=100, event=101)), response(chunks), bind=False)
    assert dechunked(joined(out, DOWN)) == [
        (with_id(frame(0), 1) + with_id(line + b"\n\n", 2), True)
    ]
    assert [r.action for r in fault.reports] == ["rewriting_ids", "rewrote_ids"]


def test_sse_ids_strip_keeps_its_edit_inside_the_chunk_it_steps_aside_in() -> None:
    """The id line of the event that overflows was already stripped: the chunk it is in
    goes out re-framed to the bytes kept, the rest of that chunk's data as chunks of
    their own, and the HTTP message stays valid."""
    fault = SseIds(mode="strip")
    body = b"id: 7\ndata: " + b"x" * 300 + b"\n\ndata: tail\n\n"
    wire = encode_chunk(body) + LAST_CHUNK_BYTES
    segments = [wire[i : i + 50] for i in range(0, len(wire), 50)]
    out = replay(bounded(fault), response(segments), bind=False)
    assert dechunked(joined(out, DOWN)) == [(body.replace(b"id: 7\n", b""), True)]
    assert [r.action for r in fault.reports] == ["rewriting_ids", "stepped_aside", "rewrote_ids"]


def test_sse_ids_steps_aside_at_an_event_without_its_blank_line() -> None:
    fault = SseIds(mode="renumber")
    lines = [encode_chunk(b"data: %02d\n" % i) for i in range(40)]  # 9 bytes each
    out = replay(bounded(fault), response([encode_chunk(frame(0)), *lines]), bind=False)
    assert joined(out, DOWN) == SSE_HEAD + encode_chunk(frame(0)) + b"".join(lines)
    (aside,) = fault.reports
    assert aside.action == "stepped_aside"
    assert aside.details["reason"] == "sse event over its bound"
    assert aside.details["limit"] == 200
    assert aside.details["body_offset"] == len(frame(0)) + 9 * 22  # the 23rd line passes 200


def test_cut_steps_aside_for_a_response_it_can_no_longer_count() -> None:
    fault = Cut(after="events", count=5)
    chunks = [encode_chunk(frame(0)), encode_chunk(frame(1)), *ENDLESS, LAST_CHUNK_BYTES]
    timeline = [*response(chunks), (2.0, Eof(DOWN))]
    out = replay(bounded(fault), timeline, bind=False)
    assert joined(out, DOWN) == SSE_HEAD + b"".join(chunks)
    assert not any(isinstance(item, Reset) for _, item in out)
    ((time, item),) = [(t, i) for t, i in out if isinstance(i, Eof)]
    assert (time, item) == (2.0, Eof(DOWN))
    (aside,) = fault.reports
    assert aside.action == "stepped_aside"
    assert aside.details == {
        "response": 0,
        "reason": "sse line over its bound",
        "limit": 100,
        "body_offset": len(frame(0) + frame(1)),
        "events": 2,
        "tokens": 2,
    }


def test_cut_within_the_bounds_still_cuts() -> None:
    fault = Cut(after="events", count=2)
    chunks = [encode_chunk(frame(0)), encode_chunk(frame(1)), encode_chunk(frame(2))]
    out = replay(bounded(fault), response(chunks), bind=False)
    assert joined(out, DOWN) == SSE_HEAD + b"".join(chunks[:2])
    assert [r.action for r in fault.reports] == ["cut"]


def test_cut_releases_the_bytes_it_held_for_a_cut_point_that_never_comes() -> None:
    """`after: bytes` at an event boundary holds what follows the byte until the event
    ends; an event over the bound never will: the held bytes go out, none lost."""
    fault = Cut(after="bytes", count=20)
    lines = [encode_chunk(b"data: %02d\n" % i) for i in range(40)]
    out = replay(bounded(fault), response(lines), bind=False)
    got = arrivals(out)
    assert len(got[1.0]) < len(lines[0]) + len(lines[1])  # held from byte 20 on
    assert joined(out, DOWN) == SSE_HEAD + b"".join(lines)
    assert [r.action for r in fault.reports] == ["stepped_aside"]


def test_cut_watches_the_next_response_of_the_connection_again() -> None:
    fault = Cut(after="events", count=1, end="fin")
    first = [*ENDLESS, LAST_CHUNK_BYTES]
    second = [encode_chunk(frame(0)), encode_chunk(frame(1)), LAST_CHUNK_BYTES]
    timeline = [
        *response(first),
        (2.0, Chunk(UP, request())),
        (2.5, Chunk(DOWN, SSE_HEAD)),
        *((3.0 + i / 100, Chunk(DOWN, c)) for i, c in enumerate(second)),
    ]
    out = replay(bounded(fault), timeline, bind=False)
    assert dechunked(joined(out, DOWN)) == [
        (b"data: " + b"x" * 834, True),
        (frame(0), True),
    ]
    assert [r.action for r in fault.reports] == ["stepped_aside", "cut"]
    assert fault.reports[1].details["response"] == 1


def test_the_scenario_s_bounds_reach_every_framed_stream_of_a_connection() -> None:
    text = "name: b\npath:\n  - cut: {}\nproxy: {sse_max_line: 64KiB, sse_max_event: 2MiB}\n"
    scenario = load_scenario_text(text, REGISTRY)
    assert scenario.proxy.sse_limits == SseLimits(64 * 1024, 2 * 1024 * 1024)
    server = ProxyServer(ProxyConfig(Address("127.0.0.1", 9), scenario, stages=PROXY_STAGES))
    for connection in (1, 2):  # the first works the layout out, the second reuses it
        framing = server.make_pipeline(scenario, connection).framing
        assert framing is not None
        assert {s.sse_limits for s in framing.streams} == {scenario.proxy.sse_limits}
    default = load_scenario_text("name: d\npath:\n  - cut: {}\n", REGISTRY)
    bare = ProxyServer(ProxyConfig(Address("127.0.0.1", 9), default))
    framing = bare.make_pipeline(default, 1).framing
    assert framing is not None
    assert {s.sse_limits for s in framing.streams} == {SseLimits(1 << 20, 1 << 20)}


def test_an_event_trigger_says_it_cannot_count_a_response_past_the_bound() -> None:
    """`client_vanish` after 5 events: the first response has 2 and then a line that never
    ends; the trigger reports `stepped_aside` for it and fires in the next response."""
    fault = ClientVanish(after_events=5)
    first = [encode_chunk(frame(0)), encode_chunk(frame(1)), *ENDLESS, LAST_CHUNK_BYTES]
    second = [encode_chunk(frame(i)) for i in range(5)]
    timeline = [
        *response(first),
        (2.0, Chunk(UP, request())),
        (2.5, Chunk(DOWN, SSE_HEAD)),
        *((3.0 + i / 100, Chunk(DOWN, c)) for i, c in enumerate(second)),
    ]
    out = replay(bounded(fault), timeline, bind=False)
    assert joined(out, DOWN).startswith(SSE_HEAD + b"".join(first))
    assert [(r.time, r.action) for r in fault.reports] == [
        (1.04, "stepped_aside"),
        (3.02, "vanished"),
    ]
    assert fault.reports[0].details == {
        "message": 0,
        "reason": "sse line over its bound",
        "body_offset": len(frame(0) + frame(1)),
        "events": 2,
    }


def test_an_event_trigger_within_the_bound_reports_only_its_firing() -> None:
    fault = ClientVanish(after_events=5)
    chunks = [encode_chunk(frame(i)) for i in range(6)]
    replay(bounded(fault), response(chunks), bind=False)
    assert [(r.time, r.action) for r in fault.reports] == [(1.04, "vanished")]
