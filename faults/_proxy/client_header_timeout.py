"""client_header_timeout: nginx closes a client whose first request head is late.

nginx's `client_header_timeout` (default 60 s) "defines a timeout for reading client request
header. If a client does not transmit the entire header within this time, the request is
terminated with the 408 (Request Time-out) error": nginx logs the 408 but sends nothing
(`ngx_http_read_request_header` → `ngx_http_close_request`), so the client sees a bare close.
The timer runs from the moment the connection is accepted and is not re-armed by a drip of
header bytes, which is what bounds a slowloris client. Only the connection's first head is
watched: an idle keep-alive connection is `keepalive_timeout`'s business, not this one's.

A head ends at a blank line, CRLF CRLF or bare LF LF (nginx accepts both). Once it has, the
stage is `finished` and steps out of the way.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import ClassVar

from faults._lib.checks import check_positive
from middlebox.core.fault import Fault, Seconds, StageEvent
from middlebox.core.stream import DOWN, UP, Chunk, Eof, Item, Reset


@dataclass
class ClientHeaderTimeout(Fault):
    """Close the connection, unanswered, if the first request head is not in by `timeout`."""

    name: ClassVar[str] = "client_header_timeout"
    stage_event: ClassVar[StageEvent | None] = StageEvent.HEADER_TIMEOUT

    timeout: Seconds = 60.0

    connection_closed: bool = field(init=False, repr=False, default=False)
    client_bytes: int = field(init=False, repr=False, default=0)
    _due: float | None = field(init=False, repr=False, default=None)
    _head_over: bool = field(init=False, repr=False, default=False)
    _tail: bytes = field(init=False, repr=False, default=b"")

    def __post_init__(self) -> None:
        check_positive("timeout", self.timeout)

    @property
    def finished(self) -> bool:
        return self._head_over

    def on_open(self, now: float) -> list[Item]:
        self._due = now + self.timeout
        return []

    def on_item(self, item: Item, now: float) -> list[Item]:
        if self.connection_closed:
            return []  # nginx closed both sockets: nothing more goes anywhere
        if self._due is not None and isinstance(item, Reset):
            # Either peer aborted: the connection is over, there is nothing left to time.
            self._due, self._head_over = None, True
        elif self._due is not None and item.direction is UP:
            if isinstance(item, Chunk):
                self.client_bytes += len(item.data)
                window = self._tail + item.data
                if b"\n\r\n" in window or b"\n\n" in window:
                    self._due, self._head_over = None, True
                self._tail = window[-2:]
            else:
                # The client ended first; its end passes on as it is.
                self._due, self._head_over = None, True
        return [item]

    def deadline(self) -> float | None:
        return self._due

    def on_deadline(self, now: float) -> list[Item]:
        self._due = None
        self.connection_closed = True
        self.report(now, "closed", byte=self.client_bytes, timeout=self.timeout)
        # nginx's close(): a FIN to the client (no 408 is sent) and to the upstream.
        return [Eof(DOWN), Eof(UP)]
