"""slicer: re-slice the byte stream into small writes.

Imitates a hop that forwards whatever it has in small pieces: a TLS record or TCP
segment boundary at an arbitrary byte, a proxy that flushes every read (nginx with
`proxy_buffering off` sends each upstream read as it arrives), a congested path that
delivers one small segment at a time. TCP promises only a byte stream (RFC 9293
§2.1), so a client must reassemble SSE lines (WHATWG HTML §9.2.6 parses lines across
reads) and UTF-8 sequences (a decoder must keep an incomplete sequence for the next
read); fixed or seeded random slice sizes cut inside `data:` lines and multi-byte
characters, and `utf8_interior` cuts before every continuation byte (RFC 3629 §3:
10xxxxxx), the case that turns a naive `bytes.decode()` per read into mojibake.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from itertools import pairwise
from typing import ClassVar

from faults._lib.checks import check_positive
from faults._lib.timing import DirectionChoice, Queued, Shaped
from middlebox.core.fault import Bytes, Fault, Seconds
from middlebox.core.sse import utf8_cut_offsets
from middlebox.core.stream import Chunk, Direction, Item


@dataclass
class Slicer(Shaped, Queued, Fault):
    """Cut each write into slices of `size` bytes (or seeded sizes up to `max_size`)."""

    name: ClassVar[str] = "slicer"

    direction: DirectionChoice = "downstream"
    size: Bytes = 1
    max_size: Bytes | None = None
    delay: Seconds = 0.0
    utf8_interior: bool = False

    _next_slot: dict[Direction, float] = field(init=False, repr=False, default_factory=dict)

    def __post_init__(self) -> None:
        super().__post_init__()
        check_positive("size", self.size)
        if self.max_size is not None and self.max_size < self.size:
            raise ValueError(f"max_size ({self.max_size}) must be >= size ({self.size})")
        check_positive("delay", self.delay, allow_zero=True)

    def on_item(self, item: Item, now: float) -> list[Item]:
        offset = self.count(item)
        if not isinstance(item, Chunk) or not self.active(item.direction, now):
            return self.send(item, now, now)
        slices = self.cut(item.data)
        if len(slices) > 1:
            self.report(
                now, "sliced", direction=item.direction.value, offset=offset, slices=len(slices)
            )
        out: list[Item] = []
        for piece in slices:
            release = max(now, self._next_slot.get(item.direction, now))
            self._next_slot[item.direction] = release + self.delay
            out.extend(self.send(Chunk(item.direction, piece), release, now))
        return out

    def cut(self, data: bytes) -> list[bytes]:
        """`data` cut at the size boundaries and, if asked, before every UTF-8 interior byte."""
        cuts = set()
        position = 0
        while position < len(data):
            step = (
                self.size if self.max_size is None else self.rng.randint(self.size, self.max_size)
            )
            position += step
            cuts.add(min(position, len(data)))
        if self.utf8_interior:
            cuts.update(utf8_cut_offsets(data))
        bounds = [0, *sorted(cuts)]
        return [data[a:b] for a, b in pairwise(bounds) if b > a]
