"""Link timing shared by the network and link faults (pure).

- `Windowed`: the active window (`start`, `stop`, seconds from connection open) and
  per-direction byte offsets for reports; `Shaped` adds the `direction` acted on.
- `Queued`: a delay line with a bounded backlog (backpressure).
- `DelayLine`: a per-direction FIFO of items with release times. A TCP byte stream is
  delivered in order (RFC 9293 §3.10.7.4 queues out-of-order segments until the gap is
  filled), so an item is never released before the one ahead of it in its direction:
  that is head-of-line blocking, and the delay line enforces it for every fault.
- `Serializer`: a store-and-forward link that clocks bytes out at a rate, one segment
  after another (serialisation delay = size / rate).
"""

from __future__ import annotations

import heapq
from collections import deque
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Literal

from faults._lib.checks import check_choice, check_positive
from faults._lib.items import item_size, segments
from middlebox.core.fault import Bytes, Seconds
from middlebox.core.stream import Chunk, Direction, Item

DirectionChoice = Literal["both", "upstream", "downstream"]

MSS = 1460
"""TCP maximum segment size on a 1500-byte Ethernet MTU (1500 - 20 IP - 20 TCP)."""


def applies(choice: DirectionChoice, direction: Direction) -> bool:
    """True when `direction` is one of those `choice` names."""
    return choice == "both" or choice == direction.value


@dataclass
class Windowed:
    """Mixin for faults active in a window `[start, stop)` of seconds from connection open.

    Use as `class X(Windowed, Fault)`; `stop: null` means until the connection ends.
    Outside the window the fault lets items through (after any it still holds, so
    order is kept). Not a `Fault` itself, so it never needs a registry entry.
    """

    start: Seconds = 0.0
    stop: Seconds | None = None

    _opened: float = field(init=False, repr=False, default=0.0)
    _offsets: dict[Direction, int] = field(init=False, repr=False, default_factory=dict)

    def __post_init__(self) -> None:
        check_positive("start", self.start, allow_zero=True)
        if self.stop is not None and self.stop <= self.start:
            raise ValueError(f"stop ({self.stop}) must be after start ({self.start})")

    def on_open(self, now: float) -> list[Item]:
        self._opened = now
        return []

    def in_window(self, now: float) -> bool:
        elapsed = now - self._opened
        return elapsed >= self.start and (self.stop is None or elapsed < self.stop)

    def offset(self, direction: Direction) -> int:
        """Bytes counted so far in `direction` (see `count`)."""
        return self._offsets.get(direction, 0)

    def count(self, item: Item) -> int:
        """Count `item`'s bytes; returns the stream offset of its first byte."""
        before = self.offset(item.direction)
        self._offsets[item.direction] = before + item_size(item)
        return before


@dataclass
class Shaped(Windowed):
    """Mixin: `Windowed` plus the `direction` (both, upstream, downstream) acted on."""

    direction: DirectionChoice = "both"

    def __post_init__(self) -> None:
        super().__post_init__()
        check_choice("direction", self.direction, DirectionChoice)

    def active(self, direction: Direction, now: float) -> bool:
        """True when the fault acts on `direction` at time `now`."""
        return self.in_window(now) and applies(self.direction, direction)


class DelayLine:
    """Items waiting for their release time, FIFO per direction (never reordered)."""

    def __init__(self) -> None:
        self._queues: dict[Direction, deque[tuple[float, int, Item]]] = {
            direction: deque() for direction in Direction
        }
        self._last: dict[Direction, float] = {}
        self._bytes: dict[Direction, int] = dict.fromkeys(Direction, 0)
        self._seq = 0

    def put(self, item: Item, release: float, now: float) -> list[Item]:
        """Schedule `item` for `release` (or later, behind the item ahead of it).

        Returns `[item]` when it is due now and nothing waits ahead of it, else queues it.
        """
        direction = item.direction
        release = max(release, self._last.get(direction, release))
        self._last[direction] = release
        queue = self._queues[direction]
        if release <= now and not queue:
            return [item]
        self._seq += 1
        queue.append((release, self._seq, item))
        self._bytes[direction] += item_size(item)
        return []

    def deadline(self) -> float | None:
        heads = [queue[0][0] for queue in self._queues.values() if queue]
        return min(heads) if heads else None

    def due(self, now: float) -> list[Item]:
        """Pop every item released by `now`, in release order across directions."""
        ready: list[list[tuple[float, int, Item]]] = []
        for direction, queue in self._queues.items():
            batch = []
            while queue and queue[0][0] <= now:
                entry = queue.popleft()
                self._bytes[direction] -= item_size(entry[2])
                batch.append(entry)
            ready.append(batch)
        return [item for _, _, item in heapq.merge(*ready)]

    def drain(self) -> list[Item]:
        """Pop everything still waiting, in release order (the link is being torn down)."""
        return self.due(float("inf"))

    def pending(self, direction: Direction) -> int:
        """Bytes waiting in `direction`."""
        return self._bytes[direction]

    def busy(self, direction: Direction) -> bool:
        return bool(self._queues[direction])


class Serializer:
    """A link that clocks bytes out at `rate` bytes/s, one segment after another.

    A segment of n bytes finishes n / rate seconds after the link is free, as on a
    store-and-forward hop; a rate of None or 0 is an infinitely fast link.
    """

    def __init__(self) -> None:
        self._free_at: dict[Direction, float] = {}

    def finish(self, direction: Direction, size: int, now: float, rate: float | None) -> float:
        """When the last byte of a `size`-byte segment handed over at `now` is out."""
        begin = max(now, self._free_at.get(direction, now))
        end = begin + (size / rate if rate else 0.0)
        self._free_at[direction] = end
        return end

    def schedule(
        self, item: Item, now: float, rate: float | None, segment: int
    ) -> list[tuple[Item, float]]:
        """`item` cut into segments, each with the time its last byte is out."""
        pieces: list[Item] = (
            [Chunk(item.direction, piece) for piece in segments(item.data, segment)]
            if isinstance(item, Chunk)
            else [item]
        )
        return [
            (piece, self.finish(item.direction, item_size(piece), now, rate)) for piece in pieces
        ]


@dataclass
class Queued(Windowed):
    """Mixin: `Windowed` plus a `DelayLine` whose backlog is bounded by backpressure.

    Use as `class X(Shaped, Queued, Fault)` (or without `Shaped`) and release items
    with `self.send(item, at, now)`. While more than `max_backlog` bytes wait in one
    direction, `reading_paused` asks the shell to stop reading the socket that produces
    them: the kernel buffers fill and TCP's receive window closes on the sender (RFC 9293
    §3.8.6), as behind a real slow hop, so the proxy's memory stays bounded however
    fast the sender is.
    """

    max_backlog: Bytes = 1024 * 1024

    _line: DelayLine = field(init=False, repr=False, default_factory=DelayLine)
    _pressured: set[Direction] = field(init=False, repr=False, default_factory=set)

    if TYPE_CHECKING:

        def report(self, now: float, action: str, **details: Any) -> None: ...

    def __post_init__(self) -> None:
        super().__post_init__()
        check_positive("max_backlog", self.max_backlog, allow_zero=True)

    def send(self, item: Item, release: float, now: float) -> list[Item]:
        """Release `item` at `release` (behind those ahead of it); check the backlog."""
        out = self._line.put(item, release, now)
        self._backpressure(item.direction, now)
        return out

    def deadline(self) -> float | None:
        return self._line.deadline()

    def on_deadline(self, now: float) -> list[Item]:
        out = self._line.due(now)
        for direction in list(self._pressured):
            self._backpressure(direction, now)
        return out

    def reading_paused(self, source: Direction) -> bool:
        return source in self._pressured

    def drain(self) -> list[Item]:
        """Take everything still queued, in order (the path is being torn down)."""
        self._pressured.clear()
        return self._line.drain()

    def _backpressure(self, direction: Direction, now: float) -> None:
        backlog = self._line.pending(direction)
        pressured = backlog > self.max_backlog
        if pressured == (direction in self._pressured):
            return
        if pressured:
            self._pressured.add(direction)
        else:
            self._pressured.discard(direction)
        action = "backpressure_on" if pressured else "backpressure_off"
        self.report(now, action, direction=direction.value, backlog=backlog)
