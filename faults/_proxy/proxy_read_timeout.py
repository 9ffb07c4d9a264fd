"""proxy_read_timeout: the proxy's own read timeout, which is the `idle_reaper` fault.

One read timeout, not two: a scenario's `proxy: {read_timeout: 30s}` and a path entry
`idle_reaper: {timeout: 30s}` time the same thing the same way (nginx's `proxy_read_timeout`,
armed once the request is sent and re-armed by every upstream byte; see faults/idle_reaper.py).
What differs is how the proxy itself leaves the connection afterwards, which a hop in the
path cannot know:

- before the response head, nginx answers `504 Gateway Time-out` and closes the upstream
  connection; here the upstream gets an RST, so an upstream that hangs and never closes
  cannot hold the connection open. nginx then lingers (`lingering_close`, for
  `lingering_timeout`, 5 s) so the client can read the page before the socket is closed: the
  connection ends when the client closes, or at the end of the linger;
- after the head went out, nginx can only close both connections at once (a truncated body).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import ClassVar

from faults._lib.checks import check_positive
from faults.idle_reaper import IdleReaper
from middlebox.core.fault import Seconds, StageEvent
from middlebox.core.stream import UP, Chunk, Eof, Item, Reset

# nginx's lingering_timeout default: how long it waits for the client after its own answer.
LINGERING_TIMEOUT = 5.0


@dataclass
class ProxyReadTimeout(IdleReaper):
    """`idle_reaper` with the proxy's own ends: an RST upstream, a lingering close."""

    name: ClassVar[str] = "proxy_read_timeout"
    stage_event: ClassVar[StageEvent | None] = StageEvent.READ_TIMEOUT

    linger: Seconds = LINGERING_TIMEOUT

    connection_closed: bool = field(init=False, repr=False, default=False)
    finished: bool = field(init=False, repr=False, default=False)
    _linger_until: float | None = field(init=False, repr=False, default=None)

    def __post_init__(self) -> None:
        super().__post_init__()
        check_positive("linger", self.linger)

    def on_item(self, item: Item, now: float) -> list[Item]:
        if self._linger_until is not None:
            if item.direction is UP and not isinstance(item, Chunk):
                # The client read the answer and closed: the linger is over.
                self._linger_until = None
                self.connection_closed = True
            return []
        return super().on_item(item, now)

    def deadline(self) -> float | None:
        if self._linger_until is not None:
            return self._linger_until
        return super().deadline()

    def on_deadline(self, now: float) -> list[Item]:
        if self._linger_until is not None:
            self._linger_until = None
            self.connection_closed = True
            return []
        out = super().on_deadline(now)
        if any(isinstance(item, Chunk) for item in out):
            # An error page went out: RST the upstream, linger for the client.
            out = [
                Reset(UP) if isinstance(item, Eof) and item.direction is UP else item
                for item in out
            ]
            self._linger_until = now + self.linger
        else:
            self.connection_closed = True
        return out
