"""RFC 9112 §6-7 as an intermediary must apply them, with nginx 1.22's answers.

Each case is one that let a request past the faults (or waited forever) before: the
framer refuses it (`Http1Framer.refusal`, with nginx's status) at any split, and the
bytes still come out exactly as they went in (the framer never rewrites).
"""

from __future__ import annotations

import pytest

from middlebox.core.http1 import Http1Framer, Piece, PieceKind, Role, coalesce

CHAT = b"POST /v1/chat/completions HTTP/1.1\r\nHost: a\r\nContent-Length: 2\r\n\r\n{}"


def frame_every_split(role: Role, data: bytes) -> tuple[list[Piece], Http1Framer]:
    """Frame `data` whole, then at every two-way split; all must agree."""
    whole = Http1Framer(role)
    pieces = whole.feed(data) + whole.feed_eof()
    for cut in range(1, len(data)):
        framer = Http1Framer(role)
        split = framer.feed(data[:cut]) + framer.feed(data[cut:]) + framer.feed_eof()
        assert b"".join(p.data for p in split) == data
        assert [(p.kind, p.data) for p in coalesce(split)] == [
            (p.kind, p.data) for p in coalesce(pieces)
        ], cut
        assert framer.refusal == whole.refusal, cut
    return pieces, whole


REFUSED_REQUESTS = [
    (
        "CL and TE together",
        b"POST / HTTP/1.1\r\nContent-Length: 3\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\n",
        "Content-Length and Transfer-Encoding",
        400,
    ),
    (
        "folded Transfer-Encoding",
        b"POST / HTTP/1.1\r\nTransfer-Encoding:\r\n chunked\r\n\r\n0\r\n\r\n",
        "folded",
        400,
    ),
    (
        "TE in an HTTP/1.0 request",
        b"POST / HTTP/1.0\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\n",
        "HTTP/1.0",
        400,
    ),
    (
        "chunked twice on two lines",
        b"POST / HTTP/1.1\r\nTransfer-Encoding: chunked\r\nTransfer-Encoding: chunked\r\n\r\n",
        "repeated",
        400,
    ),
    (
        "chunked twice in one line",
        b"POST / HTTP/1.1\r\nTransfer-Encoding: chunked, chunked\r\n\r\n0\r\n\r\n",
        "repeated",
        400,
    ),
    (
        "a 20-digit Content-Length",
        b"POST / HTTP/1.1\r\nContent-Length: 99999999999999999999\r\n\r\nx",
        "too large",
        400,
    ),
    (
        "a chunk size past off_t",
        b"POST / HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\nffffffffffffffff\r\nx",
        "too large",
        400,
    ),
    (
        "double space in the request line",
        b"POST  /v1/chat/completions HTTP/1.1\r\n\r\n",
        "request line",
        400,
    ),
    ("NUL in the target", b"GET /a\x00b HTTP/1.1\r\nHost: a\r\n\r\n", "control byte", 400),
    (
        "a control byte in the target",
        b"GET /a\x01b HTTP/1.1\r\nHost: a\r\n\r\n",
        "control byte",
        400,
    ),
    ("NUL in a header value", b"GET / HTTP/1.1\r\nX-A: a\x00b\r\n\r\n", "control byte", 400),
    ("DEL in a header value", b"GET / HTTP/1.1\r\nX-A: a\x7fb\r\n\r\n", "control byte", 400),
    (
        "an unknown transfer coding",
        b"POST / HTTP/1.1\r\nTransfer-Encoding: gzip\r\n\r\n",
        "chunked",
        501,
    ),
]


@pytest.mark.parametrize(
    ("data", "reason", "status"),
    [case[1:] for case in REFUSED_REQUESTS],
    ids=[case[0] for case in REFUSED_REQUESTS],
)
def test_an_intermediary_refuses_what_nginx_refuses_at_any_split(
    data: bytes, reason: str, status: int
) -> None:
    pieces, framer = frame_every_split("request", data + CHAT)
    refusal = framer.refusal
    assert refusal is not None and reason in refusal.reason and refusal.status == status
    assert refusal.message == 0 and refusal.offset == 0
    # Nothing after the refused message is framed as a second request: no chat head.
    assert [p for p in pieces if p.head is not None and p.head.method == "POST"][1:] == []


def test_the_smuggled_request_in_a_chunked_body_is_never_a_second_message() -> None:
    data = b"POST /v1/chat/completions HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n\r\n" + CHAT
    pieces, framer = frame_every_split("request", data)
    assert [p.kind for p in coalesce(pieces)] == [PieceKind.HEAD, PieceKind.OPAQUE]
    assert framer.refusal is not None and "chunk-size" in framer.refusal.reason
    # The head went out as a message's head; the refusal says where its bytes began.
    assert framer.refusal.offset == 0 and framer.refusal.at == len(data) - len(CHAT) - 2


def test_a_zero_padded_18_digit_chunk_size_is_accepted() -> None:
    data = (
        b"POST / HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n"
        b"000000000000000005\r\nhello\r\n0\r\n\r\n"
    )
    pieces, framer = frame_every_split("request", data)
    assert framer.refusal is None and framer.degraded is None
    assert b"".join(p.data for p in pieces if p.kind is PieceKind.BODY) == b"hello"


def test_data_after_connection_close_is_not_framed_as_a_second_message() -> None:
    first = b"GET / HTTP/1.1\r\nConnection: close\r\n\r\n"
    pieces, framer = frame_every_split("request", first + CHAT)
    assert [p.kind for p in coalesce(pieces)] == [PieceKind.HEAD, PieceKind.OPAQUE]
    refusal = framer.refusal
    # nginx reads and discards such bytes without an answer: no status.
    assert refusal is not None and refusal.status is None and refusal.message == 1
    assert refusal.at == len(first)


def test_an_http_1_0_request_without_keep_alive_ends_the_connection_too() -> None:
    _, framer = frame_every_split("request", b"GET / HTTP/1.0\r\n\r\n" + CHAT)
    assert framer.refusal is not None and framer.refusal.status is None


def test_proxy_connection_close_is_ignored_as_nginx_does() -> None:
    # nginx has no handler for Proxy-Connection (ngx_http_headers_in): the connection
    # persists and the next request is framed as one.
    first = b"GET / HTTP/1.1\r\nProxy-Connection: close\r\n\r\n"
    pieces, framer = frame_every_split("request", first + CHAT)
    assert [p.head.method for p in pieces if p.head is not None] == ["GET", "POST"]
    assert framer.refusal is None


@pytest.mark.parametrize(
    "data",
    [
        b"HTTP/1.1 200 O\x00K\r\nContent-Length: 0\r\n\r\n",
        b"HTTP/1.1 200 OK\r\nX-A: \x01\r\nContent-Length: 0\r\n\r\n",
        b"HTTP/1.1 200 OK\r\nContent-Length: 1\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\n",
    ],
    ids=["NUL in the reason phrase", "control byte in a value", "CL and TE"],
)
def test_a_response_with_control_bytes_or_cl_and_te_is_refused(data: bytes) -> None:
    _, framer = frame_every_split("response", data)
    assert framer.refusal is not None and framer.refusal.status == 400


def test_a_tab_in_a_header_value_and_obs_text_are_accepted() -> None:
    _, framer = frame_every_split("request", b"GET / HTTP/1.1\r\nX-A: a\tb\xe9\r\n\r\n")
    assert framer.refusal is None


def test_a_bare_cr_in_a_head_is_refused_400_at_any_split_even_if_the_head_never_ends() -> None:
    # nginx reads `\r` then a byte that is not `\n` as an invalid header at once.
    data = b"PUT /url HTTP/1.1\r\nContent-Length: 3\r\n\rabc"
    pieces, framer = frame_every_split("request", data)
    assert framer.refusal is not None and framer.refusal.status == 400
    assert "bare CR" in framer.refusal.reason and framer.refusal.offset == 0
    assert [p.kind for p in pieces] == [PieceKind.OPAQUE]


def test_a_cr_in_the_body_after_a_head_in_the_same_read_is_only_body() -> None:
    data = b"HTTP/1.1 200 OK\r\nContent-Length: 4\r\n\r\n\rX\rY"
    pieces, framer = frame_every_split("response", data)
    assert framer.refusal is None
    assert [p.kind for p in coalesce(pieces)] == [PieceKind.HEAD, PieceKind.BODY]


def test_a_cr_lf_split_between_two_reads_is_a_line_end_not_a_bare_cr() -> None:
    framer = Http1Framer("request")
    pieces = framer.feed(b"GET / HTTP/1.1\r") + framer.feed(b"\nHost: a\r") + framer.feed(b"\n\r\n")
    assert framer.refusal is None and [p.kind for p in pieces] == [PieceKind.HEAD]
