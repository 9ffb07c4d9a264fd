"""bandwidth: a narrow link that clocks bytes out at `rate` bytes/s per direction.

Imitates a bottleneck hop (a congested uplink, a mobile cell, Linux `tc tbf` or
netem's `rate`): a store-and-forward link serialises each segment in size / rate
seconds, so a large write arrives as a train of MSS-sized segments (TCP never sends
more than one MSS per segment, RFC 9293 §3.7.1) rather than at once. Ends queue
behind the data, as a FIN or RST segment does.

When more than `max_backlog` bytes wait in one direction, the fault asks the shell
to stop reading the socket that produces them (`reading_paused`): the kernel buffers
fill and TCP's receive window closes on the sender (RFC 9293 §3.8.6), as behind a
real slow hop, so the proxy's memory stays bounded however fast the sender is.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import ClassVar

from faults._lib.checks import check_positive
from faults._lib.timing import MSS, Queued, Serializer, Shaped
from middlebox.core.fault import Bytes, Fault
from middlebox.core.stream import Direction, Item


@dataclass
class Bandwidth(Shaped, Queued, Fault):
    """Pace the chosen direction(s) to `rate` bytes/s in segments of `segment` bytes."""

    name: ClassVar[str] = "bandwidth"

    rate: Bytes = 125_000
    segment: Bytes = MSS
    max_backlog: Bytes = 64 * 1024

    _serializer: Serializer = field(init=False, repr=False, default_factory=Serializer)
    _throttling: set[Direction] = field(init=False, repr=False, default_factory=set)

    def __post_init__(self) -> None:
        super().__post_init__()
        check_positive("rate (bytes per second)", self.rate)
        check_positive("segment", self.segment)

    def on_item(self, item: Item, now: float) -> list[Item]:
        offset = self.count(item)
        direction = item.direction
        if not self.active(direction, now):
            return self.send(item, now, now)
        out: list[Item] = []
        for piece, finish in self._serializer.schedule(item, now, self.rate, self.segment):
            out.extend(self.send(piece, finish, now))
        if self._line.busy(direction) and direction not in self._throttling:
            self._throttling.add(direction)
            self.report(now, "throttling", direction=direction.value, offset=offset, rate=self.rate)
        return out
