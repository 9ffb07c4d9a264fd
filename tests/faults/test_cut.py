"""cut: a response cut at an exact event, token, byte or time, ending as RST, FIN, a
truncated chunked body or a hang, toward the client, the server or both.

Most timelines: the request at 0 s, the head at 1 s, then one HTTP chunk per event a
second apart (tokens "a", "b", "c", "d" at 2-5 s), `[DONE]` at 6 s, the terminal chunk
at 7 s, as vLLM writes them.
"""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from faults._lib.match import RequestMatch
from faults.cut import Cut
from faults.testing import TimedItem, replay
from middlebox.core.http1 import LAST_CHUNK_BYTES, Http1Framer, PieceKind, encode_chunk
from middlebox.core.sse import SseFramer, utf8_incomplete_tail
from middlebox.core.stream import DOWN, UP, Chunk, Eof, Reset
from tests.faults.httpstreams import (
    DONE,
    REQUEST,
    SSE_HEAD,
    contents,
    down_bytes,
    ends,
    event,
    request,
    resliced,
    sse_response,
    timeline,
)

WRITES = sse_response("a", "b", "c", "d")
A, B, C = (encode_chunk(event(x)) for x in "abc")


def body(wire: bytes) -> tuple[bytes, bool]:
    """The de-chunked body a client reads from `wire`, and whether the message is complete."""
    pieces = Http1Framer("response").feed(wire)
    data = b"".join(p.data for p in pieces if p.kind is PieceKind.BODY)
    return data, any(p.end_of_message for p in pieces)


def test_after_two_events_both_sides_get_an_rst_right_after_the_second_chunk() -> None:
    fault = Cut(after="events", count=2)
    out = replay(fault, timeline(WRITES))
    assert out[1:] == [
        (1.0, Chunk(DOWN, SSE_HEAD)),
        (2.0, Chunk(DOWN, A)),
        (3.0, Chunk(DOWN, B)),
        (3.0, Reset(DOWN)),
        (3.0, Reset(UP)),
    ]
    (report,) = fault.reports
    assert (report.time, report.action) == (3.0, "cut")
    assert report.details == {
        "response": 0,
        "byte": len(SSE_HEAD + A + B),
        "body_byte": len(event("a") + event("b")),
        "event": 2,
        "tokens": 2,
        "end": "rst",
        "at": "event_boundary",
        "toward": "both",
    }


def test_tokens_do_not_count_the_role_chunk() -> None:
    fault = Cut(after="tokens", count=1)
    out = replay(fault, timeline(sse_response("a", "b", role=True)))
    # head 1 s, role chunk 2 s, "a" 3 s: the first token.
    assert ends(out) == [(3.0, Reset(DOWN)), (3.0, Reset(UP))]
    assert (fault.reports[0].details["event"], fault.reports[0].details["tokens"]) == (2, 1)


def test_a_byte_count_cuts_at_that_exact_body_byte_inside_the_data_line() -> None:
    fault = Cut(after="bytes", count=10, at="inside_data_line")
    out = replay(fault, timeline(WRITES))
    # The size line "39\r\n" then 10 body bytes: "data: {\"ch".
    assert down_bytes(out) == SSE_HEAD + A[:14]
    assert body(down_bytes(out))[0] == b'data: {"ch'
    assert fault.reports[0].details["byte"] == len(SSE_HEAD) + 14
    assert fault.reports[0].time == 2.0


def test_fin_after_a_whole_chunk_completes_the_http_message_without_done() -> None:
    fault = Cut(after="events", count=1, end="fin")
    out = replay(fault, timeline(WRITES))
    assert out[1:] == [
        (1.0, Chunk(DOWN, SSE_HEAD)),
        (2.0, Chunk(DOWN, A + LAST_CHUNK_BYTES)),
        (2.0, Eof(DOWN)),
        (2.0, Eof(UP)),
    ]
    assert body(down_bytes(out)) == (event("a"), True)


def test_fin_inside_a_data_line_reframes_the_chunk_so_the_message_stays_valid() -> None:
    fault = Cut(after="events", count=1, end="fin", at="inside_data_line")
    out = replay(fault, timeline(WRITES), seed=5)
    cut_at = fault.reports[0].details["body_byte"]
    kept = cut_at - len(event("a"))
    assert 0 < kept < len(event("b")) - 2  # inside "data: ..." before its line end
    assert down_bytes(out) == SSE_HEAD + A + encode_chunk(event("b")[:kept]) + LAST_CHUNK_BYTES
    assert body(down_bytes(out)) == (event("a") + event("b")[:kept], True)
    assert fault.reports[0].details["end"] == "fin"
    assert ends(out) == [(3.0, Eof(DOWN)), (3.0, Eof(UP))]


def test_truncated_chunked_inside_utf8_splits_a_character_of_the_next_event_that_has_one() -> None:
    writes = sse_response("a", "b", "né€")
    fault = Cut(after="events", count=1, end="truncated_chunked", at="inside_utf8")
    out = replay(fault, timeline(writes), seed=1)
    data, complete = body(down_bytes(out))
    assert not complete
    assert data.startswith(event("a") + event("b"))  # "b" has no multi-byte character
    assert utf8_incomplete_tail(data) > 0
    assert fault.reports[0].details["event"] == 2
    assert ends(out) == [(4.0, Eof(DOWN)), (4.0, Eof(UP))]


def test_hang_stops_the_stream_keeps_both_open_and_passes_the_clients_close() -> None:
    fault = Cut(after="events", count=1, end="hang")
    out = replay(fault, [*timeline(WRITES), (30.0, Eof(UP)), (31.0, Eof(DOWN))])
    assert out[1:] == [(1.0, Chunk(DOWN, SSE_HEAD)), (2.0, Chunk(DOWN, A)), (30.0, Eof(UP))]


def test_toward_client_the_server_streams_into_the_void() -> None:
    fault = Cut(after="events", count=1, toward="client")
    out = replay(fault, [*timeline(WRITES), (8.0, Eof(UP))])
    assert out[1:] == [(1.0, Chunk(DOWN, SSE_HEAD)), (2.0, Chunk(DOWN, A)), (2.0, Reset(DOWN))]


def test_toward_server_the_server_gets_a_fin_and_the_client_sees_the_upstreams_end() -> None:
    fault = Cut(after="events", count=2, end="fin", toward="server")
    out = replay(fault, [*timeline(WRITES[:4]), (4.5, Eof(DOWN))])
    assert out[1:] == [
        (1.0, Chunk(DOWN, SSE_HEAD)),
        (2.0, Chunk(DOWN, A)),
        (3.0, Chunk(DOWN, B)),
        (3.0, Eof(UP)),
        (4.5, Eof(DOWN)),
    ]


def test_at_a_time_the_cut_waits_for_the_event_in_progress_to_end() -> None:
    fault = Cut(after="time", time=2.5, end="truncated_chunked")
    out = replay(
        fault,
        [
            (0.0, Chunk(UP, REQUEST)),
            (1.0, Chunk(DOWN, SSE_HEAD)),
            (2.0, Chunk(DOWN, A + B[:20])),
            (3.0, Chunk(DOWN, B[20:] + C)),
        ],
    )
    assert out[1:] == [
        (1.0, Chunk(DOWN, SSE_HEAD)),
        (2.0, Chunk(DOWN, A + B[:20])),
        (3.0, Chunk(DOWN, B[20:])),
        (3.0, Eof(DOWN)),
        (3.0, Eof(UP)),
    ]
    assert fault.reports[0].details["event"] == 2


def test_at_a_time_on_an_event_boundary_it_cuts_at_that_moment() -> None:
    fault = Cut(after="time", time=3.5)
    out = replay(fault, timeline(WRITES))
    assert ends(out) == [(3.5, Reset(DOWN)), (3.5, Reset(UP))]
    assert down_bytes(out) == SSE_HEAD + A + B


def test_at_a_time_before_the_response_head_it_ends_the_exchange_there() -> None:
    fault = Cut(after="time", time=0.5, end="fin")
    out = replay(fault, timeline(WRITES))
    assert out[1:] == [(0.5, Eof(DOWN)), (0.5, Eof(UP))]
    assert fault.reports[0].details["response"] is None


def test_an_event_boundary_inside_a_chunk_of_several_events_truncates_that_chunk() -> None:
    two = encode_chunk(event("a") + event("b"))
    fault = Cut(after="events", count=1, end="truncated_chunked")
    out = replay(fault, timeline([SSE_HEAD, two, *WRITES[3:]]))
    assert down_bytes(out) == SSE_HEAD + two[: 4 + len(event("a"))]


def test_a_response_shorter_than_the_count_is_left_alone_and_the_next_counts_from_zero() -> None:
    short = b"".join(sse_response("a"))  # 2 events: "a" and [DONE]
    fault = Cut(after="events", count=3)
    out = replay(
        fault,
        [(0.0, Chunk(UP, REQUEST)), (1.0, Chunk(DOWN, short)), *timeline(WRITES, start=10.0)],
    )
    assert down_bytes(out) == short + SSE_HEAD + A + B + C
    assert ends(out) == [(14.0, Reset(DOWN)), (14.0, Reset(UP))]
    assert fault.reports[0].details["response"] == 1


def test_responses_the_match_does_not_select_are_not_cut() -> None:
    fault = Cut(count=1, match=RequestMatch(path="/v1/completions"))
    out = replay(fault, timeline(WRITES, request_bytes=request("/v1/chat/completions")))
    assert down_bytes(out) == b"".join(WRITES)
    assert not fault.fired


def test_an_upstream_that_ends_first_gets_its_end_passed_on() -> None:
    out = replay(Cut(count=10), [*timeline(WRITES[:3]), (4.0, Eof(DOWN))])
    assert out[-1] == (4.0, Eof(DOWN))
    assert down_bytes(out) == b"".join(WRITES[:3])


@pytest.mark.parametrize(
    ("config", "message"),
    [
        ({"after": "lines"}, "after must be one of"),
        ({"end": "close"}, "end must be one of"),
        ({"at": "anywhere"}, "at must be one of"),
        ({"toward": "nobody"}, "toward must be one of"),
        ({"count": -1}, "count must be >= 0"),
        ({"time": -1.0}, "time must be >= 0"),
    ],
)
def test_bad_config_is_refused_with_a_clear_message(
    config: dict[str, object], message: str
) -> None:
    with pytest.raises(ValueError, match=message):
        Cut(**config)  # type: ignore[arg-type]


@given(
    contents,
    st.sampled_from(["events", "tokens", "bytes"]),
    st.integers(0, 12),
    st.sampled_from(["event_boundary", "inside_data_line", "inside_utf8"]),
    st.sampled_from(["rst", "truncated_chunked", "hang"]),
    st.integers(0, 2**32),
    st.data(),
)
def test_the_client_gets_a_prefix_of_the_stream_cut_where_at_says(
    words: list[str], after: str, count: int, at: str, end: str, seed: int, data: st.DataObject
) -> None:
    wire = b"".join(sse_response(*words))
    writes = data.draw(resliced(wire, max_cuts=8))
    fault = Cut(after=after, count=count * 7 if after == "bytes" else count, at=at, end=end)  # type: ignore[arg-type]
    out = replay(fault, timeline(writes), seed=seed)
    got = down_bytes(out)
    assert wire.startswith(got)
    if not fault.fired:
        assert got == wire
        return
    report = fault.reports[0].details
    assert report["byte"] == len(got)
    delivered, complete = body(got)
    assert not complete
    assert report["body_byte"] == len(delivered)
    sse = SseFramer()
    sse.feed(delivered)
    assert sse.events == report["event"]
    if at == "event_boundary":
        assert not sse.mid_line and not sse.in_event
    elif at == "inside_data_line":
        assert sse.mid_line and delivered.rsplit(b"\n", 1)[-1].startswith(b"d")
    else:
        assert utf8_incomplete_tail(delivered) > 0


@given(contents, st.integers(0, 2**32))
def test_fin_always_leaves_a_complete_http_message_without_done(
    words: list[str], seed: int
) -> None:
    fault = Cut(after="events", count=1, end="fin", at="inside_data_line")
    out = replay(fault, timeline(sse_response(*words)), seed=seed)
    delivered, complete = body(down_bytes(out))
    assert complete
    assert DONE not in delivered
    assert (b"".join(event(w) for w in words) + DONE).startswith(delivered)


@given(st.integers(0, 2**32))
def test_the_same_seed_gives_the_same_cut(seed: int) -> None:
    def run() -> list[TimedItem]:
        fault = Cut(count=1, at="inside_data_line", match=RequestMatch(probability=0.5))
        return replay(fault, timeline(WRITES), seed=seed)

    assert run() == run()
