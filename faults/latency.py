"""latency: a fixed one-way delay plus seeded jitter, per direction.

Imitates a long or congested path (a mobile RTT, an intercontinental hop), like
Linux netem's `delay TIME JITTER` or toxiproxy's latency toxic. Unlike netem with
jitter, it never reorders: TCP hands the application bytes in order (RFC 9293
§3.10.7.4), so jitter that would put an item before its predecessor is clamped to the
predecessor's release time. Ends (FIN, RST) are delayed like data, so an RST arrives
after the bytes sent before it.

It steps aside (`Fault.aside`: the pipeline passes items over it without a call) for a
direction once every item of it would go out at once, unchanged, with nothing left to
report: a direction it does not delay, one whose window is over with nothing queued,
and, with `delay: 0` and `jitter: 0`, every direction once its one `delaying` report is
made (nothing is ever queued then, so no backpressure report can follow). A zero-delay
latency is what `make bench`'s three-fault path and many scenarios' placeholders use; it
cost a call per item per direction for nothing.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from faults._lib.checks import check_positive
from faults._lib.timing import DirectionChoice, Queued, Shaped, applies
from middlebox.core.fault import Fault, Seconds
from middlebox.core.stream import Direction, Item

_EVERY_DIRECTION = frozenset(Direction)

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

    def on_open(self, now: float) -> list[Item]:
        out = super().on_open(now)
        self._step_aside(now)  # a direction it never delays: from the first byte
        return out

    def on_item(self, item: Item, now: float) -> list[Item]:
        offset = self.count(item)
        if not self.active(item.direction, now):
            out = self.send(item, now, now)
            if self.stop is not None:
                self._step_aside(now)  # the window may be over
            return out
        wobble = self.rng.uniform(-self.jitter, self.jitter) if self.jitter else 0.0
        delay = max(self.delay + wobble, 0.0)
        if not self.fired:
            self.report(now, "delaying", direction=item.direction.value, offset=offset, delay=delay)
            out = self.send(item, now + delay, now)
            self._step_aside(now)  # reported: a zero delay has nothing left to do
            return out
        return self.send(item, now + delay, now)

    def on_deadline(self, now: float) -> list[Item]:
        out = super().on_deadline(now)
        if self.stop is not None:
            self._step_aside(now)  # the last item queued in the window went out
        return out

    def deadline(self) -> float | None:
        if self.aside is _EVERY_DIRECTION:
            return None  # stepping aside for both: nothing is queued (see `_passes_at_once`)
        return super().deadline()

    def _step_aside(self, now: float) -> None:
        """Set `aside` to the directions whose items all go out at once from now on."""
        aside = frozenset(d for d in Direction if self._passes_at_once(d, now))
        if aside != self.aside:
            self.aside = _EVERY_DIRECTION if aside == _EVERY_DIRECTION else aside

    def _passes_at_once(self, direction: Direction, now: float) -> bool:
        """True when every `direction` item from `now` on would be sent on at once and
        unchanged with nothing to report: nothing queued ahead of it (order is kept) and
        no backpressure to lift, and either a direction it never delays, a window that is
        over (time only moves on), or no delay and no jitter once it has reported (its
        one report; a zero delay never queues, so no backpressure report follows)."""
        if self._line.busy(direction) or direction in self._pressured:
            return False
        if not applies(self.direction, direction):
            return True
        if self.stop is not None and now - self._opened >= self.stop:
            return True
        return self.delay == 0 and self.jitter == 0 and self.fired
