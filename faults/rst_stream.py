"""rst_stream: one HTTP/2 stream cancelled mid-answer with a chosen error code, or the whole
connection dropped so every multiplexed stream dies at once.

A proxy or load balancer cancels a single stream with RST_STREAM (RFC 9113 §6.4) when its own
upstream leg fails (INTERNAL_ERROR), when a limit is hit (ENHANCE_YOUR_CALM, nginx's
`http2_max_requests`-style limits) or when it gives up on the stream (CANCEL); the other
streams of the connection go on. The client sees that one request fail, mid-answer.

`scope: connection` instead drops the TCP connection (an RST, as a crashed or killed proxy
process or a NAT that forgot the flow): under HTTP/2 one dropped connection kills every stream
multiplexed on it at once, where six HTTP/1.1 connections would lose one answer.

- `stream: N`: the Nth stream opened on the connection (1 = the first);
- one trigger: `after_bytes` (response body bytes of that stream sent to the client; the reset
  follows the DATA frame that reaches it), `after_events` (SSE events of that stream's body)
  or `at` (seconds after that stream opened);
- `error_code` (default CANCEL); `scope: stream | connection`.

HTTP/2 only (the session executes it); on an HTTP/1.1 connection it passes everything through.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import ClassVar, Literal

from faults._lib.checks import check_choice, check_positive
from middlebox.core.fault import Bytes, Fault, Seconds
from middlebox.core.h2_faults import (
    H2_ERROR_CODES,
    DropConnection,
    H2Action,
    H2Fault,
    ResetStream,
)
from middlebox.core.sse import SseFramer

ErrorCode = Literal[
    "NO_ERROR",
    "PROTOCOL_ERROR",
    "INTERNAL_ERROR",
    "FLOW_CONTROL_ERROR",
    "STREAM_CLOSED",
    "REFUSED_STREAM",
    "CANCEL",
    "ENHANCE_YOUR_CALM",
]
Scope = Literal["stream", "connection"]


@dataclass
class RstStream(H2Fault, Fault):
    """Reset the `stream`th stream (or the connection) after bytes, events or time."""

    name: ClassVar[str] = "rst_stream"

    stream: int = 1
    after_bytes: Bytes | None = None
    after_events: int | None = None
    at: Seconds | None = None
    error_code: ErrorCode = "CANCEL"
    scope: Scope = "stream"

    _opened: int = field(init=False, repr=False, default=0)
    _target: int | None = field(init=False, repr=False, default=None)
    _target_opened_at: float = field(init=False, repr=False, default=0.0)
    _bytes: int = field(init=False, repr=False, default=0)
    _events: SseFramer = field(init=False, repr=False, default_factory=SseFramer)
    _done: bool = field(init=False, repr=False, default=False)

    def __post_init__(self) -> None:
        triggers = [self.after_bytes, self.after_events, self.at]
        if sum(t is not None for t in triggers) != 1:
            raise ValueError("rst_stream needs exactly one of after_bytes, after_events or at")
        if self.stream < 1:
            raise ValueError(f"stream must be at least 1 (the first stream), got {self.stream}")
        for name in ("after_bytes", "after_events", "at"):
            value = getattr(self, name)
            if value is not None:
                check_positive(name, value, allow_zero=True)
        check_choice("error_code", self.error_code, ErrorCode)
        check_choice("scope", self.scope, Scope)

    def on_stream_open(self, stream_id: int, now: float) -> list[H2Action]:
        self._opened += 1
        if self._opened == self.stream:
            self._target = stream_id
            self._target_opened_at = now
        return []

    def on_stream_data(self, stream_id: int, data: bytes, now: float) -> list[H2Action]:
        if stream_id != self._target or self._done:
            return []
        self._bytes += len(data)
        self._events.feed(data)
        if self.after_bytes is not None and self._bytes >= self.after_bytes:
            return self._fire(now)
        if self.after_events is not None and self._events.events >= self.after_events:
            return self._fire(now)
        return []

    def on_stream_close(self, stream_id: int, now: float) -> list[H2Action]:
        if stream_id == self._target and not self._done:
            self._done = True  # it ended before the trigger: nothing to cancel
        return []

    def h2_deadline(self) -> float | None:
        if self.at is None or self._target is None or self._done:
            return None
        return self._target_opened_at + self.at

    def on_h2_deadline(self, now: float) -> list[H2Action]:
        due = self.h2_deadline()
        if due is None or now < due:
            return []
        return self._fire(now)

    def _fire(self, now: float) -> list[H2Action]:
        self._done = True
        assert self._target is not None
        details = {"stream_id": self._target, "byte": self._bytes, "event": self._events.events}
        if self.scope == "connection":
            self.report(now, "dropped_connection", **details)
            return [DropConnection("rst")]
        self.report(now, "reset_stream", error_code=self.error_code, **details)
        return [ResetStream(self._target, H2_ERROR_CODES[self.error_code])]
