"""core/h2_bridge: one HTTP/2 stream as one HTTP/1.1 exchange, both directions (pure).

Requests: pseudo-headers become the request line and Host, connection-specific fields go
(RFC 9113 §8.2.2), a body without a length is chunked. Responses: the HTTP/1.1 framer's
pieces become a header list, DATA payloads and END_STREAM, and a response cut short becomes
a reset, never a clean end.
"""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from middlebox.core.h2_bridge import (
    INTERNAL_ERROR,
    PROTOCOL_ERROR,
    RequestEncoder,
    RequestError,
    ResponseBroken,
    ResponseData,
    ResponseDecoder,
    ResponseEnd,
    ResponseEvent,
    ResponseHead,
    h2_headers,
)

POST = [
    (b":method", b"POST"),
    (b":path", b"/v1/chat/completions"),
    (b":scheme", b"https"),
    (b":authority", b"127.0.0.1:9443"),
    (b"content-type", b"application/json"),
]

SSE = b'data: {"choices":[{"delta":{"content":"caf\xc3\xa9"}}]}\n\ndata: [DONE]\n\n'
CHUNKED_RESPONSE = (
    b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nTransfer-Encoding: chunked\r\n"
    b"Connection: keep-alive\r\nKeep-Alive: timeout=5\r\nX-Accel-Buffering: no\r\n\r\n"
    + b"%x\r\n%s\r\n" % (len(SSE[:40]), SSE[:40])
    + b"%x\r\n%s\r\n" % (len(SSE[40:]), SSE[40:])
    + b"0\r\n\r\n"
)


def body_of(events: list[ResponseEvent]) -> bytes:
    return b"".join(e.data for e in events if isinstance(e, ResponseData))


# ------------------------------------------------------------------ requests


def test_a_post_without_content_length_becomes_a_chunked_http11_request() -> None:
    encoder = RequestEncoder()
    head = encoder.head(POST, end_stream=False)
    assert head == (
        b"POST /v1/chat/completions HTTP/1.1\r\n"
        b"host: 127.0.0.1:9443\r\n"
        b"content-type: application/json\r\n"
        b"transfer-encoding: chunked\r\n"
        b"connection: close\r\n\r\n"
    )
    assert encoder.data(b'{"a":1}') == b'7\r\n{"a":1}\r\n'
    assert encoder.data(b"") == b""  # an empty DATA frame is no chunk: 0 would end the body
    assert encoder.end() == b"0\r\n\r\n"


def test_a_sized_body_keeps_its_content_length_and_is_passed_as_it_is() -> None:
    encoder = RequestEncoder()
    head = encoder.head([*POST, (b"content-length", b"7")], end_stream=False)
    assert b"content-length: 7\r\n" in head and b"transfer-encoding" not in head
    assert encoder.data(b'{"a":1}') == b'{"a":1}'
    assert encoder.end() == b""


def test_a_request_that_ends_with_its_headers_has_no_body() -> None:
    encoder = RequestEncoder()
    head = encoder.head([(":method", "GET"), (":path", "/v1/models")], end_stream=True)
    assert head == b"GET /v1/models HTTP/1.1\r\nconnection: close\r\n\r\n"
    assert encoder.method == "GET" and encoder.end() == b""


def test_connection_specific_fields_are_dropped_and_authority_wins_over_host() -> None:
    head = RequestEncoder().head(
        [
            *POST,
            (b"host", b"other.example"),
            (b"connection", b"keep-alive"),
            (b"te", b"trailers"),
            (b"upgrade", b"h2c"),
            (b"authorization", b"Bearer sk-x"),
        ],
        end_stream=True,
    )
    text = head.decode()
    assert "other.example" not in text and text.count("host:") == 1
    assert "keep-alive" not in text and "te:" not in text and "upgrade" not in text
    assert "authorization: Bearer sk-x\r\n" in text


def test_a_request_without_a_method_or_a_connect_is_refused() -> None:
    with pytest.raises(RequestError):
        RequestEncoder().head([(":path", "/")], end_stream=True)
    with pytest.raises(RequestError):
        RequestEncoder().head([(":method", "CONNECT"), (":authority", "x:443")], end_stream=True)


# ------------------------------------------------------------------ responses


def test_a_chunked_sse_response_becomes_headers_data_and_end_stream() -> None:
    decoder = ResponseDecoder("POST")
    events = decoder.feed(CHUNKED_RESPONSE)
    assert events[0] == ResponseHead(
        (
            (":status", "200"),
            ("content-type", "text/event-stream"),
            ("x-accel-buffering", "no"),
        )
    )
    assert body_of(events) == SSE
    assert events[-1] == ResponseEnd()
    assert decoder.feed_eof() == []  # the upstream's close after the message: nothing more


def test_the_status_of_a_response_head_is_its_first_field() -> None:
    head = ResponseHead(h2_headers(429, [("Retry-After", "1")]))
    assert head.status == 429
    assert head.headers == ((":status", "429"), ("retry-after", "1"))


def test_fields_the_connection_header_lists_are_dropped_too() -> None:
    headers = h2_headers(200, [("Connection", "close, X-Hop"), ("X-Hop", "1"), ("X-Kept", "2")])
    assert headers == ((":status", "200"), ("x-kept", "2"))


def test_a_content_length_response_ends_at_its_length() -> None:
    decoder = ResponseDecoder()
    events = decoder.feed(b"HTTP/1.1 200 OK\r\nContent-Length: 5\r\n\r\nhelloEXTRA")
    assert body_of(events) == b"hello"
    assert events[-1] == ResponseEnd()
    assert decoder.feed(b"more") == []


def test_a_read_until_close_body_ends_with_the_upstreams_fin() -> None:
    decoder = ResponseDecoder()
    events = decoder.feed(b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\n\r\n" + SSE)
    assert body_of(events) == SSE and ResponseEnd() not in events
    assert decoder.feed_eof() == [ResponseEnd()]


def test_a_chunked_response_cut_by_the_upstream_is_a_reset_not_an_end() -> None:
    decoder = ResponseDecoder()
    cut = CHUNKED_RESPONSE[: CHUNKED_RESPONSE.index(b"0\r\n\r\n")]
    events = decoder.feed(cut)
    assert body_of(events) == SSE and ResponseEnd() not in events
    (broken,) = decoder.feed_eof()
    assert isinstance(broken, ResponseBroken) and broken.error_code == INTERNAL_ERROR
    assert decoder.feed_eof() == []


def test_an_upstream_that_closes_before_any_head_is_a_reset() -> None:
    decoder = ResponseDecoder()
    assert decoder.feed(b"HTTP/1.1 200") == []
    events = decoder.feed_eof()
    assert isinstance(events[-1], ResponseBroken)
    assert not any(isinstance(e, ResponseHead) for e in events)


def test_an_interim_100_continue_stays_on_the_http11_hop() -> None:
    decoder = ResponseDecoder("POST")
    events = decoder.feed(b"HTTP/1.1 100 Continue\r\n\r\nHTTP/1.1 204 No Content\r\n\r\n")
    assert events == [ResponseHead(((":status", "204"),)), ResponseEnd()]


def test_a_response_that_is_not_http11_is_a_protocol_error_reset() -> None:
    decoder = ResponseDecoder()
    events = decoder.feed(b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\n")
    assert isinstance(events[-1], ResponseBroken)
    assert events[-1].error_code == PROTOCOL_ERROR
    assert decoder.feed(b"more") == [] and decoder.feed_eof() == []


def test_a_head_response_has_no_body_whatever_its_length() -> None:
    decoder = ResponseDecoder("HEAD")
    events = decoder.feed(b"HTTP/1.1 200 OK\r\nContent-Length: 99\r\n\r\n")
    assert events == [ResponseHead(((":status", "200"), ("content-length", "99"))), ResponseEnd()]


@given(st.lists(st.integers(min_value=1, max_value=len(CHUNKED_RESPONSE) - 1), max_size=12))
def test_any_split_of_the_upstreams_bytes_gives_the_same_events_payload(cuts: list[int]) -> None:
    decoder = ResponseDecoder("POST")
    events: list[ResponseEvent] = []
    previous = 0
    for cut in [*sorted(set(cuts)), len(CHUNKED_RESPONSE)]:
        events += decoder.feed(CHUNKED_RESPONSE[previous:cut])
        previous = cut
    events += decoder.feed_eof()
    assert body_of(events) == SSE
    assert [type(e) for e in events if not isinstance(e, ResponseData)] == [
        ResponseHead,
        ResponseEnd,
    ]
