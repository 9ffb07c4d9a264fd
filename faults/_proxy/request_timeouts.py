"""request_timeouts: nginx's client timeouts for every request of a kept-alive connection.

`client_header_timeout` alone (faults/_proxy/client_header_timeout.py) watches only the
first request head. nginx times every request of a connection, and what lies between:

- `client_header_timeout` (60 s): the first head from the accept; a later head from its
  first byte (`ngx_http_wait_request_handler` creates the request when bytes arrive). Late:
  nginx logs 408 and closes without an answer (`ngx_http_close_request`): a bare FIN.
- `keepalive_timeout` (75 s): after a response is complete, no byte of a next request for
  that long: nginx closes the idle connection silently (`ngx_http_set_keepalive`).
- `client_body_timeout` (60 s): "set only for a period between two successive read
  operations, not for the transmission of the whole request body" (nginx docs): no body
  byte for that long and nginx finalizes the request with 408, which it does send
  (`ngx_http_read_client_request_body_handler` -> `NGX_HTTP_REQUEST_TIME_OUT`): its
  "408 Request Time-out" page with `Connection: close`, then a close. So a drip of
  10 bytes every 0.5 s is served, in nginx and here.

When the path is framed (an HTTP-aware fault in it) the stage reads that one framing pass
(frame once: a `Reader` per direction, no framer of its own); otherwise it frames the
request stream itself (cheap: heads and body lengths) and, only when `keepalive_timeout` is
on, the response stream (to know when a response is complete). Pure, on the virtual clock:
time comes in as `now`.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import ClassVar

from faults._lib.checks import check_positive
from middlebox.core.fault import Fault, FaultContext, Seconds, StageEvent
from middlebox.core.framed import Reader
from middlebox.core.http1 import Http1Framer, Piece, PieceKind
from middlebox.core.responses import nginx_error_page
from middlebox.core.stream import DOWN, UP, Chunk, Eof, Item, Reset

# ngx_http_status_lines: nginx writes "Request Time-out" (RFC 9110: "Request Timeout").
REQUEST_TIMEOUT_REASON = "Request Time-out"


def request_timeout_answer() -> bytes:
    """nginx's 408 page as it sends it after a body timeout."""
    page = nginx_error_page(408).replace(b"408 Request Timeout", b"408 Request Time-out")
    return (
        f"HTTP/1.1 408 {REQUEST_TIMEOUT_REASON}\r\nServer: nginx\r\n"
        f"Content-Type: text/html\r\nContent-Length: {len(page)}\r\nConnection: close\r\n\r\n"
    ).encode("ascii") + page


@dataclass
class RequestTimeouts(Fault):
    """Per request: the head by `header_timeout`, no body gap over `body_timeout`, and
    no idle keep-alive over `keepalive_timeout` (each None: off)."""

    name: ClassVar[str] = "request_timeouts"
    stage_event: ClassVar[StageEvent | None] = StageEvent.REQUEST_TIMEOUT

    header_timeout: Seconds | None = 60.0
    keepalive_timeout: Seconds | None = 75.0
    body_timeout: Seconds | None = 60.0

    connection_closed: bool = field(init=False, repr=False, default=False)
    finished: bool = field(init=False, repr=False, default=False)
    _requests: Http1Framer = field(init=False, repr=False)
    _responses: Http1Framer = field(init=False, repr=False)
    # The path's framing pass, read at this place, when the path is framed.
    _request_reader: Reader | None = field(init=False, repr=False, default=None)
    _response_reader: Reader | None = field(init=False, repr=False, default=None)
    # What is being waited for and since when: "head", "body", "idle" or None.
    _waiting: str | None = field(init=False, repr=False, default=None)
    _due: float | None = field(init=False, repr=False, default=None)
    _requests_done: int = field(init=False, repr=False, default=0)
    _responses_done: int = field(init=False, repr=False, default=0)

    def __post_init__(self) -> None:
        for name in ("header_timeout", "keepalive_timeout", "body_timeout"):
            value = getattr(self, name)
            if value is not None:
                check_positive(name, value)
        self._requests = Http1Framer("request")
        self._responses = Http1Framer("response")

    def bind(self, context: FaultContext) -> None:
        super().bind(context)
        position = context.framing
        if position is not None and position.up.http is not None:
            self._requests = position.up.http  # its state: in_head, buffered, complete
            self._request_reader = position.up.reader()
            if self.keepalive_timeout is not None:
                self._response_reader = position.down.reader()

    def leave(self) -> None:
        for reader in (self._request_reader, self._response_reader):
            if reader is not None:
                reader.close()

    def _request_pieces(self, data: bytes) -> list[Piece]:
        if self._request_reader is None:
            return self._requests.feed(data)
        return [framed.piece for framed in self._request_reader.advance(len(data))]

    def _response_pieces(self, data: bytes) -> list[Piece]:
        if self._response_reader is None:
            return self._responses.feed(data)
        return [framed.piece for framed in self._response_reader.advance(len(data))]

    def on_open(self, now: float) -> list[Item]:
        self._arm("head", now, self.header_timeout)
        return []

    def _arm(self, waiting: str | None, now: float, timeout: Seconds | None) -> None:
        self._waiting = waiting if timeout is not None else None
        self._due = now + timeout if timeout is not None else None

    def on_item(self, item: Item, now: float) -> list[Item]:
        if self.connection_closed:
            return []  # nginx closed both sockets: nothing more goes anywhere
        if self.finished:
            return [item]
        if not isinstance(item, Chunk):
            if isinstance(item, Reset) or item.direction is UP:
                self._stop()  # the client left or a peer aborted: nothing left to time
            return [item]
        if item.direction is UP:
            self._client_bytes(item.data, now)
        elif self.keepalive_timeout is not None:
            self._server_bytes(item.data, now)
        return [item]

    def _client_bytes(self, data: bytes, now: float) -> None:
        if self._waiting == "idle":
            # the next request's first byte: its head is timed from here
            self._arm("head", now, self.header_timeout)
        for piece in self._request_pieces(data):
            if piece.kind is PieceKind.OPAQUE:
                self._stop()  # not HTTP (a tunnel, or garbage): the upstream judges it
                return
            if self._response_reader is None and piece.head is not None:
                # its own response framer needs the methods (the path's has them)
                self._responses.expect_response_to(piece.head.method or "GET")
            if piece.end_of_message:
                self._requests_done += 1
                self._arm(None, now, None)  # the response is proxy_read_timeout's business
            elif piece.kind is PieceKind.HEAD or self._waiting == "body":
                self._arm("body", now, self.body_timeout)  # re-armed by every body read
        if self._waiting is None and self._requests.in_head and self._requests.buffered:
            self._arm("head", now, self.header_timeout)  # a pipelined next head began

    def _server_bytes(self, data: bytes, now: float) -> None:
        for piece in self._response_pieces(data):
            if piece.kind is PieceKind.OPAQUE:
                self._stop()
                return
            if piece.end_of_message:
                self._responses_done += 1
        idle = self._responses_done >= self._requests_done and not self._requests.buffered
        if self._waiting is None and idle and self._requests.message_complete:
            self._arm("idle", now, self.keepalive_timeout)

    def _stop(self) -> None:
        self._waiting, self._due, self.finished = None, None, True
        self.leave()  # passes everything from now on: its readers would only hold pieces

    def deadline(self) -> float | None:
        return self._due

    def on_deadline(self, now: float) -> list[Item]:
        waiting, timeout = self._waiting, self._timeout()
        self._due, self._waiting = None, None
        self.connection_closed = True
        if waiting == "body":
            self.report(now, "answered", timer="client_body_timeout", status=408, timeout=timeout)
            return [Chunk(DOWN, request_timeout_answer()), Eof(DOWN), Eof(UP)]
        timer = "keepalive_timeout" if waiting == "idle" else "client_header_timeout"
        self.report(now, "closed", timer=timer, timeout=timeout)
        return [Eof(DOWN), Eof(UP)]  # nginx's close(): no answer, a FIN both ways

    def _timeout(self) -> Seconds | None:
        return {
            "head": self.header_timeout,
            "body": self.body_timeout,
            "idle": self.keepalive_timeout,
        }.get(self._waiting or "")
