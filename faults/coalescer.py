"""coalescer: merge small writes that arrive within a window into one.

Imitates the hops that turn a token-per-write stream into bursts: Nagle's algorithm
(RFC 896; RFC 1122 §4.2.3.4) holds a small segment while earlier data is unacknowledged,
and with the peer's delayed ACK (RFC 1122 §4.2.3.2 allows up to 500 ms; Linux's
minimum is 40 ms, TCP_DELACK_MIN) writes within that window leave as one segment, at
most an MSS; load balancers and API gateways that read whatever has arrived and
forward it in one write do the same. Here the buffer is flushed when `window` seconds
have passed since its first byte, as soon as it holds `size` bytes (whole `size`
pieces leave, as Nagle sends full segments at once), or when the stream ends (the
end follows the flushed bytes). The other direction passes untouched.

`segment: auto` takes `size` from the link instead: the path MSS the proxy has toward
the client (TCP_MAXSEG, which the shell reads from the accepted socket: 65,483 on
loopback, 1,448 on Ethernet), as the kernel's cork does for HAProxy's MSG_MORE; `size`
is the fallback when the shell knows none (a replay in a test).

As the kernel's cork (MSG_MORE or TCP_CORK with TCP_NODELAY), `window` is one RTO: a
partial segment held with nothing in flight leaves when the probe timer fires
(tcp_check_probe_timer: max(RTO, TCP_RTO_MIN) from the write that left it queued), so it
counts from the first held byte, and the first byte after a release (or after a pause)
starts the next. haproxy-default sets 204 ms, loopback's RTO at HZ=250.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import ClassVar, Literal

from faults._lib.checks import check_choice, check_positive
from faults._lib.timing import MSS, DirectionChoice, Shaped
from middlebox.core.fault import Bytes, Fault, Seconds
from middlebox.core.stream import Chunk, Direction, Item

Segment = Literal["size", "auto"]


@dataclass
class Coalescer(Shaped, Fault):
    """Hold writes for up to `window` seconds or until `size` bytes, then send them as one."""

    name: ClassVar[str] = "coalescer"

    direction: DirectionChoice = "downstream"
    window: Seconds = 0.04
    size: Bytes = MSS
    segment: Segment = "size"

    _held: dict[Direction, bytearray] = field(init=False, repr=False, default_factory=dict)
    _writes: dict[Direction, int] = field(init=False, repr=False, default_factory=dict)
    _since: dict[Direction, float] = field(init=False, repr=False, default_factory=dict)

    def __post_init__(self) -> None:
        super().__post_init__()
        check_positive("window", self.window)
        check_positive("size", self.size)
        check_choice("segment", self.segment, Segment)

    def reads_client_mss(self) -> bool:
        return self.segment == "auto"

    @property
    def _segment(self) -> int:
        """The bytes that make a full segment: `size`, or the link's MSS (`auto`)."""
        mss = self.context.client_mss if self.segment == "auto" else None
        return mss or self.size

    def on_item(self, item: Item, now: float) -> list[Item]:
        self.count(item)
        direction = item.direction
        if not isinstance(item, Chunk) or not self.active(direction, now):
            reason = "inactive" if isinstance(item, Chunk) else "end"
            return [*self._flush(direction, now, reason), item]
        held = self._held.setdefault(direction, bytearray())
        if not held:
            self._since[direction] = now
        held += item.data
        self._writes[direction] = self._writes.get(direction, 0) + 1
        out: list[Item] = []
        segment = self._segment
        while len(held) >= segment:
            out.append(self._emit(direction, segment, now, "size"))
            self._since[direction] = now
        return out

    def deadline(self) -> float | None:
        due = [self._since[d] + self.window for d, held in self._held.items() if held]
        return min(due) if due else None

    def on_deadline(self, now: float) -> list[Item]:
        out: list[Item] = []
        for direction, held in self._held.items():
            if held and self._since[direction] + self.window <= now:
                out.extend(self._flush(direction, now, "window"))
        return out

    def _flush(self, direction: Direction, now: float, reason: str) -> list[Item]:
        held = self._held.get(direction)
        return [self._emit(direction, len(held), now, reason)] if held else []

    def _emit(self, direction: Direction, size: int, now: float, reason: str) -> Chunk:
        held = self._held[direction]
        data = bytes(held[:size])
        del held[:size]
        self.report(
            now,
            "flush",
            direction=direction.value,
            offset=self.offset(direction) - len(held) - size,
            size=size,
            writes=self._writes.get(direction, 0),
            reason=reason,
        )
        self._writes[direction] = 1 if held else 0
        return Chunk(direction, data)
