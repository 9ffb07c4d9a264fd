"""HTTP/2 stream <-> one HTTP/1.1 exchange: the pure conversion under shell/h2_streams.py.

Each HTTP/2 stream a client opens is relayed as one HTTP/1.1 exchange on its own upstream
connection, through the same fault pipeline as any cleartext client, so the pipeline, the
journal and every fault see an HTTP/1.1 byte stream per HTTP/2 stream. This module is the
translation and nothing else (no I/O, no h2 library: header lists in, bytes out, and
bytes in, response events out), the way nginx's `ngx_http_v2` turns a stream into a
request that `proxy_pass` sends upstream as HTTP/1.x.

Request (`RequestEncoder`): the pseudo-headers become the request line and `Host`
(RFC 9113 §8.3.1: `:authority` wins over a `host` field), connection-specific fields are
dropped (RFC 9113 §8.2.2), and the body is framed by the client's `content-length` when it
sent one, otherwise chunked (RFC 9112 §7.1), since DATA frames carry no length up front.
`Connection: close` is added, as nginx's default `proxy_http_version 1.0` implies: the
upstream closes after its response, which ends the stream's relay.

Response (`ResponseDecoder`): the passive HTTP/1.1 framer (core/http1.py) labels the
upstream's bytes; the head becomes `:status` plus lower-cased fields without the
hop-by-hop ones (HTTP/2 forbids `connection`, `transfer-encoding` ...), body bytes become
DATA, the end of the message becomes END_STREAM. A response cut short (the upstream's FIN
before the message's end) or not HTTP/1.1 at all is `ResponseBroken`: the shell answers it
with RST_STREAM, so the client sees a reset, never a clean end on half an answer.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from middlebox.core.http1 import Http1Framer, Piece, PieceKind

# RFC 9113 §8.2.2: connection-specific fields an HTTP/2 message must not carry, and an
# intermediary must not forward from one (plus `host`, replaced by `:authority`).
CONNECTION_SPECIFIC = frozenset(
    {"connection", "keep-alive", "proxy-connection", "transfer-encoding", "upgrade", "te"}
)
# RFC 9113 §7 error codes the shell sends.
NO_ERROR = 0x0
PROTOCOL_ERROR = 0x1
INTERNAL_ERROR = 0x2
REFUSED_STREAM = 0x7
CANCEL = 0x8

HeaderList = Sequence[tuple[bytes | str, bytes | str]]


def _text(value: bytes | str) -> str:
    return value.decode("latin-1") if isinstance(value, bytes) else value


class RequestError(ValueError):
    """A request an HTTP/1.1 upstream cannot be sent (a missing pseudo-header, CONNECT)."""


@dataclass
class RequestEncoder:
    """One HTTP/2 stream's request as HTTP/1.1 bytes: `head`, then `data` per DATA frame,
    then `end` at END_STREAM."""

    method: str = "GET"
    chunked: bool = False

    def head(self, headers: HeaderList, *, end_stream: bool) -> bytes:
        """The request line and header section. `end_stream`: the HEADERS frame ended the
        stream, so there is no body."""
        pseudo: dict[str, str] = {}
        fields: list[tuple[str, str]] = []
        for raw_name, raw_value in headers:
            name, value = _text(raw_name).lower(), _text(raw_value)
            if name.startswith(":"):
                pseudo[name] = value
            elif name not in CONNECTION_SPECIFIC and not (
                name == "host" and ":authority" in pseudo
            ):
                fields.append((name, value))
        method = pseudo.get(":method")
        if method is None or method == "CONNECT":
            raise RequestError("only requests with :method, :path and :scheme (no CONNECT)")
        path = pseudo.get(":path", "/")
        self.method = method
        authority = pseudo.get(":authority")
        if authority is not None:
            fields = [(n, v) for n, v in fields if n != "host"]
            fields.insert(0, ("host", authority))
        has_length = any(n == "content-length" for n, _ in fields)
        self.chunked = not end_stream and not has_length
        if self.chunked:
            fields.append(("transfer-encoding", "chunked"))
        fields.append(("connection", "close"))
        lines = [f"{method} {path} HTTP/1.1", *(f"{n}: {v}" for n, v in fields)]
        return ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1")

    def data(self, payload: bytes) -> bytes:
        """One DATA frame's payload, chunk-framed when the body is chunked."""
        if not payload:
            return b""
        if self.chunked:
            return b"%x\r\n%s\r\n" % (len(payload), payload)
        return payload

    def end(self) -> bytes:
        """END_STREAM: the last chunk of a chunked body (a sized body ends by itself)."""
        return b"0\r\n\r\n" if self.chunked else b""


@dataclass(frozen=True)
class ResponseHead:
    """The final response head as an HTTP/2 header list (`:status` first)."""

    headers: tuple[tuple[str, str], ...]

    @property
    def status(self) -> int:
        return int(self.headers[0][1])


@dataclass(frozen=True)
class ResponseData:
    data: bytes


@dataclass(frozen=True)
class ResponseEnd:
    """The message ended: END_STREAM."""


@dataclass(frozen=True)
class ResponseBroken:
    """The upstream's response cannot end cleanly (cut short, not HTTP): RST_STREAM."""

    reason: str
    error_code: int = INTERNAL_ERROR


ResponseEvent = ResponseHead | ResponseData | ResponseEnd | ResponseBroken


def h2_headers(status: int, fields: Iterable[tuple[str, str]]) -> tuple[tuple[str, str], ...]:
    """`:status` and the fields an HTTP/2 response may carry (lower-case names, RFC 9113
    §8.2.1; none of the connection-specific ones, nor what the Connection field lists)."""
    listed = {
        token.strip().lower()
        for name, value in fields
        if name.lower() == "connection"
        for token in value.split(",")
    }
    kept = [
        (name.lower(), value)
        for name, value in fields
        if name.lower() not in CONNECTION_SPECIFIC and name.lower() not in listed
    ]
    return ((":status", str(status)), *kept)


@dataclass
class ResponseDecoder:
    """The upstream's HTTP/1.1 response bytes, for one request of `method`, as events."""

    method: str = "GET"

    def __post_init__(self) -> None:
        self.framer = Http1Framer("response")
        self.framer.expect_response_to(self.method)
        self.done = False

    def feed(self, data: bytes) -> list[ResponseEvent]:
        if self.done:
            return []  # bytes after the message (Connection: close was asked): dropped
        return self._events(self.framer.feed(data))

    def feed_eof(self) -> list[ResponseEvent]:
        """The upstream's FIN: a read-until-close body ends here; anything else unfinished
        is broken."""
        if self.done:
            return []
        events = self._events(self.framer.feed_eof())
        if not self.done:
            self.done = True
            events.append(ResponseBroken("the upstream closed before the response ended"))
        return events

    def _events(self, pieces: Iterable[Piece]) -> list[ResponseEvent]:
        events: list[ResponseEvent] = []
        for piece in pieces:
            if self.done:
                break
            if piece.kind is PieceKind.HEAD:
                head = piece.head
                if head is None or head.is_interim:
                    continue  # a 100 Continue concerns the HTTP/1.1 hop only
                events.append(ResponseHead(h2_headers(head.status or 502, head.headers)))
            elif piece.kind is PieceKind.BODY and piece.data:
                events.append(ResponseData(piece.data))
            elif piece.kind is PieceKind.OPAQUE:
                self.done = True
                reason = self.framer.degraded or "the upstream's response is not HTTP/1.1"
                events.append(ResponseBroken(reason, PROTOCOL_ERROR))
                break
            if piece.end_of_message:
                self.done = True
                events.append(ResponseEnd())
        return events
