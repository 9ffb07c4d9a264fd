"""slow_reader: one side reads the response slowly, and the server feels it.

Imitates a phone on a weak signal or a backgrounded app (`side: client`: the client
drains its socket at `rate` bytes/s) or a proxy that stops reading its upstream for a
while (`side: upstream`: a busy worker, a full disk buffer, a GC pause). Either way
the server's writes stop completing: the receive window closes (RFC 9293 §3.8.6), its
send buffer fills and `write()` blocks, which is how vLLM/uvicorn notice a slow
consumer (or never do, and keep generating into memory).

To make that backpressure reach the server quickly, as with a real small-buffered
reader, the fault asks for small socket buffers (`buffer` bytes: the proxy's
SO_SNDBUF toward the client or its SO_RCVBUF from the upstream; Linux doubles the
value set, socket(7)) and keeps at most `max_backlog` bytes of its own before it
stops reading the upstream (`reading_paused`). A buffer this small is felt beyond the
pause too: once the window has closed, the sender probes it on its persist timer
(RFC 9293 §3.8.6.1) and, on loopback whose MSS (about 64 KiB) exceeds the buffer, the
receiver's silly-window avoidance (RFC 1122 §4.2.3.3) delays window updates, so
measured on Linux a 50 kB response after a 0.5 s pause took 1.7 s with 4 KiB, 0.9 s
with 16 KiB and 0.5 s with 64 KiB. That is the real kernel's behaviour, not a model.

From `start`, the reader takes nothing for `pause` seconds, then reads at `rate`
bytes/s (0: at full speed) in reads of `segment` bytes, until `stop`. Only the
downstream (response) bytes are slowed; the request passes untouched.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import ClassVar, Literal

from faults._lib.checks import check_choice, check_positive
from faults._lib.timing import Queued, Serializer
from middlebox.core.fault import Bytes, Fault, Seconds
from middlebox.core.stream import DOWN, Direction, Item

Side = Literal["client", "upstream"]
PauseState = Literal["pending", "pausing", "over"]


@dataclass
class SlowReader(Queued, Fault):
    """Read the response slowly on one `side`: pause, then `rate` bytes/s, small buffers."""

    name: ClassVar[str] = "slow_reader"

    side: Side = "client"
    rate: Bytes = 1024
    pause: Seconds = 0.0
    segment: Bytes = 256
    buffer: Bytes = 4096
    max_backlog: Bytes = 16 * 1024

    _serializer: Serializer = field(init=False, repr=False, default_factory=Serializer)
    _pause_from: float = field(init=False, repr=False, default=0.0)
    _pause_until: float = field(init=False, repr=False, default=0.0)
    _pause_state: PauseState = field(init=False, repr=False, default="over")

    def __post_init__(self) -> None:
        super().__post_init__()
        check_choice("side", self.side, Side)
        check_positive("rate (bytes per second)", self.rate, allow_zero=True)
        check_positive("pause", self.pause, allow_zero=True)
        check_positive("segment", self.segment)
        check_positive("buffer", self.buffer)

    def on_open(self, now: float) -> list[Item]:
        super().on_open(now)
        self._pause_from = now + self.start
        self._pause_until = self._pause_from + self.pause
        self._pause_state = "pending" if self.pause > 0 else "over"
        self.report(now, "slow_reader", side=self.side, rate=self.rate, pause=self.pause)
        return []

    def on_item(self, item: Item, now: float) -> list[Item]:
        self._advance(now)
        if item.direction is not DOWN or not self.in_window(now):
            return self.send(item, now, now)
        begin = max(now, self._pause_until)
        out: list[Item] = []
        for piece, finish in self._serializer.schedule(item, begin, self.rate, self.segment):
            out.extend(self.send(piece, finish, now))
        return out

    def deadline(self) -> float | None:
        due = [super().deadline()]
        if self._pause_state == "pending":
            due.append(self._pause_from)
        elif self._pause_state == "pausing":
            due.append(self._pause_until)
        times = [t for t in due if t is not None]
        return min(times) if times else None

    def on_deadline(self, now: float) -> list[Item]:
        self._advance(now)
        return super().on_deadline(now)

    def reading_paused(self, source: Direction) -> bool:
        stopped = self.side == "upstream" and self._pause_state == "pausing"
        return (source is DOWN and stopped) or super().reading_paused(source)

    def socket_buffers(self) -> dict[str, int]:
        key = "client_sndbuf" if self.side == "client" else "upstream_rcvbuf"
        return {key: self.buffer}

    def _advance(self, now: float) -> None:
        """Move through the pause at its edges, reporting each, so `reading_paused` is right."""
        if self._pause_state == "pending" and now >= self._pause_from:
            self._pause_state = "pausing"
            self.report(self._pause_from, "pause", side=self.side, until=self._pause_until)
        if self._pause_state == "pausing" and now >= self._pause_until:
            self._pause_state = "over"
            self.report(self._pause_until, "pause_over", side=self.side)
