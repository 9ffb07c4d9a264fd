"""The measuring client: one streamed completion over a raw socket, every read timed.

A raw socket, not an HTTP library, because what is measured is exactly what the
proxy wrote and when: each `recv` is timed on the monotonic clock, and the response is
decoded afterwards (h11 for the framing, zlib for `Content-Encoding: gzip`) to say when
the first SSE event became readable, how many token events arrived and how the stream
ended. The request asks for gzip, as browsers and httpx do, so a compressing hop
compresses. Every wait is bounded by `limit` seconds.
"""

from __future__ import annotations

import errno
import json
import socket
import struct
import time
import zlib
from dataclasses import dataclass, field

import h11

READ_SIZE = 65536
LINGER_RESET = struct.pack("ii", 1, 0)  # SO_LINGER on, 0 s: close() sends an RST


@dataclass
class Reads:
    """What a client saw: each read's time (seconds from the request) and size."""

    sent_at: float  # time.time() when the request was written, for the upstream ledger
    times: list[float] = field(default_factory=list)
    sizes: list[int] = field(default_factory=list)
    data: bytearray = field(default_factory=bytearray)
    end: str = "timeout"  # complete, eof, reset, timeout, abandoned
    ended_at: float | None = None  # seconds from the request
    closed_wall: float | None = None  # time.time() when an abandoning client closed


@dataclass
class Decoded:
    """The response as a client library would read it from `Reads`."""

    status: int | None
    first_event_at: float | None  # seconds when the first complete SSE event was readable
    events: int  # complete `data:` events
    tokens: int  # events carrying a completion chunk (not [DONE])
    done: bool  # `data: [DONE]` arrived
    message_complete: bool  # the HTTP framing ended properly (terminal chunk or length)
    gzip: bool
    text: str = ""
    # The tokens the upstream said it had generated, in the last whole event that carried
    # a choice (vLLM's `continuous_usage_stats`): an event count undercounts when the
    # upstream merged late tokens into one frame; None when no event carried usage.
    usage_tokens: int | None = None


def request_bytes(
    port: int, max_tokens: int, prompt: str = "calibrate", usage: bool = False
) -> bytes:
    """`usage`: ask for vLLM's per-chunk usage (`continuous_usage_stats`), so the client
    can count tokens even where the upstream merged several into one frame."""
    fields: dict[str, object] = {
        "model": "middlebox/emulated-7b",
        "prompt": prompt,
        "max_tokens": max_tokens,
        "stream": True,
    }
    if usage:
        fields["stream_options"] = {"include_usage": True, "continuous_usage_stats": True}
    body = json.dumps(fields).encode()
    head = (
        "POST /v1/completions HTTP/1.1\r\n"
        f"Host: 127.0.0.1:{port}\r\n"
        "Content-Type: application/json\r\n"
        "Accept: text/event-stream\r\n"
        "Accept-Encoding: gzip, deflate\r\n"
        f"Content-Length: {len(body)}\r\n"
        "\r\n"
    )
    return head.encode() + body


def stream(
    port: int,
    max_tokens: int,
    *,
    limit: float,
    abandon_after: int | None = None,
    abandon_by: str = "fin",
    prompt: str = "calibrate",
    usage: bool = False,
) -> Reads:
    """Send one streamed completion to 127.0.0.1:`port` and time every read.

    With `abandon_after`, the client closes once that many token events are readable:
    by default after draining what its kernel already holds, so the close is a FIN (the
    harder case for a proxy: only its next write draws the RST, RFC 9293 §3.10.7.1);
    with `abandon_by="rst"` at once with SO_LINGER 0, an RST (a killed process, a
    browser tab closed with data unread)."""
    sock = socket.create_connection(("127.0.0.1", port), timeout=limit)
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    start = time.monotonic()
    reads = Reads(sent_at=time.time())
    deadline = start + limit
    try:
        sock.sendall(request_bytes(port, max_tokens, prompt, usage))
        while True:
            left = deadline - time.monotonic()
            if left <= 0:
                break
            sock.settimeout(left)
            try:
                data = sock.recv(READ_SIZE)
            except TimeoutError:
                break
            except ConnectionResetError:
                reads.end = "reset"
                reads.ended_at = time.monotonic() - start
                break
            now = time.monotonic() - start
            if not data:
                reads.end, reads.ended_at = "eof", now
                break
            reads.times.append(now)
            reads.sizes.append(len(data))
            reads.data += data
            seen = decode(reads)
            if abandon_after is not None and seen.tokens >= abandon_after:
                if abandon_by == "rst":
                    sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, LINGER_RESET)
                else:
                    _drain(sock)
                reads.closed_wall = time.time()
                reads.end, reads.ended_at = "abandoned", time.monotonic() - start
                break
            if seen.message_complete:
                # A keep-alive connection stays open after the message; the stream is over.
                reads.end, reads.ended_at = "complete", now
                break
    finally:
        sock.close()
    return reads


def _drain(sock: socket.socket) -> None:
    """Read what already arrived, so close() sends a FIN and not an RST (RFC 2525 §2.17)."""
    sock.setblocking(False)
    for _ in range(1000):
        try:
            if not sock.recv(READ_SIZE):
                return
        except OSError as error:
            if error.errno in (errno.EAGAIN, errno.EWOULDBLOCK):
                return
            raise


def decode(reads: Reads) -> Decoded:
    """Decode the response read by read, noting when the first SSE event was whole."""
    conn = h11.Connection(h11.CLIENT)
    conn.send(
        h11.Request(method="POST", target="/", headers=[("Host", "x"), ("Content-Length", "0")])
    )
    conn.send(h11.EndOfMessage())
    status: int | None = None
    inflater: zlib._Decompress | None = None
    gzip = False
    text = bytearray()
    first_event_at: float | None = None
    complete = False
    broken = False
    offset = 0
    for when, size in zip(reads.times, reads.sizes, strict=True):
        conn.receive_data(bytes(reads.data[offset : offset + size]))
        offset += size
        while not broken:
            try:
                event = conn.next_event()
            except h11.RemoteProtocolError:
                broken = True
                break
            if event is h11.NEED_DATA or event is h11.PAUSED:
                break
            if isinstance(event, h11.Response):
                status = event.status_code
                encoding = dict(event.headers).get(b"content-encoding", b"")
                if encoding.strip().lower() == b"gzip":
                    gzip = True
                    inflater = zlib.decompressobj(16 + zlib.MAX_WBITS)
            elif isinstance(event, h11.Data):
                data = bytes(event.data)
                text += inflater.decompress(data) if inflater is not None else data
            elif isinstance(event, h11.EndOfMessage):
                complete = True
                break
        if first_event_at is None and b"\n\n" in text:
            first_event_at = when
    if reads.end == "eof" and not complete and not broken:
        conn.receive_data(b"")  # a close-delimited body ends here; a chunked one is cut
        try:
            while (event := conn.next_event()) not in (h11.NEED_DATA, h11.PAUSED):
                if isinstance(event, h11.EndOfMessage):
                    complete = True
                    break
                if isinstance(event, h11.ConnectionClosed):
                    break
        except h11.RemoteProtocolError:
            pass
    events = [e for e in bytes(text).split(b"\n\n") if e.startswith(b"data:")]
    done = any(e.strip() == b"data: [DONE]" for e in events)
    tokens = sum(1 for e in events if e.strip() != b"data: [DONE]")
    if text and not text.endswith(b"\n\n"):
        events = events[:-1]  # an event is only dispatched at its blank line
        tokens = sum(1 for e in events if e.strip() != b"data: [DONE]")
    return Decoded(
        usage_tokens=_usage_tokens(events),
        status=status,
        first_event_at=first_event_at,
        events=len(events),
        tokens=tokens,
        done=done,
        message_complete=complete,
        gzip=gzip,
        text=bytes(text).decode("utf-8", "replace"),
    )


def _usage_tokens(events: list[bytes]) -> int | None:
    """The largest `usage.completion_tokens` of the whole events that carry a choice."""
    counts = []
    for event in events:
        try:
            chunk = json.loads(event.partition(b"data:")[2])
        except ValueError:
            continue
        usage = chunk.get("usage") if isinstance(chunk, dict) else None
        if chunk.get("choices") and isinstance(usage, dict):
            counts.append(int(usage.get("completion_tokens") or 0))
    return max(counts) if counts else None
