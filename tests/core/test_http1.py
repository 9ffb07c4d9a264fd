"""The HTTP/1.1 framer labels bytes without changing them, whatever the split."""

from __future__ import annotations

import dataclasses
import itertools
import random

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from middlebox.core.http1 import (
    LAST_CHUNK_BYTES,
    MAX_HEAD_BYTES,
    Head,
    Http1Exchange,
    Http1Framer,
    Piece,
    PieceKind,
    Role,
    build_head,
    coalesce,
    encode_chunk,
)
from middlebox.core.stream import DOWN, UP

H = PieceKind.HEAD
B = PieceKind.BODY
CH = PieceKind.CHUNK_HEADER
CRLF = PieceKind.CHUNK_TRAILER_CRLF
LAST = PieceKind.LAST_CHUNK
TR = PieceKind.TRAILERS
OP = PieceKind.OPAQUE


def frame(
    role: Role, parts: list[bytes], methods: tuple[str, ...] = ()
) -> tuple[list[Piece], Http1Framer]:
    framer = Http1Framer(role)
    for method in methods:
        framer.expect_response_to(method)
    pieces: list[Piece] = []
    for part in parts:
        pieces += framer.feed(part)
    pieces += framer.feed_eof()
    return pieces, framer


def shape(pieces: list[Piece]) -> list[tuple[PieceKind, bytes, int, bool]]:
    return [(p.kind, p.data, p.message, p.end_of_message) for p in coalesce(pieces)]


def kinds(pieces: list[Piece]) -> list[PieceKind]:
    return [p.kind for p in coalesce(pieces)]


def joined(pieces: list[Piece]) -> bytes:
    return b"".join(p.data for p in pieces)


CHUNKED_RESPONSE = (
    b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nTransfer-Encoding: chunked\r\n\r\n"
    b"1a;foo=bar\r\n" + b"data: hello\n\ndata: wor\xc3\xa9\n\n"[:26] + b"\r\n"
    b"5\r\nabcde\r\n"
    b"0;last=1\r\nX-Checksum: 42\r\nX-Other: b\r\n\r\n"
)

SMALL_CASES: dict[str, tuple[Role, bytes, tuple[str, ...]]] = {
    "get request": ("request", b"GET /v1/models HTTP/1.1\r\nHost: a\r\n\r\n", ()),
    "post with content-length": (
        "request",
        b'POST /v1/chat/completions HTTP/1.1\r\nContent-Length: 11\r\n\r\n{"a":"bc"}\n',
        (),
    ),
    "chunked request with trailers": (
        "request",
        b"POST /x HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n3;e\r\nabc\r\n0\r\nT: 1\r\n\r\n",
        (),
    ),
    "chunked response with extensions and trailers": ("response", CHUNKED_RESPONSE, ("POST",)),
    "keep-alive pair": (
        "response",
        b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nhi"
        b"HTTP/1.1 404 Not Found\r\nContent-Length: 0\r\n\r\n",
        ("GET", "GET"),
    ),
    "interim responses": (
        "response",
        b"HTTP/1.1 100 Continue\r\n\r\nHTTP/1.1 103 Early Hints\r\nLink: </a>\r\n\r\n"
        b"HTTP/1.1 200 OK\r\nContent-Length: 3\r\n\r\nabc",
        ("POST",),
    ),
    "head response": (
        "response",
        b"HTTP/1.1 200 OK\r\nContent-Length: 50\r\n\r\nHTTP/1.1 204 No Content\r\n\r\n",
        ("HEAD", "GET"),
    ),
    "read until close": (
        "response",
        b"HTTP/1.0 200 OK\r\nConnection: close\r\n\r\ndata: x\n\n",
        ("GET",),
    ),
    "switching protocols": (
        "response",
        b"HTTP/1.1 101 Switching Protocols\r\nUpgrade: websocket\r\n\r\n\x81\x05hello",
        ("GET",),
    ),
    "bad chunk size": (
        "response",
        b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\nabc",
        ("GET",),
    ),
    "bare LF line ends": (
        "response",
        b"HTTP/1.1 200 OK\nTransfer-Encoding: chunked\n\n2\nab\n0\n\n",
        ("GET",),
    ),
}


@pytest.mark.parametrize("name", sorted(SMALL_CASES))
def test_every_two_way_split_gives_the_same_pieces_and_the_input_back(name: str) -> None:
    role, data, methods = SMALL_CASES[name]
    whole, _ = frame(role, [data], methods)
    assert joined(whole) == data
    for cut in range(len(data) + 1):
        pieces, _ = frame(role, [data[:cut], data[cut:]], methods)
        assert joined(pieces) == data, cut
        assert shape(pieces) == shape(whole), cut


@pytest.mark.parametrize("name", sorted(SMALL_CASES))
def test_feeding_one_byte_at_a_time_gives_the_same_pieces(name: str) -> None:
    role, data, methods = SMALL_CASES[name]
    whole, _ = frame(role, [data], methods)
    pieces, _ = frame(role, [data[i : i + 1] for i in range(len(data))], methods)
    assert joined(pieces) == data
    assert shape(pieces) == shape(whole)


def test_a_chunked_response_is_labelled_head_chunk_lines_data_and_trailers() -> None:
    pieces, framer = frame("response", [CHUNKED_RESPONSE], ("POST",))
    assert kinds(pieces) == [H, CH, B, CRLF, CH, B, CRLF, LAST, TR]
    by_kind = {p.kind: p.data for p in coalesce(pieces)}
    assert by_kind[LAST] == b"0;last=1\r\n"
    assert by_kind[TR] == b"X-Checksum: 42\r\nX-Other: b\r\n\r\n"
    assert [p.data for p in pieces if p.kind is CH] == [b"1a;foo=bar\r\n", b"5\r\n"]
    assert [p.end_of_message for p in pieces] == [False] * 8 + [True]
    head = pieces[0].head
    assert head is not None and head.status == 200 and head.is_chunked
    assert head.header("content-type") == "text/event-stream"
    assert framer.message_complete and not framer.truncated and framer.degraded is None


def test_interim_responses_share_the_message_index_of_the_final_response() -> None:
    _, data, methods = SMALL_CASES["interim responses"]
    pieces, framer = frame("response", [data], methods)
    heads = [p.head for p in pieces if p.head is not None]
    assert [h.status for h in heads] == [100, 103, 200]
    assert [h.is_interim for h in heads] == [True, True, False]
    assert heads[1].header("link") == "</a>"
    assert [(p.message, p.end_of_message) for p in pieces] == [(0, False)] * 3 + [(0, True)]
    assert framer.message == 1


def test_a_response_to_head_has_no_body_though_content_length_is_set() -> None:
    _, data, methods = SMALL_CASES["head response"]
    pieces, framer = frame("response", [data], methods)
    assert [(p.kind, p.message, p.end_of_message) for p in pieces] == [(H, 0, True), (H, 1, True)]
    assert framer.request_method == "GET"


def test_204_and_304_responses_have_no_body() -> None:
    data = b"HTTP/1.1 304 Not Modified\r\nContent-Length: 9\r\n\r\nHTTP/1.1 204 OK\r\n\r\n"
    pieces, _ = frame("response", [data], ("GET", "GET"))
    assert [(p.kind, p.end_of_message) for p in pieces] == [(H, True), (H, True)]


def test_a_body_without_length_runs_until_close_and_eof_completes_it() -> None:
    framer = Http1Framer("response")
    framer.expect_response_to("GET")
    pieces = framer.feed(b"HTTP/1.0 200 OK\r\n\r\ndata: 1\n\n")
    assert [p.kind for p in pieces] == [H, B] and framer.in_body
    assert pieces[0].head is not None and not pieces[0].head.keep_alive
    end = framer.feed_eof()
    assert [(p.kind, p.data, p.end_of_message) for p in end] == [(B, b"", True)]
    assert not framer.truncated and framer.message_complete


def test_eof_inside_a_content_length_body_is_reported_as_truncation() -> None:
    pieces, framer = frame("response", [b"HTTP/1.1 200 OK\r\nContent-Length: 10\r\n\r\nabc"])
    assert kinds(pieces) == [H, B]
    assert not any(p.end_of_message for p in pieces)
    assert framer.truncated and framer.body_received == 3


def test_eof_inside_a_chunk_size_line_passes_the_partial_line_on_as_opaque() -> None:
    data = b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n1a;fo"
    pieces, framer = frame("response", [data])
    assert joined(pieces) == data
    assert kinds(pieces) == [H, OP] and pieces[-1].data == b"1a;fo"
    assert framer.truncated and framer.degraded is None


def test_eof_between_messages_and_after_blank_lines_is_not_truncation() -> None:
    pieces, framer = frame("request", [b"GET / HTTP/1.1\r\n\r\n\r\n"])
    assert joined(pieces) == b"GET / HTTP/1.1\r\n\r\n\r\n"
    assert not framer.truncated


def test_blank_lines_before_a_request_line_are_skipped_and_kept_in_the_head() -> None:
    pieces, _ = frame("request", [b"\r\n\r\nGET / HTTP/1.1\r\n\r\n"])
    assert [p.kind for p in pieces] == [H]
    assert pieces[0].data.startswith(b"\r\n\r\nGET")
    assert pieces[0].head is not None and pieces[0].head.target == "/"


def test_connection_close_and_http_1_0_keep_alive_are_read_from_the_head() -> None:
    close, _ = frame(
        "response", [b"HTTP/1.1 200 OK\r\nConnection: Close\r\nContent-Length: 0\r\n\r\n"]
    )
    ka, _ = frame("response", [b"HTTP/1.0 200 OK\r\nConnection: keep-alive\r\n\r\n"])
    plain, _ = frame("request", [b"GET / HTTP/1.1\r\n\r\n"])
    assert close[0].head is not None and not close[0].head.keep_alive
    assert ka[0].head is not None and ka[0].head.keep_alive
    assert plain[0].head is not None and plain[0].head.keep_alive


def test_after_101_the_rest_of_the_stream_is_opaque() -> None:
    _, data, methods = SMALL_CASES["switching protocols"]
    pieces, framer = frame("response", [data, b"HTTP/1.1 200 OK\r\n\r\n"], methods)
    assert kinds(pieces) == [H, OP]
    assert pieces[0].end_of_message
    assert coalesce(pieces)[1].data == b"\x81\x05helloHTTP/1.1 200 OK\r\n\r\n"
    assert framer.tunnel and framer.degraded is None


def test_a_2xx_answer_to_connect_starts_a_tunnel_but_a_407_does_not() -> None:
    ok, framer = frame("response", [b"HTTP/1.1 200 Established\r\n\r\n\x16\x03\x01"], ("CONNECT",))
    assert kinds(ok) == [H, OP] and framer.tunnel
    denied = b"HTTP/1.1 407 Auth\r\nContent-Length: 1\r\n\r\nx"
    no, framer = frame("response", [denied], ("CONNECT",))
    assert kinds(no) == [H, B] and not framer.tunnel


def test_a_connect_request_is_refused_405_and_what_follows_is_framed_not_tunnelled() -> None:
    # A reverse proxy opens no tunnel before a 2xx (nginx answers CONNECT 405): bytes
    # after the head are, as far as the proxy knows, the next request.
    chat = b"POST /v1/chat/completions HTTP/1.1\r\nContent-Length: 0\r\n\r\n"
    pieces, framer = frame("request", [b"CONNECT x:443 HTTP/1.1\r\nHost: x:443\r\n\r\n" + chat])
    assert kinds(pieces) == [H, H] and not framer.tunnel
    assert pieces[0].head is not None and pieces[0].head.method == "CONNECT"
    assert framer.refusal is not None and framer.refusal.status == 405
    assert framer.refusal.message == 0 and framer.refusal.offset == 0


def test_a_2xx_to_connect_turns_the_request_stream_into_a_tunnel() -> None:
    exchange = Http1Exchange()
    exchange.feed(UP, b"CONNECT a:443 HTTP/1.1\r\nHost: a\r\n\r\n")
    exchange.feed(DOWN, b"HTTP/1.1 200 Established\r\n\r\n")
    tls = exchange.feed(UP, b"\x16\x03\x01")
    assert [p.kind for p in tls] == [OP] and exchange.requests.tunnel


@pytest.mark.parametrize(
    ("data", "reason"),
    [
        (b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\nabc", "chunk-size"),
        (b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n1\r\naXY", "CRLF"),
        (b"HTTP/1.1 200 OK\r\nContent-Length: 3, 4\r\n\r\nabc", "Content-Length"),
        (b"HTTP/1.1 200 OK\r\nContent-Length: -1\r\n\r\nabc", "Content-Length"),
        (b"HTTP/1.1 2000 OK\r\n\r\n", "status"),
        (b"SSH-2.0-OpenSSH_9.6\r\n\r\n", "status line"),
        (b"HTTP/1.1 200 OK\r\nBad Header : x\r\n\r\n", "field line"),
        (b"HTTP/1.1 200 OK\r\nA: b\rc\r\n\r\n", "bare CR"),
        (b"HTTP/2.0 200 OK\r\n\r\n", "HTTP/1.x"),
    ],
)
def test_malformed_input_degrades_to_opaque_bytes_and_says_why(data: bytes, reason: str) -> None:
    pieces, framer = frame("response", [data])
    assert joined(pieces) == data
    assert pieces[-1].kind is OP
    assert framer.degraded is not None and reason in framer.degraded


def test_a_request_with_a_non_chunked_transfer_coding_degrades() -> None:
    pieces, framer = frame("request", [b"POST / HTTP/1.1\r\nTransfer-Encoding: gzip\r\n\r\nx"])
    assert kinds(pieces) == [OP]
    assert framer.degraded is not None and "Transfer-Encoding" in framer.degraded


def test_a_head_that_never_ends_degrades_at_the_limit_however_it_is_split() -> None:
    data = b"HTTP/1.1 200 OK\r\nX: " + b"a" * MAX_HEAD_BYTES + b"\r\n\r\n"
    whole, framer = frame("response", [data])
    bytewise, _ = frame("response", [data[i : i + 1000] for i in range(0, len(data), 1000)])
    assert shape(whole) == shape(bytewise) == [(OP, data, 0, False)]
    assert framer.degraded is not None and "longer" in framer.degraded


def test_obsolete_line_folding_is_joined_with_a_space() -> None:
    pieces, _ = frame("request", [b"GET / HTTP/1.1\r\nX-Long: a\r\n \t b\r\n\r\n"])
    assert pieces[0].head is not None and pieces[0].head.header("x-long") == "a b"


def test_head_keeps_field_order_and_case_and_joins_repeated_fields() -> None:
    data = b"GET /p?q=1 HTTP/1.1\r\nHost: h\r\nX-A: 1\r\nx-a: 2\r\nAccept:  */* \r\n\r\n"
    pieces, _ = frame("request", [data])
    head = pieces[0].head
    assert head == Head(
        version="HTTP/1.1",
        headers=(("Host", "h"), ("X-A", "1"), ("x-a", "2"), ("Accept", "*/*")),
        method="GET",
        target="/p?q=1",
    )
    assert head.header("X-a") == "1, 2" and head.header("missing") is None
    assert head.content_length is None and not head.is_chunked


def test_build_head_sets_in_place_removes_and_appends_fields() -> None:
    head = Head(
        version="HTTP/1.1",
        headers=(("Content-Type", "text/event-stream"), ("Content-Length", "5"), ("X-A", "1")),
        status=200,
        reason="OK",
    )
    out = build_head(
        head,
        set_headers={"content-type": "text/plain", "X-Accel-Buffering": "no"},
        remove_headers=["content-length"],
    )
    assert out == (
        b"HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\nX-A: 1\r\nX-Accel-Buffering: no\r\n\r\n"
    )
    reparsed, _ = frame("response", [out])
    assert reparsed[0].head is not None
    assert reparsed[0].head.header("x-accel-buffering") == "no"


def test_build_head_round_trips_a_request_and_a_replaced_status_line() -> None:
    request = Head(version="HTTP/1.1", headers=(("Host", "h"),), method="POST", target="/v1")
    assert build_head(request) == b"POST /v1 HTTP/1.1\r\nHost: h\r\n\r\n"
    bad = dataclasses.replace(request, method=None, target=None, status=502, reason="Bad Gateway")
    assert build_head(bad, [("Content-Length", "0")]).startswith(b"HTTP/1.1 502 Bad Gateway\r\n")


def test_encode_chunk_and_last_chunk_are_read_back_as_the_same_payload() -> None:
    head = b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n"
    body = encode_chunk(b"data: x\n\n") + encode_chunk(b"\xc3\xa9", ";k=v") + LAST_CHUNK_BYTES
    assert encode_chunk(b"abc") == b"3\r\nabc\r\n"
    pieces, framer = frame("response", [head + body])
    assert b"".join(p.data for p in pieces if p.kind is B) == b"data: x\n\n\xc3\xa9"
    assert [p.data for p in pieces if p.kind is CH] == [b"9\r\n", b"2;k=v\r\n"]
    assert framer.message_complete
    with pytest.raises(ValueError, match="LAST_CHUNK_BYTES"):
        encode_chunk(b"")


def test_the_exchange_matches_pipelined_responses_to_their_requests() -> None:
    ex = Http1Exchange()
    ex.feed(UP, b"HEAD /a HTTP/1.1\r\n\r\nPOST /v1/chat/completions HTTP/1.1\r\nContent-Length: 1")
    ex.feed(UP, b'7\r\n\r\n{"model":"qwen"}')
    down = ex.feed(
        DOWN,
        b"HTTP/1.1 200 OK\r\nContent-Length: 99\r\n\r\n"
        b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n3\r\nabc\r\n",
    )
    assert [(p.kind, p.message) for p in down] == [(H, 0), (H, 1), (CH, 1), (B, 1), (CRLF, 1)]
    assert ex.responses.in_body and ex.responses.request_method == "POST"
    req = ex.request_head(1)
    assert req is not None and req.target == "/v1/chat/completions"
    assert ex.request_body(1) == b'{"model":"qwen"}'
    assert ex.request_head(0) is not None and ex.request_body(5) == b""


def test_a_101_turns_the_request_stream_into_a_tunnel_too() -> None:
    ex = Http1Exchange()
    ex.feed(UP, b"GET /ws HTTP/1.1\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n\r\n\x81\x82")
    ex.feed(DOWN, b"HTTP/1.1 101 Switching Protocols\r\nUpgrade: websocket\r\n\r\n")
    assert ex.requests.tunnel
    up = ex.feed(UP, b"ab") + ex.feed_eof(UP)
    assert [(p.kind, p.data) for p in coalesce(up)] == [(OP, b"\x81\x82ab")]
    assert not ex.requests.truncated


def test_start_tunnel_releases_held_head_bytes_as_opaque_on_an_empty_feed() -> None:
    framer = Http1Framer("request")
    assert framer.feed(b"GET /ws HTTP/1.1\r\n\r\n\x81\x82ab")[0].kind is H
    assert framer.in_head and framer.buffered == 4
    framer.start_tunnel()
    assert [(p.kind, p.data, p.message) for p in framer.feed(b"")] == [(OP, b"\x81\x82ab", 1)]
    assert framer.tunnel and not framer.in_head and framer.buffered == 0


def test_the_framer_says_whether_it_is_in_a_head_a_body_or_between_messages() -> None:
    framer = Http1Framer("response")
    framer.expect_response_to("POST")
    seen = []
    for part in [
        b"HTTP/1.1 100 Continue\r\n\r\n",
        b"HTTP/1.1 200 OK\r\n",
        b"Content-Length: 2\r\n\r\n",
        b"a",
        b"b",
    ]:
        framer.feed(part)
        seen.append((framer.in_head, framer.in_body, framer.message_complete))
    assert seen == [
        (True, False, False),
        (True, False, False),
        (False, True, False),
        (False, True, False),
        (False, False, True),
    ]


def test_offsets_count_bytes_from_the_start_of_the_direction() -> None:
    _, data, methods = SMALL_CASES["keep-alive pair"]
    pieces, framer = frame("response", [data[:5], data[5:40], data[40:]], methods)
    position = 0
    for p in pieces:
        assert p.offset == position
        position += len(p.data)
    assert framer.offset == len(data) and framer.buffered == 0


# -- properties over generated pipelines ------------------------------------------------


@st.composite
def messages(draw: st.DrawFn, role: Role) -> tuple[bytes, bytes | None, str]:
    """One message: its bytes, its payload (None: runs until close) and its method."""
    method = draw(st.sampled_from(["GET", "POST", "HEAD"])) if role == "response" else "POST"
    body = draw(st.binary(max_size=300))
    framing = draw(st.sampled_from(["chunked", "length", "none", "interim"]))
    headers = [
        (f"X-{i}", draw(st.text("ab =;", max_size=8))) for i in range(draw(st.integers(0, 3)))
    ]
    if role == "request":
        start = f"{method} /v1/completions HTTP/1.1"
    else:
        start = "HTTP/1.1 200 OK"
    if method == "HEAD" or framing == "none":
        body = b""
    if framing == "chunked" and method != "HEAD":
        headers.append(("Transfer-Encoding", "chunked"))
        rng = random.Random(draw(st.integers(0, 2**32)))
        encoded = b""
        rest = body
        while rest:
            n = rng.randint(1, len(rest))
            ext = rng.choice(["", ";a=b", ';x="y z"', " ;q"])
            encoded += encode_chunk(rest[:n], ext)
            rest = rest[n:]
        trailers = rng.choice([b"", b"X-T: 1\r\n", b"A: 1\r\nB: 2\r\n"])
        encoded += b"0" + rng.choice([b"", b";end"]) + b"\r\n" + trailers + b"\r\n"
    else:
        headers.append(("Content-Length", str(len(body) if method != "HEAD" else 77)))
        encoded = body if method != "HEAD" else b""
    head = "\r\n".join([start, *(f"{n}: {v}" for n, v in headers), "", ""]).encode()
    if framing == "interim" and role == "response":
        head = b"HTTP/1.1 100 Continue\r\n\r\nHTTP/1.1 103 Early Hints\r\nLink: <a>\r\n\r\n" + head
    return head + encoded, body, method


def splits(data: st.DataObject, stream: bytes) -> list[bytes]:
    cuts = sorted(data.draw(st.lists(st.integers(0, len(stream)), max_size=30)))
    edges = [0, *cuts, len(stream)]
    return [stream[a:b] for a, b in itertools.pairwise(edges)]


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.data(), st.sampled_from(["request", "response"]))
def test_random_splits_of_keep_alive_pipelines_give_the_same_pieces_and_payloads(
    data: st.DataObject, role: Role
) -> None:
    msgs = data.draw(st.lists(messages(role), min_size=1, max_size=5))
    stream = b"".join(m[0] for m in msgs)
    methods = tuple(m[2] for m in msgs)
    whole, _ = frame(role, [stream], methods)
    pieces, framer = frame(role, splits(data, stream), methods)
    assert joined(pieces) == stream
    assert shape(pieces) == shape(whole)
    assert not framer.truncated and framer.degraded is None and framer.message == len(msgs)
    payloads = [
        b"".join(p.data for p in pieces if p.kind is B and p.message == i) for i in range(len(msgs))
    ]
    assert payloads == [m[1] for m in msgs]
    assert sum(p.end_of_message for p in pieces) == len(msgs)


@settings(max_examples=200, deadline=None)
@given(st.data())
def test_a_read_until_close_response_after_a_pipeline_ends_at_eof(data: st.DataObject) -> None:
    msgs = data.draw(st.lists(messages("response"), max_size=3))
    last_body = data.draw(st.binary(max_size=500))
    stream = (
        b"".join(m[0] for m in msgs) + b"HTTP/1.1 200 OK\r\nConnection: close\r\n\r\n" + last_body
    )
    methods = (*(m[2] for m in msgs), "POST")
    pieces, framer = frame("response", splits(data, stream), methods)
    assert joined(pieces) == stream
    last = [p for p in pieces if p.message == len(msgs)]
    assert b"".join(p.data for p in last if p.kind is B) == last_body
    assert last[-1].end_of_message and not framer.truncated


@settings(max_examples=200, deadline=None)
@given(st.data(), st.sampled_from(["request", "response"]))
def test_any_bytes_never_raise_and_any_split_gives_the_same_pieces(
    data: st.DataObject, role: Role
) -> None:
    prefix = data.draw(st.sampled_from([b"", b"HTTP/1.1 200 OK\r\n", b"GET / HTTP/1.1\r\n"]))
    noise = data.draw(
        st.lists(
            st.sampled_from(
                [b"\r\n", b"\n", b"\r", b": ", b"a", b"0", b"Content-Length: 3", b"\x00"]
            )
            | st.binary(max_size=8),
            max_size=40,
        )
    )
    stream = prefix + b"".join(noise)
    whole, _ = frame(role, [stream])
    pieces, _ = frame(role, splits(data, stream))
    assert joined(whole) == stream
    assert joined(pieces) == stream
    assert shape(pieces) == shape(whole)


@settings(max_examples=100, deadline=None)
@given(st.data())
def test_a_pipeline_cut_short_anywhere_is_truncated_or_complete_never_lost(
    data: st.DataObject,
) -> None:
    msgs = data.draw(st.lists(messages("response"), min_size=1, max_size=3))
    stream = b"".join(m[0] for m in msgs)
    cut = data.draw(st.integers(0, len(stream)))
    pieces, framer = frame("response", [stream[:cut]], tuple(m[2] for m in msgs))
    assert joined(pieces) == stream[:cut]
    ends = [sum(len(m[0]) for m in msgs[: i + 1]) for i in range(len(msgs))]
    assert framer.truncated == (cut not in (0, *ends))
