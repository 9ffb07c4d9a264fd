"""The head paths' fast ways give what the general ways give.

- a head read whole (nothing held, no blank line before it, CRLF line ends, no bare CR)
  is parsed once from the read and its piece cut from it (`Http1Framer._cut_head`): the
  same pieces and state as the buffered way for every kind of head, whole or split;
- a head's fields looked up by name through its index (`Head.header_values`) give what
  a scan of the fields gives, and the index is no part of the head's value;
- `rebuilt_head` appending only new names (set_header's usual rewrite) gives what the
  general rewrite gives;
- a field line taken in one step (`_FIELD_LINE`) gives what the line-by-line checks give,
  and a line they refuse is refused with their reason.
"""

from __future__ import annotations

import re
from dataclasses import replace

import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from middlebox.core import http1
from middlebox.core.http1 import (
    MAX_HEAD_BYTES,
    Head,
    Http1Framer,
    PieceKind,
    rebuilt_head,
    serialize_head,
)
from tests.core.test_http1_fast_path import assert_same, splits

REQUEST = b"GET /bulk/65536 HTTP/1.1\r\nHost: bench\r\n\r\n"
RESPONSE = b"HTTP/1.1 200 OK\r\nContent-Type: application/octet-stream\r\nContent-Length: 5\r\n\r\n"


def test_a_head_read_whole_is_one_piece_cut_from_the_read_with_its_parsed_head() -> None:
    framer = Http1Framer("request")
    (piece,) = framer.feed(REQUEST)
    assert piece.kind is PieceKind.HEAD and piece.end_of_message
    assert piece.data is REQUEST  # the read itself, no copy through the buffer
    assert piece.head is not None and piece.head.target == "/bulk/65536"
    assert framer.buffered == 0 and framer.message_complete
    framer = Http1Framer("response")
    head, body = framer.feed(RESPONSE + b"hello")
    assert (head.kind, head.data, body.kind, body.data) == (
        PieceKind.HEAD,
        RESPONSE,
        PieceKind.BODY,
        b"hello",
    )
    assert body.end_of_message and body.offset == len(RESPONSE)


HEADS = [
    REQUEST,
    RESPONSE + b"hello",
    b"\r\n" + REQUEST,  # a blank line before the start line (skipped, RFC 9112 §2.2)
    b"GET / HTTP/1.1\nHost: a\n\n",  # bare LF line ends
    b"GET / HTTP/1.1\r\nHost: a\n\r\n",  # a bare LF ending one line
    b"GET / HTTP/1.1\r\nHost: a\r\rb\r\n\r\n",  # a bare CR
    b"GET / HTTP/1.1\r\nHost a\r\n\r\n",  # a malformed field line
    b"GET / HTTP/1.1\r\nContent-Length: 1\r\nTransfer-Encoding: chunked\r\n\r\nx",
    b"CONNECT a:443 HTTP/1.1\r\nHost: a:443\r\n\r\n",
    b"GET / HTTP/1.1\r\nConnection: close\r\n\r\nGET / HTTP/1.1\r\n\r\n",
    b"HTTP/1.1 100 Continue\r\n\r\nHTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok",
    b"HTTP/1.1 101 Switching Protocols\r\nUpgrade: x\r\n\r\nraw",
    b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n2\r\nok\r\n0\r\n\r\n",
    b"HTTP/1.1 2000 OK\r\n\r\n",  # a malformed status line
    b"HTTP/1.1 204 No Content\r\nX: 1\r\n\r\nHTTP/1.1 304 Not Modified\r\n\r\n",
]


def test_every_kind_of_head_frames_as_the_buffered_way_whole_and_split() -> None:
    for wire in HEADS:
        role = "request" if not wire.startswith(b"HTTP/") else "response"
        assert_same(role, [wire])
        for cut in range(len(wire) + 1):
            assert_same(role, [wire[:cut], wire[cut:]])


def test_a_head_past_the_limit_read_whole_is_refused_as_the_buffered_way_refuses_it() -> None:
    wire = b"GET / HTTP/1.1\r\nX-Big: " + b"a" * MAX_HEAD_BYTES + b"\r\n\r\n"
    for parts in ([wire], [wire[:100], wire[100:]], [wire[:-1], wire[-1:]]):
        pieces = assert_same("request", parts)
        assert {p.kind for p in pieces} == {PieceKind.OPAQUE}  # refused: passed on raw


names = st.sampled_from(["Host", "host", "X-A", "x-a", "Content-Length", "Connection", "Te"])
values = st.sampled_from(["1", "close", "keep-alive", "chunked", "a b", ""])
fields = st.lists(st.tuples(names, values), max_size=6)


@settings(max_examples=200, deadline=None)
@given(
    fields=fields,
    eols=st.lists(st.sampled_from([b"\r\n", b"\n"]), min_size=8, max_size=8),
    space=st.booleans(),
    body=st.binary(max_size=8),
    cuts=st.lists(st.integers(min_value=0, max_value=500), max_size=3),
)
def test_generated_requests_frame_as_the_buffered_way(
    fields: list[tuple[str, str]], eols: list[bytes], space: bool, body: bytes, cuts: list[int]
) -> None:
    lines = [b"POST /v1/x HTTP/1.1"] + [
        f"{n}:{' ' if space else ''}{v}".encode("latin-1") for n, v in fields
    ]
    wire = b"".join(line + eols[i % len(eols)] for i, line in enumerate(lines))
    wire += eols[-1] + body + b"GET / HTTP/1.1\r\n\r\n"
    assert_same("request", [wire])
    assert_same("request", splits(wire, cuts))


@settings(max_examples=200, deadline=None)
@given(fields=fields, lookups=st.lists(names, max_size=4))
def test_header_lookups_by_the_index_equal_a_scan_of_the_fields(
    fields: list[tuple[str, str]], lookups: list[str]
) -> None:
    head = Head("HTTP/1.1", tuple(fields), status=200, reason="OK")
    twin = Head("HTTP/1.1", tuple(fields), status=200, reason="OK")
    for name in [*lookups, "absent"]:
        want = [v for n, v in fields if n.lower() == name.lower()]
        assert head.header_values(name) == want
        assert head.header(name) == (", ".join(want) if want else None)
    # the index, built on `head` and not on `twin`, is no part of the value
    assert head == twin and hash(head) == hash(twin) and repr(head) == repr(twin)
    assert replace(head, status=201).header_values("host") == head.header_values("host")


def reference_rebuilt_head(
    head: Head, set_headers: dict[str, str], remove_headers: list[str]
) -> Head:
    """The general rewrite, as `rebuilt_head` runs it when a set name is present."""
    new = {n.lower(): (n, v) for n, v in set_headers.items()}
    removed = {n.lower() for n in remove_headers}
    out: list[tuple[str, str]] = []
    placed: set[str] = set()
    for name, value in head.headers:
        key = name.lower()
        if key in removed or key in placed:
            continue
        if key in new:
            placed.add(key)
            out.append((name, new[key][1]))
        else:
            out.append((name, value))
    out += [nv for key, nv in new.items() if key not in placed and key not in removed]
    return replace(head, headers=tuple(out))


@settings(max_examples=300, deadline=None)
@given(
    fields=fields,
    sets=st.dictionaries(names, values, max_size=3),
    removes=st.lists(names, max_size=2),
    request=st.booleans(),
)
def test_rebuilt_head_equals_the_general_rewrite(
    fields: list[tuple[str, str]], sets: dict[str, str], removes: list[str], request: bool
) -> None:
    if request:
        head = Head("HTTP/1.1", tuple(fields), method="GET", target="/x")
    else:
        head = Head("HTTP/1.0", tuple(fields), status=404, reason="Not Found")
    got = rebuilt_head(head, sets, removes)
    want = reference_rebuilt_head(head, sets, removes)
    assert got == want
    assert serialize_head(got) == serialize_head(want)
    assert got.header_values("x-a") == want.header_values("x-a")


def parsed(lines: list[str]) -> object:
    try:
        return http1._parse_fields(lines)
    except http1._Malformed as exc:
        return ("refused", str(exc))


@settings(max_examples=400, deadline=None)
@example(lines=["X-A: a\r\r"])  # a bare CR after the value
@example(lines=["X-A: a \t\r", " folded\r"])  # an obs-fold
@example(lines=["X A: b\r", "X-A:\x7f"])
@given(
    lines=st.lists(
        st.text(alphabet="Ab-_:; \t\r\x00\x7f\x1fé,=(", max_size=12).map(
            lambda line: line if ":" in line[:4] else "X-A:" + line
        ),
        min_size=1,
        max_size=4,
    )
)
def test_field_lines_in_one_step_parse_as_the_checks_parse_them(lines: list[str]) -> None:
    got = parsed(lines)
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(http1, "_FIELD_LINE", re.compile(r"(?!)"))  # never matches
        want = parsed(lines)
    assert got == want
