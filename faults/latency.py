"""latency: a fixed one-way delay plus seeded jitter, per direction.

Imitates a long or congested path (a mobile RTT, an intercontinental hop). Like a
FIFO link, it never reorders: jitter that would put an item before its predecessor
is clamped to the predecessor's release time, as TCP delivers in order. Ends (FIN,
RST) are delayed like data, so an RST arrives after the bytes sent before it.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field
from typing import ClassVar, Literal

from middlebox.fault import Fault, Seconds
from middlebox.stream import Direction, Item

DirectionChoice = Literal["both", "upstream", "downstream"]


@dataclass
class Latency(Fault):
    """Delay every item by `delay` ± uniform `jitter` seconds in the chosen direction(s)."""

    name: ClassVar[str] = "latency"

    delay: Seconds = 0.05
    jitter: Seconds = 0.0
    direction: DirectionChoice = "both"

    _queue: deque[tuple[float, Item]] = field(init=False, repr=False, default_factory=deque)
    _last_release: dict[Direction, float] = field(init=False, repr=False, default_factory=dict)

    def applies_to(self, direction: Direction) -> bool:
        return self.direction == "both" or self.direction == direction.value

    def on_item(self, item: Item, now: float) -> list[Item]:
        if not self.applies_to(item.direction):
            return [item]
        offset = self.rng.uniform(-self.jitter, self.jitter) if self.jitter else 0.0
        release = max(now + max(self.delay + offset, 0.0), self._last_release.get(item.direction, 0.0))
        self._last_release[item.direction] = release
        self._queue.append((release, item))
        return []

    def deadline(self) -> float | None:
        if not self._queue:
            return None
        return min(release for release, _ in self._queue)

    def on_deadline(self, now: float) -> list[Item]:
        due = [entry for entry in self._queue if entry[0] <= now]
        self._queue = deque(entry for entry in self._queue if entry[0] > now)
        due.sort(key=lambda entry: entry[0])
        return [item for _, item in due]
