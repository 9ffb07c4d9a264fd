"""latency: a fixed one-way delay plus seeded jitter, per direction.

Imitates a long or congested path (a mobile RTT, an intercontinental hop), like
Linux netem's `delay TIME JITTER` or toxiproxy's latency toxic. Unlike netem with
jitter, it never reorders: TCP hands the application bytes in order (RFC 9293
§3.10.7.4), so jitter that would put an item before its predecessor is clamped to the
predecessor's release time. Ends (FIN, RST) are delayed like data, so an RST arrives
after the bytes sent before it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from faults._lib.checks import check_positive
from faults._lib.timing import DirectionChoice, Queued, Shaped
from middlebox.core.fault import Fault, Seconds
from middlebox.core.stream import Item

__all__ = ["DirectionChoice", "Latency"]


@dataclass
class Latency(Shaped, Queued, Fault):
    """Delay every item by `delay` ± uniform `jitter` seconds in the chosen direction(s)."""

    name: ClassVar[str] = "latency"

    delay: Seconds = 0.05
    jitter: Seconds = 0.0

    def __post_init__(self) -> None:
        super().__post_init__()
        check_positive("delay", self.delay, allow_zero=True)
        check_positive("jitter", self.jitter, allow_zero=True)

    def on_item(self, item: Item, now: float) -> list[Item]:
        offset = self.count(item)
        if not self.active(item.direction, now):
            return self.send(item, now, now)
        wobble = self.rng.uniform(-self.jitter, self.jitter) if self.jitter else 0.0
        delay = max(self.delay + wobble, 0.0)
        if not self.fired:
            self.report(now, "delaying", direction=item.direction.value, offset=offset, delay=delay)
        return self.send(item, now + delay, now)
