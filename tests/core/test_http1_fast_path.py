"""The framer's fast path (body bytes whose boundaries are known, cut straight from what
was fed) makes exactly the pieces, and leaves exactly the state, of the buffered way.

Every case runs twice on the same splits: once as shipped, once with the fast path
turned off (`_cut_direct` cutting nothing, so every byte goes through the buffer and
`_step`), and the two must agree piece for piece, offset for offset."""

from __future__ import annotations

import itertools
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from middlebox.core.http1 import Http1Framer, Piece, PieceKind, Role


class BufferedOnly(Http1Framer):
    """The framer with its fast path off: the reference it must equal."""

    def _cut_direct(self, data: bytes, out: list[Piece]) -> int:
        return 0


def run(framer: Http1Framer, parts: list[bytes]) -> list[Piece]:
    pieces: list[Piece] = []
    for part in parts:
        pieces += framer.feed(part)
    pieces += framer.feed_eof()
    return pieces


def state(framer: Http1Framer) -> dict[str, Any]:
    return {
        "message": framer.message,
        "complete": framer.message_complete,
        "degraded": framer.degraded,
        "refusal": framer.refusal,
        "truncated": framer.truncated,
        "offset": framer.offset,
        "held": framer.held,
        "body": framer.body_received,
    }


def assert_same(role: Role, parts: list[bytes]) -> list[Piece]:
    fast, buffered = Http1Framer(role), BufferedOnly(role)
    got, want = run(fast, parts), run(buffered, parts)
    assert got == want
    assert state(fast) == state(buffered)
    assert b"".join(p.data for p in got) == b"".join(parts)  # byte-exact
    return got


def splits(data: bytes, cuts: list[int]) -> list[bytes]:
    points = sorted({c % (len(data) + 1) for c in cuts})
    edges = [0, *points, len(data)]
    return [data[a:b] for a, b in itertools.pairwise(edges) if b > a]


SSE_FRAME = b"data: " + b"x" * 192 + b"\n\n"
CHUNKED_HEAD = b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n"


def test_an_sse_frame_per_read_is_three_pieces_cut_from_the_read() -> None:
    frame = b"%x\r\n" % len(SSE_FRAME) + SSE_FRAME + b"\r\n"
    pieces = assert_same("response", [CHUNKED_HEAD, frame, frame])
    assert [p.kind for p in pieces[1:4]] == [
        PieceKind.CHUNK_HEADER,
        PieceKind.BODY,
        PieceKind.CHUNK_TRAILER_CRLF,
    ]
    assert pieces[2].data == SSE_FRAME
    assert pieces[4].offset == len(CHUNKED_HEAD) + len(frame)


def test_a_content_length_body_read_whole_is_the_read_itself() -> None:
    body = b"y" * 65536
    framer = Http1Framer("response")
    framer.feed(b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\n\r\n" % (2 * len(body)))
    first = framer.feed(body)
    assert [p.kind for p in first] == [PieceKind.BODY]
    assert first[0].data is body  # no copy: the piece is the bytes that were read
    (last,) = framer.feed(body)
    assert last.end_of_message and framer.message_complete


@pytest.mark.parametrize(
    "wire",
    [
        # a chunk line split over reads, a bare-LF CRLF, an extension, the last chunk
        # and trailers (left to the buffered way), then a second message
        CHUNKED_HEAD + b"5;ext=1\r\nhello\n3\r\nabc\r\n0\r\nX-T: 1\r\n\r\n"
        b"HTTP/1.1 200 OK\r\nContent-Length: 4\r\n\r\nwxyz",
        CHUNKED_HEAD + b"4\r\nabcdXX",  # chunk data not followed by CRLF: degraded
        # whole chunks in one read, then one whose data ends in a CR without its LF
        CHUNKED_HEAD + b"4\r\nabcd\r\n2;x\r\nef\r\n4\r\nghij\rX",
        CHUNKED_HEAD + b"4\r\nabcd\r\n4\r\nefgh\n1\r\nz\r\n0\r\n\r\n",  # a bare LF
        CHUNKED_HEAD + b"zz\r\n",  # a malformed chunk-size line
        CHUNKED_HEAD + b"FFFFFFFFFFFFFFFFFFFF\r\n",  # a chunk too large
        b"HTTP/1.1 200 OK\r\n\r\nuntil the close",  # read until close
        b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\nConnection: close\r\n\r\nokmore",
        b"HTTP/1.1 101 Switching Protocols\r\nUpgrade: websocket\r\n"
        b"Connection: Upgrade\r\n\r\nopaque frames",
    ],
)
def test_every_read_split_frames_alike(wire: bytes) -> None:
    for cut in range(len(wire) + 1):
        assert_same("response", [wire[:cut], wire[cut:]])
    assert_same("response", [wire[i : i + 1] for i in range(len(wire))])


chunk_sizes = st.lists(st.integers(min_value=1, max_value=40), max_size=6)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    sizes=chunk_sizes,
    lf_only=st.booleans(),
    length=st.integers(min_value=0, max_value=50),
    cuts=st.lists(st.integers(min_value=0, max_value=10_000), max_size=12),
)
def test_chunked_then_length_messages_frame_alike_on_any_splits(
    sizes: list[int], lf_only: bool, length: int, cuts: list[int]
) -> None:
    eol = b"\n" if lf_only else b"\r\n"
    body = b"".join(b"%x" % n + eol + bytes(range(65, 65 + n)) + eol for n in sizes)
    wire = (
        CHUNKED_HEAD
        + body
        + b"0\r\n\r\n"
        + b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\n\r\n" % length
        + b"z" * length
    )
    assert_same("response", splits(wire, cuts))


@settings(max_examples=100, deadline=None)
@given(
    length=st.integers(min_value=0, max_value=64),
    cuts=st.lists(st.integers(min_value=0, max_value=10_000), max_size=8),
)
def test_request_bodies_frame_alike_on_any_splits(length: int, cuts: list[int]) -> None:
    wire = (b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Length: %d\r\n\r\n" % length) + (
        b"q" * length
    ) * 2  # the second copy is not a request: how it is refused must match too
    assert_same("request", splits(wire, cuts))
