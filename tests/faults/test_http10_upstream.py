"""http10_upstream: nginx's `proxy_http_version 1.0` on the upstream leg.

The request goes out as HTTP/1.0 with `Connection: close` (a chunked body de-chunked
with a Content-Length); the upstream's close-delimited answer reaches the HTTP/1.1
client chunked, one chunk per write, completed by the upstream's FIN.
"""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from faults._lib.hop_close import HopClose, is_hop_close
from faults.http10_upstream import Http10Upstream
from faults.testing import TimedItem, joined, replay
from middlebox.core.http1 import LAST_CHUNK_BYTES, Http1Framer, PieceKind, encode_chunk
from middlebox.core.stream import DOWN, UP, Chunk, Eof
from tests.faults.httpstreams import REQUEST, event, resliced

CLOSE_HEAD = b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\nconnection: close\r\n\r\n"
BODY = b'{"model":"m","stream":true}'


def test_the_request_line_says_http_1_0_and_connection_close() -> None:
    fault = Http10Upstream()
    keep_alive = REQUEST.replace(b"Host: up\r\n", b"Host: up\r\nConnection: keep-alive\r\n")
    out = replay(fault, [(0.0, Chunk(UP, keep_alive))])
    sent = joined(out, UP)
    assert sent.startswith(b"POST /v1/chat/completions HTTP/1.0\r\nHost: up\r\n")
    assert b"Connection: close\r\n" in sent and b"keep-alive" not in sent
    assert sent.endswith(b"Content-Length: 27\r\nConnection: close\r\n\r\n" + BODY)
    assert [(r.time, r.action) for r in fault.reports] == [(0.0, "rewrote_request")]


def test_a_chunked_request_body_goes_whole_with_a_content_length() -> None:
    head = b"POST /v1/completions HTTP/1.1\r\nHost: up\r\nTransfer-Encoding: chunked\r\n\r\n"
    out = replay(
        Http10Upstream(),
        [
            (0.0, Chunk(UP, head + encode_chunk(BODY[:10]))),
            (0.5, Chunk(UP, encode_chunk(BODY[10:]) + LAST_CHUNK_BYTES)),
        ],
    )
    ups = [(t, i.data) for t, i in out if isinstance(i, Chunk) and i.direction is UP]
    assert ups == [
        (
            0.5,
            b"POST /v1/completions HTTP/1.0\r\nHost: up\r\nConnection: close\r\n"
            b"Content-Length: 27\r\n\r\n" + BODY,
        )
    ]


def test_a_close_delimited_answer_is_chunked_and_the_fin_adds_the_terminal_chunk() -> None:
    fault = Http10Upstream()
    a, b = event("a"), event("b")
    out = replay(
        fault,
        [
            (0.0, Chunk(UP, REQUEST)),
            (1.0, Chunk(DOWN, CLOSE_HEAD + a)),
            (2.0, Chunk(DOWN, b)),
            (3.0, Eof(DOWN)),
        ],
    )
    downs = [(t, i) for t, i in out if i.direction is DOWN]
    assert downs == [
        (
            1.0,
            Chunk(
                DOWN,
                b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\n"
                b"Transfer-Encoding: chunked\r\nConnection: close\r\n\r\n" + encode_chunk(a),
            ),
        ),
        (2.0, Chunk(DOWN, encode_chunk(b))),
        (3.0, Chunk(DOWN, LAST_CHUNK_BYTES)),
        (3.0, Eof(DOWN)),
    ]
    assert not is_hop_close(downs[-1][1])
    assert [r.action for r in fault.reports] == ["rewrote_request", "rechunking", "terminated"]


def test_an_http_1_0_answer_reaches_the_client_as_http_1_1_when_it_is_chunked() -> None:
    """An upstream that answers the 1.0 request in 1.0 (aiohttp echoes the version) still
    reaches the HTTP/1.1 client with nginx's `HTTP/1.1` status line: chunked framing on a
    1.0 response is faulty framing (RFC 9112 §6.1), and Chromium hands its chunk-size
    lines to the page."""
    out = replay(
        Http10Upstream(),
        [
            (0.0, Chunk(UP, REQUEST)),
            (1.0, Chunk(DOWN, CLOSE_HEAD.replace(b"HTTP/1.1", b"HTTP/1.0", 1) + event("a"))),
            (2.0, Eof(DOWN)),
        ],
    )
    down = joined(out, DOWN)
    assert down.startswith(b"HTTP/1.1 200 OK\r\n")
    assert b"Transfer-Encoding: chunked" in down and down.endswith(LAST_CHUNK_BYTES)


def test_a_hop_that_gives_up_ends_the_body_without_the_terminal_chunk() -> None:
    out = replay(
        Http10Upstream(),
        [
            (0.0, Chunk(UP, REQUEST)),
            (1.0, Chunk(DOWN, CLOSE_HEAD + event("a"))),
            (61.0, HopClose(DOWN)),
        ],
    )
    assert joined(out, DOWN).endswith(encode_chunk(event("a")))
    assert (61.0, HopClose(DOWN)) in out and is_hop_close(out[-1][1])


def test_a_content_length_answer_passes_byte_for_byte() -> None:
    answer = b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok"
    out = replay(Http10Upstream(), [(0.0, Chunk(UP, REQUEST)), (1.0, Chunk(DOWN, answer))])
    assert joined(out, DOWN) == answer


@settings(max_examples=40, deadline=None)
@given(st.data())
def test_whatever_the_chunking_the_client_gets_the_same_bytes(data: st.DataObject) -> None:
    body = b"".join(event(c) for c in "hello world")
    writes = data.draw(resliced(CLOSE_HEAD + body))
    timeline: list[TimedItem] = [(0.0, Chunk(UP, REQUEST))]
    timeline += [(1.0 + i, Chunk(DOWN, w)) for i, w in enumerate(writes)]
    timeline.append((99.0, Eof(DOWN)))
    out = replay(Http10Upstream(), timeline)
    framer = Http1Framer("response")
    pieces = framer.feed(joined(out, DOWN))  # the client reads it before the FIN
    assert b"".join(p.data for p in pieces if p.kind is PieceKind.BODY) == body
    assert pieces[-1].end_of_message
