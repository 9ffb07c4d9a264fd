"""Byte builders and strategies for the HTTP/SSE fault tests.

A vLLM stream on the wire is a request, a `200` head with `Transfer-Encoding: chunked`
and one HTTP chunk per `data: <json>\\n\\n` frame, then `data: [DONE]` and the terminal
chunk (shared/reference/vllm-wire.md §1, §5). These builders produce exactly that, so
tests can state expected bytes and offsets literally.
"""

from __future__ import annotations

import itertools
import json

from hypothesis import strategies as st

from faults.testing import TimedItem
from middlebox.core.http1 import LAST_CHUNK_BYTES, encode_chunk
from middlebox.core.stream import DOWN, UP, Chunk

SSE_HEAD = (
    b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream; charset=utf-8\r\n"
    b"transfer-encoding: chunked\r\n\r\n"
)


def request(
    path: str = "/v1/chat/completions", extra: bytes = b"Accept-Encoding: gzip, deflate\r\n"
) -> bytes:
    """A streaming chat request as httpx sends it (it accepts gzip by default)."""
    body = b'{"model":"m","stream":true}'
    return (
        f"POST {path} HTTP/1.1\r\nHost: up\r\n".encode()
        + extra
        + b"Content-Type: application/json\r\nContent-Length: %d\r\n\r\n" % len(body)
        + body
    )


REQUEST = request()


def frame(content: str) -> bytes:
    """One chat content chunk as vLLM frames it (compact JSON, raw UTF-8)."""
    payload = {"choices": [{"index": 0, "delta": {"content": content}}]}
    return b"data: " + json.dumps(payload, separators=(",", ":"), ensure_ascii=False).encode()


def event(content: str) -> bytes:
    return frame(content) + b"\n\n"


ROLE = b'data: {"choices":[{"index":0,"delta":{"role":"assistant","content":""}}]}\n\n'
DONE = b"data: [DONE]\n\n"


def chunked(*events: bytes) -> list[bytes]:
    """Each SSE event as one HTTP chunk (one vLLM `yield` = one chunk)."""
    return [encode_chunk(e) for e in events]


def sse_response(*contents: str, role: bool = False, done: bool = True) -> list[bytes]:
    """Head, then one chunk per token, `[DONE]`, and the terminal chunk, as wire writes."""
    events = ([ROLE] if role else []) + [event(c) for c in contents] + ([DONE] if done else [])
    return [SSE_HEAD, *chunked(*events), *([LAST_CHUNK_BYTES] if done else [])]


def timeline(
    writes: list[bytes], *, start: float = 0.0, step: float = 1.0, request_bytes: bytes = REQUEST
) -> list[TimedItem]:
    """The request at `start`, then the response writes `step` seconds apart."""
    out: list[TimedItem] = [(start, Chunk(UP, request_bytes))]
    out += [(start + step * (i + 1), Chunk(DOWN, w)) for i, w in enumerate(writes)]
    return out


def down_bytes(output: list[TimedItem]) -> bytes:
    return b"".join(i.data for _, i in output if isinstance(i, Chunk) and i.direction is DOWN)


def ends(output: list[TimedItem]) -> list[tuple[float, object]]:
    """The ends in the output, with their times."""
    return [(t, i) for t, i in output if not isinstance(i, Chunk)]


# Content with multi-byte UTF-8 (2, 3 and 4 bytes) so cuts inside sequences are exercised.
contents = st.lists(
    st.text(alphabet=st.sampled_from(["a", " ", "é", "€", "😀", "x"]), min_size=1, max_size=4),
    min_size=1,
    max_size=8,
)


@st.composite
def resliced(draw: st.DrawFn, data: bytes, max_cuts: int = 6) -> list[bytes]:
    """`data` split at arbitrary offsets, as TCP may deliver it."""
    cuts = sorted(set(draw(st.lists(st.integers(1, max(1, len(data) - 1)), max_size=max_cuts))))
    bounds = [0, *[c for c in cuts if 0 < c < len(data)], len(data)]
    return [data[a:b] for a, b in itertools.pairwise(bounds) if b > a]


__all__ = [
    "DONE",
    "REQUEST",
    "ROLE",
    "SSE_HEAD",
    "chunked",
    "contents",
    "down_bytes",
    "ends",
    "event",
    "frame",
    "request",
    "resliced",
    "sse_response",
    "timeline",
]
