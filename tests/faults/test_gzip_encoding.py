"""gzip_encoding: nginx's gzip filter on a token stream, buffered (none) or flushed (sync)."""

from __future__ import annotations

import itertools
import random
import zlib

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from faults._lib.hop_close import HopClose
from faults._lib.match import RequestMatch
from faults.gzip_encoding import NGINX_GZIP_HEADER, GzipEncoding
from faults.testing import TimedItem, replay
from middlebox.core.http1 import LAST_CHUNK_BYTES, Head, Http1Framer, PieceKind, encode_chunk
from middlebox.core.stream import DOWN, UP, Chunk, Eof, Reset
from tests.faults.httpstreams import (
    DONE,
    REQUEST,
    SSE_HEAD,
    contents,
    down_bytes,
    event,
    request,
    resliced,
    sse_response,
    timeline,
)

GZ_HEAD = (
    b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream; charset=utf-8\r\n"
    b"transfer-encoding: chunked\r\nContent-Encoding: gzip\r\nVary: Accept-Encoding\r\n\r\n"
)


def decoded(wire: bytes) -> tuple[Head | None, bytes, bool]:
    """What a client makes of the response: its head, the gunzipped body so far, and
    whether the HTTP message is complete."""
    framer = Http1Framer("response")
    pieces = framer.feed(wire)
    head = next((p.head for p in pieces if p.kind is PieceKind.HEAD), None)
    body = b"".join(p.data for p in pieces if p.kind is PieceKind.BODY)
    complete = any(p.end_of_message for p in pieces)
    inflater = zlib.decompressobj(wbits=31)
    return head, inflater.decompress(body), complete


def body_of(writes: list[bytes]) -> bytes:
    """The de-chunked body the upstream sent."""
    framer = Http1Framer("response")
    return b"".join(p.data for p in framer.feed(b"".join(writes)) if p.kind is PieceKind.BODY)


def test_sync_flush_sends_the_head_at_once_and_each_event_decodable_on_arrival() -> None:
    writes = sse_response("Hel", "lo")
    out = replay(GzipEncoding(flush="sync"), timeline(writes))
    down = [(t, i.data) for t, i in out if isinstance(i, Chunk) and i.direction is DOWN]
    assert [t for t, _ in down] == [1.0, 2.0, 3.0, 4.0, 5.0]
    assert down[0][1].startswith(GZ_HEAD + b"f\r\n" + NGINX_GZIP_HEADER)
    # After each write the client can decode exactly the events sent so far.
    events = [event("Hel"), event("lo"), DONE]
    for k in range(1, 4):
        _, text, complete = decoded(b"".join(data for _, data in down[: k + 1]))
        assert text == b"".join(events[:k])
        assert not complete
    _, text, complete = decoded(down_bytes(out))
    assert (text, complete) == (b"".join(events), True)
    assert down_bytes(out).endswith(LAST_CHUNK_BYTES)


def test_without_flush_a_short_stream_arrives_in_one_burst_at_the_end() -> None:
    writes = sse_response("a", "b", "c")
    fault = GzipEncoding()
    out = replay(fault, timeline(writes))
    assert [t for t, i in out if i.direction is DOWN] == [6.0]
    wire = down_bytes(out)
    assert wire.startswith(GZ_HEAD + encode_chunk(NGINX_GZIP_HEADER))
    _, text, complete = decoded(wire)
    assert (text, complete) == (body_of(writes), True)
    assert [r.action for r in fault.reports] == ["compressing", "compressed"]
    assert fault.reports[1].details["size"] == len(body_of(writes))


def test_without_flush_output_leaves_only_in_full_4k_buffers_until_the_end() -> None:
    rng = random.Random(7)
    alphabet = "abcdefghijklmnopqrstuvwxyz€é "
    words = ["".join(rng.choice(alphabet) for _ in range(60)) for _ in range(1200)]
    writes = sse_response(*words)
    out = replay(GzipEncoding(), timeline(writes))
    bursts = [(t, i.data) for t, i in out if isinstance(i, Chunk) and i.direction is DOWN]
    framer = Http1Framer("response")
    sizes = [
        sum(len(p.data) for p in framer.feed(data) if p.kind is PieceKind.BODY)
        for _, data in bursts
    ]
    # The 10-byte gzip header rides with the first burst; every burst but the last is
    # a whole number of 4 KiB buffers.
    assert len(sizes) > 2 and (sizes[0] - 10) % 4096 == 0
    assert all(size % 4096 == 0 for size in sizes[1:-1])
    # The first burst leaves with the write after which zlib (level 1, window 15,
    # memLevel 8, as nginx sets it) has produced its first 4 KiB.
    probe = zlib.compressobj(1, zlib.DEFLATED, -15, 8)
    produced = list(
        itertools.accumulate(len(probe.compress(body_of([SSE_HEAD, w]))) for w in writes[1:])
    )
    first = next(k for k, total in enumerate(produced) if total >= 4096)
    assert bursts[0][0] == float(first + 2)  # write k (from 0) after the head is at k + 2 s
    assert decoded(down_bytes(out))[1] == body_of(writes)


def test_a_content_length_json_body_becomes_chunked_gzip() -> None:
    body = b'{"choices":[{"message":{"content":"hello hello hello"}}]}'
    head = (
        b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\n"
        b'Content-Length: %d\r\nETag: "abc"\r\nAccept-Ranges: bytes\r\n\r\n' % len(body)
    )
    out = replay(GzipEncoding(), timeline([head, body]))
    got, text, complete = decoded(down_bytes(out))
    assert got is not None and (text, complete) == (body, True)
    assert got.header("content-length") is None and got.header("accept-ranges") is None
    assert (got.header("transfer-encoding"), got.header("content-encoding")) == ("chunked", "gzip")
    assert got.header("etag") == 'W/"abc"'


@pytest.mark.parametrize(
    ("request_bytes", "writes"),
    [
        (request(extra=b""), sse_response("a")),
        (request(extra=b"Accept-Encoding: gzip;q=0, br\r\n"), sse_response("a")),
        (request().replace(b"HTTP/1.1", b"HTTP/1.0"), sse_response("a")),
        (REQUEST, [SSE_HEAD.replace(b"200 OK", b"500 Internal Server Error"), LAST_CHUNK_BYTES]),
        (REQUEST, [SSE_HEAD.replace(b"text/event-stream", b"image/png"), LAST_CHUNK_BYTES]),
        (REQUEST, [SSE_HEAD.replace(b"\r\n\r\n", b"\r\nContent-Encoding: br\r\n\r\n")]),
        (REQUEST, [b"HTTP/1.1 204 No Content\r\n\r\n"]),
        (
            REQUEST,
            [b"HTTP/1.1 200 OK\r\nContent-Type: text/html\r\nContent-Length: 5\r\n\r\nhello"],
        ),
    ],
    ids=[
        "no-accept-encoding",
        "gzip-q0",
        "http-1.0",
        "status-500",
        "type-not-listed",
        "already-encoded",
        "no-body",
        "under-min-length",
    ],
)
def test_responses_nginx_would_not_compress_pass_byte_for_byte(
    request_bytes: bytes, writes: list[bytes]
) -> None:
    fault = GzipEncoding()
    out = replay(fault, timeline(writes, request_bytes=request_bytes))
    assert down_bytes(out) == b"".join(writes)
    assert not fault.fired


def test_the_accept_encoding_check_can_be_ignored_and_the_types_widened() -> None:
    writes = [SSE_HEAD.replace(b"text/event-stream", b"text/plain"), *sse_response("a")[1:]]
    fault = GzipEncoding(require_accept_encoding=False, content_types=("*",))
    out = replay(fault, timeline(writes, request_bytes=request(extra=b"")))
    assert decoded(down_bytes(out))[1] == body_of(writes)


def test_an_upstream_that_dies_mid_response_leaves_no_terminal_chunk() -> None:
    writes = sse_response("a", "b", done=False)
    fault = GzipEncoding(flush="sync")
    out = replay(fault, [*timeline(writes), (9.0, Eof(DOWN))])
    assert out[-1] == (9.0, Eof(DOWN))
    assert not down_bytes(out).endswith(LAST_CHUNK_BYTES)
    # Sync mode already sent every block; the close's flush has nothing left to add.
    assert (fault.reports[-1].action, fault.reports[-1].details["size"]) == ("flushed_on_close", 0)


def test_requests_the_match_does_not_select_are_not_compressed() -> None:
    writes = sse_response("a")
    fault = GzipEncoding(match=RequestMatch(path="/v1/completions"))
    out = replay(fault, timeline(writes))
    assert down_bytes(out) == b"".join(writes)


@pytest.mark.parametrize(
    ("config", "message"),
    [
        ({"flush": "full"}, "flush must be one of"),
        ({"level": 0}, "level must be 1..9"),
        ({"buffer_size": 0}, "buffer_size must be > 0"),
        ({"content_types": ()}, "content_types"),
    ],
)
def test_bad_config_is_refused_with_a_clear_message(
    config: dict[str, object], message: str
) -> None:
    with pytest.raises(ValueError, match=message):
        GzipEncoding(**config)  # type: ignore[arg-type]


@settings(max_examples=50, deadline=None)
@given(contents, st.sampled_from(["none", "sync"]), st.data())
def test_the_client_inflates_exactly_the_upstream_body_however_it_was_sliced(
    words: list[str], flush: str, data: st.DataObject
) -> None:
    wire = b"".join(sse_response(*words))
    writes = data.draw(resliced(wire, max_cuts=10))
    out = replay(GzipEncoding(flush=flush), timeline(writes))  # type: ignore[arg-type]
    head, text, complete = decoded(down_bytes(out))
    assert head is not None and head.header("content-encoding") == "gzip"
    assert (text, complete) == (body_of([wire]), True)
    times = [t for t, _ in out]
    assert times == sorted(times)


@given(st.integers(0, 2**32))
def test_the_same_seed_gives_the_same_decisions(seed: int) -> None:
    def run() -> list[TimedItem]:
        fault = GzipEncoding(match=RequestMatch(probability=0.5))
        return replay(fault, timeline(sse_response("a", "b")), seed=seed)

    assert run() == run()


def test_requests_are_passed_through_untouched() -> None:
    out = replay(GzipEncoding(), [(0.0, Chunk(UP, REQUEST))])
    assert out == [(0.0, Chunk(UP, REQUEST))]


def test_a_read_timeout_after_the_head_flushes_the_head_and_the_compressed_data() -> None:
    # nginx with buffering: the timeout's NGX_HTTP_FLUSH makes zlib sync-flush, so the
    # client gets a 200 with Content-Encoding: gzip and every event so far, decodable,
    # and then the close without the terminal chunk.
    writes = sse_response("a", "b", done=False)
    fault = GzipEncoding()
    out = replay(fault, [*timeline(writes), (63.0, HopClose(DOWN))])
    assert [(t, type(i).__name__) for t, i in out if i.direction is DOWN] == [
        (63.0, "Chunk"),
        (63.0, "HopClose"),
    ]
    wire = down_bytes(out)
    assert wire.startswith(GZ_HEAD + encode_chunk(NGINX_GZIP_HEADER))
    assert not wire.endswith(LAST_CHUNK_BYTES)
    head, text, complete = decoded(wire)
    assert head is not None and head.status == 200
    assert (text, complete) == (event("a") + event("b"), False)
    assert fault.reports[-1].action == "flushed_on_close"
    assert fault.reports[-1].details["size"] == len(wire)


def test_an_rst_loses_what_zlib_held() -> None:
    writes = sse_response("a", "b", done=False)
    fault = GzipEncoding()
    out = replay(fault, [*timeline(writes), (9.0, Reset(DOWN))])
    assert out[-1] == (9.0, Reset(DOWN)) and down_bytes(out) == b""
    assert fault.reports[-1].action == "truncated"
