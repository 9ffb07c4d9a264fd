"""upstream_unreachable: what a proxy answers when it cannot reach the upstream.

nginx reads and parses the request head before it connects upstream
(`ngx_http_process_request_headers` runs before `ngx_http_upstream_connect`), so a client of
an nginx whose upstream is down gets, once its head is in:

- `502 Bad Gateway` (nginx's page, `Connection: close`) for a head nginx can parse;
- `400 Bad Request` for one it cannot, and `400 Request Header Or Cookie Too Large` for one
  that does not fit `large_client_header_buffers` (4 x 8k: 32 KiB in all, 8 KiB a line);
- nothing, only a close, when the head never completes: the client ended first, or
  `client_header_timeout` ran out (nginx logs 408 and closes).

The scenario's `proxy: {on_upstream_unreachable: reset}` answers with an RST at once
instead (a load balancer with no healthy target), and `close` with a bare FIN. Either way
the client's connection is closed after the answer (`connection_closed`).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import ClassVar, Literal

from faults._lib.checks import check_choice, check_positive
from faults._lib.ends import gateway_answer
from middlebox.core.fault import Fault, Seconds
from middlebox.core.http1 import Http1Framer
from middlebox.core.responses import error_response
from middlebox.core.stream import DOWN, UP, Chunk, Eof, Item, Reset

Answer = Literal["502", "reset", "close"]

# nginx's large_client_header_buffers default (4 x 8k).
NGINX_MAX_HEAD = 4 * 8 * 1024
NGINX_HEADER_LINE = 8 * 1024

TOO_LARGE_PAGE = (
    b"<html>\r\n<head><title>400 Request Header Or Cookie Too Large</title></head>\r\n"
    b"<body>\r\n<center><h1>400 Bad Request</h1></center>\r\n"
    b"<center>Request Header Or Cookie Too Large</center>\r\n"
    b"<hr><center>nginx</center>\r\n</body>\r\n</html>\r\n"
)


def head_complete(head: bytes) -> bool:
    """A blank line ends the head: CRLF CRLF, or bare LF LF as nginx also accepts."""
    return b"\n\r\n" in head or b"\n\n" in head


def too_large(head: bytes) -> bool:
    """Whether nginx's default buffers refuse the head: over 4 x 8k in all, or one line
    (a header field, or the request line) over 8k."""
    end = min((i for i in (head.find(b"\n\r\n"), head.find(b"\n\n")) if i >= 0), default=-1)
    section = head if end < 0 else head[:end]
    if len(section) >= NGINX_MAX_HEAD:
        return True
    return any(len(line) > NGINX_HEADER_LINE for line in section.split(b"\n"))


def malformed(head: bytes) -> bool:
    """Whether the request head cannot be parsed as HTTP/1.x (nginx answers 400)."""
    framer = Http1Framer("request")
    framer.feed(head)
    return framer.degraded is not None


@dataclass
class UpstreamUnreachable(Fault):
    """Answer the client as nginx does with its upstream down: read the head, then 502."""

    name: ClassVar[str] = "upstream_unreachable"

    answer: Answer = "502"
    # nginx's client_header_timeout, for a client whose head never completes (None: wait).
    header_timeout: Seconds | None = 60.0

    connection_closed: bool = field(init=False, repr=False, default=False)
    _head: bytes = field(init=False, repr=False, default=b"")
    _due: float | None = field(init=False, repr=False, default=None)

    def __post_init__(self) -> None:
        check_choice("answer", self.answer, Answer)
        if self.header_timeout is not None:
            check_positive("header_timeout", self.header_timeout)

    @property
    def finished(self) -> bool:
        return False  # it is the whole connection: there is nothing to step aside for

    def on_open(self, now: float) -> list[Item]:
        if self.answer == "reset":
            return self._close(now, "reset", [Reset(DOWN)])
        if self.answer == "close":
            return self._close(now, "close", [Eof(DOWN)])
        if self.header_timeout is not None:
            self._due = now + self.header_timeout
        return []

    def on_item(self, item: Item, now: float) -> list[Item]:
        if self.connection_closed or item.direction is not UP:
            return []  # nothing reaches an upstream that is not there
        if not isinstance(item, Chunk):
            return self._answer(now)  # the client ended: answer what is in, if anything
        self._head += item.data
        if head_complete(self._head) or len(self._head) >= NGINX_MAX_HEAD:
            return self._answer(now)
        return []

    def deadline(self) -> float | None:
        return self._due

    def on_deadline(self, now: float) -> list[Item]:
        return self._answer(now)

    def _answer(self, now: float) -> list[Item]:
        head = self._head
        if too_large(head):
            return self._close(now, "400", [Chunk(DOWN, error_response(400, TOO_LARGE_PAGE))])
        if head_complete(head):
            if malformed(head):
                return self._close(now, "400", [Chunk(DOWN, error_response(400))])
            # The gateway answer every end fault gives; its upstream end has nowhere to go.
            page = [item for item in gateway_answer("502") if item.direction is DOWN]
            return self._close(now, "502", page)
        if head and malformed(head):
            return self._close(now, "400", [Chunk(DOWN, error_response(400))])
        return self._close(now, "close", [])

    def _close(self, now: float, answer: str, items: list[Item]) -> list[Item]:
        self._due = None
        self.connection_closed = True
        self.report(now, "answered", answer=answer, head_bytes=len(self._head))
        if items and not isinstance(items[-1], Chunk):
            return items  # already ends with the FIN or the RST
        return [*items, Eof(DOWN)]
