"""`Triggered`: fire once at a time from open, after N downstream bytes, or after the
response write that completes the Nth SSE event (pure)."""

from __future__ import annotations

from dataclasses import dataclass, field

from faults._lib.checks import check_positive
from faults._lib.events import EventCounter
from middlebox.core.fault import Bytes, FaultContext, Seconds
from middlebox.core.stream import Chunk


@dataclass
class Triggered:
    """Mixin for faults that fire once: at `at` seconds from open, once `after_bytes`
    downstream bytes have passed, or right after the response write that completes the
    `after_events`-th SSE event (whichever comes first). Call `arm(now)` on open.
    Counting events makes a trigger land at the same point of the stream on every run,
    where a time lands wherever the machine's speed puts it.
    """

    at: Seconds | None = None
    after_bytes: Bytes | None = None
    after_events: int | None = None

    _fire_at: float | None = field(init=False, repr=False, default=None)
    _armed: bool = field(init=False, repr=False, default=False)
    _down_bytes: int = field(init=False, repr=False, default=0)
    _event_counter: EventCounter | None = field(init=False, repr=False, default=None)

    def __post_init__(self) -> None:
        if self.at is None and self.after_bytes is None and self.after_events is None:
            raise ValueError(
                "needs a trigger: set `at` (seconds from open), `after_bytes` or `after_events`"
            )
        if self.after_events is not None and self.after_events < 1:
            raise ValueError(f"after_events must be at least 1, got {self.after_events!r}")
        if self.at is not None:
            check_positive("at", self.at, allow_zero=True)
        if self.after_bytes is not None:
            check_positive("after_bytes", self.after_bytes, allow_zero=True)

    def bind(self, context: FaultContext) -> None:
        super().bind(context)  # type: ignore[misc]
        if self.after_events is not None:
            # A reader that never advanced would keep every piece of the stream.
            self._event_counter = EventCounter(context.framing)

    def reads_http(self) -> bool:
        return self.after_events is not None

    def reads_sse(self) -> bool:
        return self.after_events is not None

    def leave(self) -> None:
        if self._event_counter is not None:
            self._event_counter.close()

    def arm(self, now: float) -> None:
        self._armed = True
        self._fire_at = None if self.at is None else now + self.at

    def disarm(self) -> None:
        self._armed = False
        self._fire_at = None

    def trigger_deadline(self) -> float | None:
        return self._fire_at

    def time_up(self, now: float) -> bool:
        return self._fire_at is not None and now >= self._fire_at

    def split_downstream(self, chunk: Chunk) -> tuple[Chunk, Chunk | None]:
        """Count a downstream chunk: the part before the `after_bytes` mark, and the
        rest (possibly empty) when this chunk reaches the mark, else None. A chunk that
        completes the `after_events`-th event passes whole, with an empty rest."""
        before = self._down_bytes
        self._down_bytes += len(chunk.data)
        counter = self._event_counter
        events = counter.feed(chunk.data) if counter is not None else 0
        if not self._armed:
            return chunk, None
        if self.after_bytes is not None and self._down_bytes >= self.after_bytes:
            cut = max(self.after_bytes - before, 0)
            self._down_bytes = before + cut
            return Chunk(chunk.direction, chunk.data[:cut]), Chunk(
                chunk.direction, chunk.data[cut:]
            )
        if self.after_events is not None and events >= self.after_events:
            return chunk, Chunk(chunk.direction, b"")
        return chunk, None

    @property
    def downstream_events(self) -> int:
        """SSE events counted in the response stream so far (with `after_events`)."""
        return self._event_counter.events if self._event_counter is not None else 0

    @property
    def downstream_bytes(self) -> int:
        """Downstream bytes counted before the trigger (up to the mark once it trips)."""
        return self._down_bytes
