"""goaway: an HTTP/2 connection drained by GOAWAY, as a deploy or a reload does it.

nginx answers `nginx -s reload` (and a worker's graceful shutdown) by sending each HTTP/2
connection a GOAWAY with NO_ERROR and the last stream id it will serve; streams in flight
finish, a stream the client opens after it is refused (REFUSED_STREAM: never processed, safe
to retry on a new connection, RFC 9113 §8.7), and the connection closes once its last stream
has ended. What is still open after `worker_shutdown_timeout` is closed: a cut mid-answer.

- `after_streams: N`: the GOAWAY goes out as the Nth stream of the connection opens, naming it
  the last one served (stream N streams, N+1 onward are refused);
- `at: S`: the GOAWAY goes out S seconds after the connection opened, naming the highest
  stream opened so far;
- `grace: S` (optional): streams still open S seconds after the GOAWAY are cut: the
  connection is closed without close_notify, a bare TCP FIN, as nginx's
  `worker_shutdown_timeout` does (measured); without it they finish;
- `error_code` (default NO_ERROR; ENHANCE_YOUR_CALM or INTERNAL_ERROR for a server that
  gives up on the connection).

HTTP/2 only (the session executes it, shell/h2_streams.py); on an HTTP/1.1 connection it
passes everything through.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import ClassVar, Literal

from faults._lib.checks import check_choice, check_positive
from middlebox.core.fault import Fault, Seconds
from middlebox.core.h2_faults import (
    H2_ERROR_CODES,
    DropConnection,
    H2Action,
    H2Fault,
    SendGoaway,
)

ErrorCode = Literal[
    "NO_ERROR", "PROTOCOL_ERROR", "INTERNAL_ERROR", "ENHANCE_YOUR_CALM", "REFUSED_STREAM"
]


@dataclass
class Goaway(H2Fault, Fault):
    """GOAWAY after `after_streams` streams or at `at` seconds; cut what is left after `grace`."""

    name: ClassVar[str] = "goaway"

    after_streams: int | None = None
    at: Seconds | None = None
    grace: Seconds | None = None
    error_code: ErrorCode = "NO_ERROR"

    _opened_at: float | None = field(init=False, repr=False, default=None)
    _streams: int = field(init=False, repr=False, default=0)
    _highest: int = field(init=False, repr=False, default=0)
    _open: set[int] = field(init=False, repr=False, default_factory=set)
    _sent_at: float | None = field(init=False, repr=False, default=None)
    _cut: bool = field(init=False, repr=False, default=False)

    def __post_init__(self) -> None:
        if (self.after_streams is None) == (self.at is None):
            raise ValueError("goaway needs exactly one of after_streams or at")
        if self.after_streams is not None and self.after_streams < 1:
            raise ValueError(f"after_streams must be at least 1, got {self.after_streams}")
        if self.at is not None:
            check_positive("at", self.at, allow_zero=True)
        if self.grace is not None:
            check_positive("grace", self.grace, allow_zero=True)
        check_choice("error_code", self.error_code, ErrorCode)

    def on_connection_open(self, now: float) -> list[H2Action]:
        self._opened_at = now
        return []

    def on_stream_open(self, stream_id: int, now: float) -> list[H2Action]:
        if self._sent_at is not None:
            return []  # the session refuses it: it is past the GOAWAY's last stream id
        self._streams += 1
        self._highest = max(self._highest, stream_id)
        self._open.add(stream_id)
        if self.after_streams is not None and self._streams == self.after_streams:
            return self._send(now)
        return []

    def on_stream_close(self, stream_id: int, now: float) -> list[H2Action]:
        self._open.discard(stream_id)
        return []

    def h2_deadline(self) -> float | None:
        if self._sent_at is None:
            if self.at is None or self._opened_at is None:
                return None
            return self._opened_at + self.at
        if self.grace is not None and not self._cut and self._open:
            return self._sent_at + self.grace
        return None

    def on_h2_deadline(self, now: float) -> list[H2Action]:
        due = self.h2_deadline()
        if due is None or now < due:
            return []
        if self._sent_at is None:
            return self._send(now)
        self._cut = True
        self.report(now, "cut_after_grace", streams=sorted(self._open))
        # nginx 1.22 at worker_shutdown_timeout closes the socket without close_notify or
        # RST_STREAM: the client reads a TCP FIN mid-stream (a ragged EOF; measured, see
        # docs/tls-http2.md "Reference: nginx ssl http2").
        return [DropConnection("fin")]

    def _send(self, now: float) -> list[H2Action]:
        self._sent_at = now
        self.report(now, "goaway", last_stream_id=self._highest, error_code=self.error_code)
        return [SendGoaway(self._highest, H2_ERROR_CODES[self.error_code])]
