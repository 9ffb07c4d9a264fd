"""sse_ids: number, strip or renumber `id:` lines so clients' Last-Event-ID resume logic
is exercised; chunks with no changed line go out byte for byte."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from faults import REGISTRY
from faults._lib.match import RequestMatch
from faults.sse_ids import SseIds
from faults.testing import joined, replay
from middlebox.core.http1 import LAST_CHUNK_BYTES, encode_chunk
from middlebox.core.stream import DOWN, UP, Chunk, Eof
from middlebox.scenario.load import load_scenario_text
from tests.faults.httpprops import (
    SSE_HEAD,
    cut_lists,
    dechunked,
    exchanges,
    frame,
    rechunk,
    request,
    sse_chunks,
    sse_response,
)
from tests.faults.netprops import assert_deterministic
from tests.faults.sse_timelines import in_segments, two_events_and_done


def with_id(data: bytes, n: int) -> bytes:
    """A frame `data: ...\\n\\n` with `id: n` before its blank line."""
    return data[:-1] + b"id: %d\n\n" % n


def test_add_numbers_every_event_done_included_at_the_times_they_arrive() -> None:
    body = sse_chunks(2)
    fault = SseIds()
    out = replay(fault, two_events_and_done(body))
    assert out == [
        (0.0, Chunk(UP, request())),
        (0.02, Chunk(DOWN, SSE_HEAD)),
        (1.0, Chunk(DOWN, encode_chunk(with_id(frame(0), 1)))),
        (1.25, Chunk(DOWN, encode_chunk(with_id(frame(1), 2)))),
        (1.5, Chunk(DOWN, encode_chunk(b"data: [DONE]\nid: 3\n\n") + LAST_CHUNK_BYTES)),
        (1.5, Eof(DOWN)),
    ]
    assert [(r.time, r.action, r.details) for r in fault.reports] == [
        (
            1.0,
            "rewriting_ids",
            {
                "mode": "add",
                "request": 0,
                "message": 0,
                "event": 0,
                "body_offset": len(frame(0)) - 1,
            },
        ),
        (1.5, "rewrote_ids", {"request": 0, "lines": 3}),
    ]


def test_a_line_split_across_chunks_holds_the_first_chunk_until_the_line_ends() -> None:
    first, second = frame(0)[:20], frame(0)[20:]
    out = replay(
        SseIds(start=0),
        [
            (0.0, Chunk(UP, request())),
            (0.02, Chunk(DOWN, SSE_HEAD)),
            (1.0, Chunk(DOWN, encode_chunk(first))),
            (1.5, Chunk(DOWN, encode_chunk(second))),
        ],
    )
    assert out[2:] == [
        (1.5, Chunk(DOWN, encode_chunk(first) + encode_chunk(with_id(frame(0), 0)[20:]))),
    ]


def test_strip_drops_id_lines_and_leaves_other_chunks_byte_exact() -> None:
    body = (
        encode_chunk(b": keep-alive\n\n")
        + encode_chunk(b"id: 41\r\ndata: a\r\n\r\n")
        + encode_chunk(b"data: b\n\n", ";ext=1")
        + LAST_CHUNK_BYTES
    )
    fault = SseIds(mode="strip")
    out = replay(fault, [(0.0, Chunk(UP, request())), (1.0, Chunk(DOWN, SSE_HEAD + body))])
    assert joined(out, DOWN) == SSE_HEAD + (
        encode_chunk(b": keep-alive\n\n")
        + encode_chunk(b"data: a\r\n\r\n")
        + encode_chunk(b"data: b\n\n", ";ext=1")
        + LAST_CHUNK_BYTES
    )
    assert fault.reports[0].details["event"] == 0


def test_renumber_restarts_the_ids_keeping_each_line_ending() -> None:
    text = b"id: a7\r\ndata: x\r\n\r\ndata: y\n\nid:zz\ndata: z\n\n"
    out = replay(
        SseIds(mode="renumber", start=100),
        [(0.0, Chunk(UP, request())), (1.0, Chunk(DOWN, SSE_HEAD + rechunk(text, [])))],
    )
    assert dechunked(joined(out, DOWN)) == [
        (b"id: 100\r\ndata: x\r\n\r\ndata: y\n\nid: 102\ndata: z\n\n", True)
    ]


def test_content_length_responses_are_skipped_and_unmatched_ones_untouched() -> None:
    sized = b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\n\r\n%s" % (len(frame(0)), frame(0))
    fault = SseIds(match=RequestMatch(requests=[0, 1]))
    out = replay(
        fault,
        [
            (0.0, Chunk(UP, request())),
            (0.5, Chunk(DOWN, sized)),
            (1.0, Chunk(UP, request(path="/health", method="GET"))),
            (1.5, Chunk(DOWN, sized)),
            (2.0, Chunk(UP, request())),
            (2.5, Chunk(DOWN, sse_response(1))),
        ],
    )
    assert joined(out, DOWN) == sized + sized + sse_response(1)
    assert [r.action for r in fault.reports] == ["skipped", "skipped"]


events_strategy = st.lists(
    st.tuples(
        st.none() | st.sampled_from(["7", "x-1", ""]),
        st.sampled_from(["tok", "h\u00e9", "[DONE]", ""]),
        st.sampled_from(["\n", "\r\n"]),
    ),
    min_size=1,
    max_size=6,
)


@given(
    events=events_strategy,
    mode=st.sampled_from(["add", "strip", "renumber"]),
    chunk_cuts=st.lists(st.integers(0, 200), max_size=10),
    tcp_cuts=cut_lists,
)
def test_whatever_the_chunking_the_client_reads_exactly_the_rewritten_events(
    events: list[tuple[str | None, str, str]], mode: Any, chunk_cuts: list[int], tcp_cuts: list[int]
) -> None:
    text, expected = "", ""
    for i, (event_id, data, eol) in enumerate(events):
        id_line = f"id: {event_id}{eol}" if event_id is not None else ""
        text += f"{id_line}data: {data}{eol}{eol}"
        if mode == "add":
            added = f"id: {i + 1}{eol}" if event_id is None else ""
            expected += f"{id_line}data: {data}{eol}{added}{eol}"
        elif mode == "strip":
            expected += f"data: {data}{eol}{eol}"
        else:
            renumbered = f"id: {i + 1}{eol}" if event_id is not None else ""
            expected += f"{renumbered}data: {data}{eol}{eol}"
    wire = SSE_HEAD + rechunk(text.encode(), chunk_cuts)
    out = replay(SseIds(mode=mode), in_segments(wire, tcp_cuts))
    assert dechunked(joined(out, DOWN)) == [(expected.encode(), True)]


@given(chunk_cuts=st.lists(st.integers(0, 300), max_size=10), tcp_cuts=cut_lists)
def test_a_stream_without_ids_passes_strip_byte_exact(
    chunk_cuts: list[int], tcp_cuts: list[int]
) -> None:
    wire = SSE_HEAD + rechunk(b"".join(frame(i) for i in range(4)), chunk_cuts)
    out = replay(SseIds(mode="strip"), in_segments(wire, tcp_cuts))
    assert joined(out, DOWN) == wire


@settings(max_examples=25)
@given(seed=st.integers(0, 2**32))
def test_the_same_seed_numbers_the_same_streams(seed: int) -> None:
    assert_deterministic(
        lambda: SseIds(match=RequestMatch(probability=0.5)), exchanges(sse_response(2)), seed
    )


def test_it_loads_from_yaml() -> None:
    scenario = load_scenario_text(
        "name: ids\npath:\n  - sse_ids: {mode: renumber, start: 0, match: {first: 1}}\n",
        REGISTRY,
    )
    assert scenario.build_faults() == [
        SseIds(mode="renumber", start=0, match=RequestMatch(first=1))
    ]


def test_an_unknown_mode_is_refused() -> None:
    with pytest.raises(ValueError, match="mode"):
        SseIds(mode="shuffle")  # type: ignore[arg-type]
