"""h2_window: an HTTP/2 flow-control window that stops (or slows) opening: a slow reader at
the stream level.

HTTP/2 flow control (RFC 9113 §5.2) lets a receiver stop a stream without touching the
connection: it simply sends no WINDOW_UPDATE for that stream. A browser tab in the background,
a client whose consumer stopped reading one response, or a client-side proxy with a small
per-stream buffer do exactly that: the sender's window for that stream reaches zero and its
DATA waits, while the connection's other streams go on. Behind the proxy the stream's relay
stops reading and the backpressure reaches the upstream as TCP's window.

The fault plays that receiver: toward the client, the stream's window is treated as closed
once `after_bytes` of its DATA have been sent (the client's WINDOW_UPDATEs for it are
ignored), then reopens at `rate` bytes per second (a slow reader) or never (`rate` unset: a
stall).

- `stream: N` (the Nth stream of the connection) or `stream: null` for the connection window
  (every stream shares the budget);
- `after_bytes` (default 0), `rate` (bytes/s, optional).

HTTP/2 only (the session consults `send_credit`); on an HTTP/1.1 connection it passes
everything through.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import ClassVar

from faults._lib.checks import check_positive
from middlebox.core.fault import Bytes, Fault
from middlebox.core.h2_faults import H2Action, H2Fault


@dataclass
class H2Window(H2Fault, Fault):
    """After `after_bytes` of DATA on `stream` (or the connection), `rate` bytes/s or none."""

    name: ClassVar[str] = "h2_window"

    stream: int | None = 1
    after_bytes: Bytes = 0
    rate: float | None = None

    _opened: int = field(init=False, repr=False, default=0)
    _target: int | None = field(init=False, repr=False, default=None)
    _sent: int = field(init=False, repr=False, default=0)
    _stalled_at: float | None = field(init=False, repr=False, default=None)

    def __post_init__(self) -> None:
        if self.stream is not None and self.stream < 1:
            raise ValueError(
                f"stream must be at least 1 (or null for the connection), got {self.stream}"
            )
        check_positive("after_bytes", self.after_bytes, allow_zero=True)
        if self.rate is not None:
            check_positive("rate", self.rate)

    def on_stream_open(self, stream_id: int, now: float) -> list[H2Action]:
        self._opened += 1
        if self.stream is not None and self._opened == self.stream:
            self._target = stream_id
        return []

    def _applies(self, stream_id: int) -> bool:
        return self.stream is None or stream_id == self._target

    def on_stream_data(self, stream_id: int, data: bytes, now: float) -> list[H2Action]:
        if self._applies(stream_id):
            self._sent += len(data)
        return []

    def _allowed(self, now: float) -> float:
        if self._stalled_at is None or self.rate is None:
            return self.after_bytes
        return self.after_bytes + self.rate * (now - self._stalled_at)

    def send_credit(self, stream_id: int, now: float) -> int | None:
        if not self._applies(stream_id):
            return None
        credit = math.floor(self._allowed(now)) - self._sent
        if credit <= 0 and self._stalled_at is None:
            self._stalled_at = now
            self.report(now, "window_stalled", stream_id=stream_id, byte=self._sent)
            credit = math.floor(self._allowed(now)) - self._sent
        return max(credit, 0)

    def h2_deadline(self) -> float | None:
        """When a slowed window next has a byte of credit (the session then retries)."""
        if self._stalled_at is None or self.rate is None:
            return None
        missing = self._sent + 1 - self.after_bytes
        return self._stalled_at + missing / self.rate
