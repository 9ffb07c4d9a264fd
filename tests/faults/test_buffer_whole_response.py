"""buffer_whole_response: lighttpd's default holds the whole answer and sends it with a length.

The stream in most tests is vLLM's chunked SSE answer: the head at 1 s, then one chunk
per token a second apart, `[DONE]` and the terminal chunk.
"""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from faults._lib.hop_close import HopClose
from faults._lib.match import RequestMatch
from faults.buffer_whole_response import BufferWholeResponse
from faults.testing import TimedItem, replay
from middlebox.core.http1 import encode_chunk
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

HEAD = b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream; charset=utf-8\r\n"
EVENTS = [event("a"), event("b"), DONE]


def sent(out: list[TimedItem]) -> list[tuple[float, bytes]]:
    return [(t, i.data) for t, i in out if isinstance(i, Chunk) and i.direction is DOWN]


def length_framed(body: bytes, *extra: bytes) -> bytes:
    return HEAD + b"Content-Length: %d\r\n" % len(body) + b"".join(extra) + b"\r\n" + body


def test_a_token_stream_reaches_the_client_whole_at_its_end_with_a_content_length() -> None:
    fault = BufferWholeResponse()
    out = replay(fault, timeline(sse_response("a", "b")))
    # head at 1 s, tokens at 2 and 3 s, [DONE] at 4 s, the terminal chunk at 5 s
    assert sent(out) == [(5.0, length_framed(b"".join(EVENTS)))]
    assert [(r.time, r.action) for r in fault.reports] == [(1.0, "holding"), (5.0, "released")]
    assert fault.reports[-1].details == {"response": 0, "size": 128, "framing": "chunked"}


def test_an_answer_that_already_has_a_length_goes_out_unchanged_at_its_end() -> None:
    body = b'{"id":"x"}'
    answer = b"HTTP/1.1 200 OK\r\nContent-Length: 10\r\n\r\n" + body
    out = replay(BufferWholeResponse(), timeline([answer[:30], answer[30:]]))
    assert sent(out) == [(2.0, answer)]


def test_a_close_delimited_answer_gets_a_length_and_connection_close_at_the_upstreams_fin() -> None:
    head = b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\n\r\n"
    items = [*timeline([head, event("a"), event("b")]), (4.0, Eof(DOWN))]
    out = replay(BufferWholeResponse(), items)
    body = event("a") + event("b")
    expected = (
        b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\n"
        b"Content-Length: %d\r\nConnection: close\r\n\r\n" % len(body)
    ) + body
    assert sent(out) == [(4.0, expected)]
    assert ends(out) == [(4.0, Eof(DOWN))]


def test_an_http_1_0_client_asking_keep_alive_keeps_it_when_the_upstream_gave_a_length() -> None:
    ask = request(extra=b"Connection: keep-alive\r\n").replace(b"HTTP/1.1", b"HTTP/1.0")
    answer = b"HTTP/1.0 200 OK\r\nConnection: keep-alive\r\nContent-Length: 3\r\n\r\nabc"
    out = replay(BufferWholeResponse(), timeline([answer[:20], answer[20:]], request_bytes=ask))
    assert sent(out) == [(2.0, answer)]


def test_two_answers_on_a_keep_alive_connection_are_each_held_and_framed_on_their_own() -> None:
    first, second = sse_response("a"), sse_response("b")
    items = [(0.0, Chunk(UP, REQUEST + REQUEST))]
    items += [(1.0 + i, Chunk(DOWN, w)) for i, w in enumerate(first + second)]
    out = replay(BufferWholeResponse(), items)
    assert sent(out) == [
        (4.0, length_framed(event("a") + DONE)),
        (8.0, length_framed(event("b") + DONE)),
    ]


def test_a_head_answer_and_an_interim_head_pass_at_once() -> None:
    interim = b"HTTP/1.1 100 Continue\r\n\r\n"
    out = replay(BufferWholeResponse(), timeline([interim, *sse_response("a")]))
    assert sent(out)[0] == (1.0, interim)
    no_body = b"HTTP/1.1 200 OK\r\nContent-Length: 0\r\n\r\n"
    out = replay(BufferWholeResponse(), timeline([no_body]))
    assert sent(out) == [(1.0, no_body)]


def test_x_accel_buffering_no_is_ignored_by_default_and_streams_when_honoured() -> None:
    head = SSE_HEAD.replace(b"\r\n\r\n", b"\r\nX-Accel-Buffering: no\r\n\r\n")
    writes = [head, *sse_response("a")[1:]]
    assert len(sent(replay(BufferWholeResponse(), timeline(writes)))) == 1
    fault = BufferWholeResponse(honour_x_accel_buffering=True)
    out = replay(fault, timeline(writes))
    assert sent(out) == list(zip([1.0, 2.0, 3.0, 4.0], writes, strict=True))
    assert [r.action for r in fault.reports] == ["not_buffering"]


def test_an_answer_match_does_not_select_passes_as_it_streams() -> None:
    fault = BufferWholeResponse(match=RequestMatch(path="/v1/completions"))
    writes = sse_response("a")
    out = replay(fault, timeline(writes))
    assert sent(out) == list(zip([1.0, 2.0, 3.0, 4.0], writes, strict=True))
    assert fault.reports == []


@pytest.mark.parametrize("end", [Eof(DOWN), Reset(DOWN)], ids=["fin", "rst"])
def test_an_upstream_that_stops_mid_answer_is_sent_as_a_complete_shorter_answer(
    end: Eof | Reset,
) -> None:
    fault = BufferWholeResponse()
    writes = sse_response("a", "b")[:3]  # head and two tokens, no [DONE], no terminal chunk
    out = replay(fault, [*timeline(writes), (4.0, end)])
    body = event("a") + event("b")
    assert sent(out) == [(4.0, length_framed(body, b"Connection: close\r\n"))]
    assert ends(out) == [(4.0, Eof(DOWN))]  # lighttpd closes cleanly, even after an RST
    report = fault.reports[-1]
    assert (report.action, report.details["client"]) == ("cut_short", "sent_as_complete")


def test_cut_short_502_answers_a_stopped_upstream_with_a_gateway_error_instead() -> None:
    fault = BufferWholeResponse(cut_short="502")
    out = replay(fault, [*timeline(sse_response("a", "b")[:3]), (4.0, Eof(DOWN))])
    ((_, page),) = sent(out)
    assert page.startswith(b"HTTP/1.1 502 Bad Gateway\r\n")
    assert event("a") not in page
    assert ends(out) == [(4.0, Eof(DOWN)), (4.0, Eof(UP))]


def test_a_hops_read_timeout_with_the_answer_held_gives_lighttpds_404_page() -> None:
    fault = BufferWholeResponse()
    out = replay(fault, [*timeline(sse_response("a", "b")[:2]), (9.0, HopClose(DOWN))])
    ((t, page),) = sent(out)
    assert (t, page.split(b"\r\n")[0]) == (9.0, b"HTTP/1.1 404 Not Found")
    assert b"Connection: close" in page and event("a") not in page
    assert fault.reports[-1].action == "replaced"


def test_an_upstream_end_with_nothing_held_passes_as_it_is() -> None:
    out = replay(BufferWholeResponse(), [*timeline(sse_response("a")), (9.0, Reset(DOWN))])
    assert ends(out) == [(9.0, Reset(DOWN))]


def test_a_malformed_chunk_sends_what_was_held_as_it_came_and_steps_aside() -> None:
    fault = BufferWholeResponse()
    writes = [SSE_HEAD, encode_chunk(event("a")), b"zz\r\nnot a chunk\r\n", b"more"]
    out = replay(fault, timeline(writes))
    assert down_bytes(out) == b"".join(writes)
    assert "stepped_aside" in [r.action for r in fault.reports]


def test_the_timeout_status_and_cut_short_are_checked_at_load() -> None:
    with pytest.raises(ValueError, match="timeout_status"):
        BufferWholeResponse(timeout_status=200)
    with pytest.raises(ValueError, match="cut_short"):
        BufferWholeResponse(cut_short="maybe")  # type: ignore[arg-type]


@settings(max_examples=60, deadline=None)
@given(st.data(), contents)
def test_whatever_the_chunking_the_client_gets_the_decoded_body_once_with_its_length(
    data: st.DataObject, tokens: list[str]
) -> None:
    writes = sse_response(*tokens)
    wire = b"".join(writes)
    body = b"".join(event(t) for t in tokens) + DONE
    out = replay(BufferWholeResponse(), timeline(data.draw(resliced(wire, max_cuts=12))))
    assert [data for _, data in sent(out)] == [length_framed(body)]


def test_an_upgrade_and_the_tunnel_after_it_pass_as_they_come() -> None:
    ask = b"GET /ws HTTP/1.1\r\nHost: h\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n\r\n"
    switch = (
        b"HTTP/1.1 101 Switching Protocols\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n\r\n"
    )
    fault = BufferWholeResponse()
    out = replay(fault, timeline([switch, b"\x81\x02hi"], request_bytes=ask))
    assert sent(out) == [(1.0, switch), (2.0, b"\x81\x02hi")]
    assert fault.reports == []


def test_an_http_1_0_clients_close_delimited_answer_gets_its_length_and_connection_close() -> None:
    ask = REQUEST.replace(b"HTTP/1.1", b"HTTP/1.0")
    head = b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\n\r\n"
    items = [*timeline([head, event("a")], request_bytes=ask), (3.0, Eof(DOWN))]
    out = replay(BufferWholeResponse(), items)
    ((_, data),) = sent(out)
    assert data.startswith(head[:-2] + b"Content-Length: %d\r\nConnection: close\r\n\r\n" % 57)
    assert data.endswith(b"\r\n\r\n" + event("a"))
