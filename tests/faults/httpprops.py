"""Wire material and checks shared by the HTTP fault tests.

`request()` is an OpenAI-style POST; `sse_response()` is what vLLM 0.33 sends through
uvicorn (reference §5: lower-case fields, `text/event-stream; charset=utf-8`, chunked,
one `data: ...\\n\\n` frame per chunk). `resplit` cuts a byte stream at arbitrary points,
so properties can say "whatever the TCP segmentation".
"""

from __future__ import annotations

import itertools
import json

from hypothesis import strategies as st

from faults.testing import TimedItem
from middlebox.core.fault import Fault
from middlebox.core.http1 import LAST_CHUNK_BYTES, Http1Framer, PieceKind, encode_chunk
from middlebox.core.stream import Chunk, Direction, Item

SSE_HEAD = (
    b"HTTP/1.1 200 OK\r\n"
    b"date: Sun, 29 Nov 2026 07:02:39 GMT\r\n"
    b"server: uvicorn\r\n"
    b"content-type: text/event-stream; charset=utf-8\r\n"
    b"x-accel-buffering: no\r\n"
    b"transfer-encoding: chunked\r\n\r\n"
)


def request(
    path: str = "/v1/chat/completions", model: str = "Qwen/Qwen3-0.6B", method: str = "POST"
) -> bytes:
    body = json.dumps({"model": model, "stream": True}).encode()
    return (
        f"{method} {path} HTTP/1.1\r\nHost: upstream\r\nContent-Type: application/json\r\n"
        f"Content-Length: {len(body)}\r\n\r\n"
    ).encode() + body


def frame(i: int) -> bytes:
    """One vLLM-shaped SSE frame carrying token `i` (ASCII and a multi-byte character)."""
    return b'data: {"choices":[{"delta":{"content":"t%d\xc3\xa9"}}]}\n\n' % i


def sse_chunks(events: int, done: bool = True) -> list[bytes]:
    """The chunked body: one chunk per frame, then `[DONE]` and the last chunk."""
    chunks = [encode_chunk(frame(i)) for i in range(events)]
    if done:
        chunks.append(encode_chunk(b"data: [DONE]\n\n"))
    return [*chunks, LAST_CHUNK_BYTES]


def sse_response(events: int = 3, done: bool = True) -> bytes:
    return SSE_HEAD + b"".join(sse_chunks(events, done))


def resplit(data: bytes, cuts: list[int]) -> list[bytes]:
    """`data` cut at the given offsets (clamped, deduplicated)."""
    bounds = sorted({0, len(data), *(min(max(c, 0), len(data)) for c in cuts)})
    return [data[lo:hi] for lo, hi in itertools.pairwise(bounds)]


cut_lists = st.lists(st.integers(0, 2000), max_size=8)


def timed(direction: Direction, pieces: list[bytes], start: float, step: float) -> list[TimedItem]:
    """The pieces as chunks `step` seconds apart from `start`."""
    return [(start + i * step, Chunk(direction, p)) for i, p in enumerate(pieces)]


def exchanges(response: bytes, count: int = 8) -> list[TimedItem]:
    """`count` request/response exchanges on one keep-alive connection, one a second."""
    timeline: list[TimedItem] = []
    for i in range(count):
        timeline += [
            (i * 1.0, Chunk(Direction.UPSTREAM, request())),
            (i + 0.5, Chunk(Direction.DOWNSTREAM, response)),
        ]
    return timeline


def rechunk(body: bytes, cuts: list[int]) -> bytes:
    """`body` as a chunked payload cut into chunks at `cuts`, with the last chunk."""
    return b"".join(encode_chunk(p) for p in resplit(body, cuts) if p) + LAST_CHUNK_BYTES


def dechunked(wire: bytes) -> list[tuple[bytes, bool]]:
    """Each response on `wire`: its payload and whether its framing was complete and
    valid (the framer neither degraded nor saw a truncated message)."""
    framer = Http1Framer("response")
    pieces = framer.feed(wire) + framer.feed_eof()
    bodies: dict[int, bytearray] = {}
    ended: set[int] = set()
    for piece in pieces:
        bodies.setdefault(piece.message, bytearray())
        if piece.kind is PieceKind.BODY:
            bodies[piece.message] += piece.data
        if piece.end_of_message:
            ended.add(piece.message)
    valid = framer.degraded is None
    return [(bytes(body), valid and m in ended) for m, body in sorted(bodies.items())]


def counting(fault: Fault) -> list[Item]:
    """The items `fault.on_item` is called with from now on."""
    seen: list[Item] = []
    inner = fault.on_item

    def on_item(item: Item, now: float) -> list[Item]:
        seen.append(item)
        return inner(item, now)

    fault.on_item = on_item  # type: ignore[method-assign]
    return seen


def spread_splits(wire: bytes) -> list[list[bytes]]:
    """`wire` cut in two at every offset, and in three at a spread of offset pairs."""
    splits = [[wire[:a], wire[a:]] for a in range(1, len(wire))]
    splits += [
        [wire[:a], wire[a:b], wire[b:]]
        for a in range(1, len(wire), 7)
        for b in range(a + 1, len(wire), 5)
    ]
    return splits
