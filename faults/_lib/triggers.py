"""`Triggered`: fire once at a time from open, after N downstream bytes, or right after
the Nth SSE event, the Nth tool-call argument fragment or the Nth reasoning token
(pure)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import cast

from faults._lib.checks import check_positive
from faults._lib.events import EventCounter
from middlebox.core.dialects import TokenKind, read
from middlebox.core.fault import Bytes, Fault, FaultContext, Seconds
from middlebox.core.framed import Framed, Position
from middlebox.core.http1 import PieceKind
from middlebox.core.sse import SseKind, SsePiece
from middlebox.core.stream import Chunk


@dataclass
class Triggered:
    """Mixin for faults that fire once: at `at` seconds from open, once `after_bytes`
    downstream bytes have passed, or right after the response write that completes the
    `after_events`-th SSE event (whichever comes first). Call `arm(now)` on open.
    Counting events makes a trigger land at the same point of the stream on every run,
    where a time lands wherever the machine's speed puts it; so a write that carries
    more than the counted event is split after the event's blank line. A real vLLM
    whose API server falls behind sends many events in one write (a stalled vLLM 0.32
    sent the 5th to the 150th frame in one 21,871-byte read), and passing such a write
    whole would let a client that "vanished after 12 events" read the whole answer.

    On agent streams, `after_tool_fragments: N` fires after the event carrying the Nth
    tool-call argument fragment (inside the call's arguments: the JSON is not closed yet),
    and `after_reasoning_tokens: N` after the Nth event carrying reasoning text (inside
    the reasoning phase, before the answer starts). Events are read in the dialect of the
    API the request asked (`faults._lib.events.response_dialect`): a chat chunk's
    `tool_calls` / `reasoning`, Responses' `response.function_call_arguments.delta` /
    `response.reasoning_text.delta`, Messages' `input_json_delta` / `thinking_delta`; every
    event counts toward `after_events` whatever its name (a Responses stream's
    `response.created`, a Messages stream's `message_start` and `ping`). A fault calls
    `count_upstream` with the request bytes it sees, so that it knows the API when used
    on its own too.

    A response whose SSE line or event passes the proxy's bound (`proxy.sse_max_line`,
    `sse_max_event`) has no more events to count: the trigger counts on in the next
    response, and a fault still waiting for its count reports `stepped_aside` for it.
    """

    at: Seconds | None = None
    after_bytes: Bytes | None = None
    after_events: int | None = None
    after_tool_fragments: int | None = None
    after_reasoning_tokens: int | None = None

    _fire_at: float | None = field(init=False, repr=False, default=None)
    _armed: bool = field(init=False, repr=False, default=False)
    _down_bytes: int = field(init=False, repr=False, default=0)
    _event_counter: AgentEventCounter | None = field(init=False, repr=False, default=None)
    _events_at_mark: int | None = field(init=False, repr=False, default=None)

    def __post_init__(self) -> None:
        counts = {
            "after_events": self.after_events,
            "after_tool_fragments": self.after_tool_fragments,
            "after_reasoning_tokens": self.after_reasoning_tokens,
        }
        if self.at is None and self.after_bytes is None and set(counts.values()) == {None}:
            raise ValueError(
                "needs a trigger: set `at` (seconds from open), `after_bytes`, `after_events`, "
                "`after_tool_fragments` or `after_reasoning_tokens`"
            )
        for name, value in counts.items():
            if value is not None and value < 1:
                raise ValueError(f"{name} must be at least 1, got {value!r}")
        if self.at is not None:
            check_positive("at", self.at, allow_zero=True)
        if self.after_bytes is not None:
            check_positive("after_bytes", self.after_bytes, allow_zero=True)

    @property
    def _counts_events(self) -> bool:
        return (
            self.after_events is not None
            or self.after_tool_fragments is not None
            or self.after_reasoning_tokens is not None
        )

    def bind(self, context: FaultContext) -> None:
        super().bind(context)  # type: ignore[misc]
        if self._counts_events:
            # A reader that never advanced would keep every piece of the stream.
            self._event_counter = AgentEventCounter(context.framing)

    def reads_http(self) -> bool:
        return self._counts_events

    def reads_sse(self) -> bool:
        return self._counts_events

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

    def count_upstream(self, chunk: Chunk) -> None:
        """Request bytes that reached the fault: their heads name the API, and so the
        dialect the response's events are read in (framed here only outside a pipeline,
        where the fault frames what it sees itself)."""
        if self._event_counter is not None:
            self._event_counter.feed_request(chunk.data)

    def split_downstream(self, chunk: Chunk, now: float) -> tuple[Chunk, Chunk | None]:
        """Count a downstream chunk: the part before the mark, and the rest (possibly
        empty) when this chunk reaches it, else None. The mark is the `after_bytes`-th
        byte, or the end of the blank line that dispatches the counted event (the
        `after_events`-th event, the one with the Nth fragment or reasoning token)."""
        before = self._down_bytes
        self._down_bytes += len(chunk.data)
        counter = self._event_counter
        events = 0
        reached_at = None
        if counter is not None:
            start = counter.reader.cursor
            events = counter.feed(chunk.data, until=self._counted_enough)
            if counter.overflow is not None and self._armed:
                message, bound, offset = counter.overflow
                cast(Fault, self).report(
                    now,
                    "stepped_aside",
                    message=message,
                    reason=f"sse {bound} over its bound",
                    body_offset=offset,
                    events=events,
                )
            if counter.reached_at is not None:
                # The event's end in this write's bytes. It lies inside them (the blank line
                # that dispatches it is body data of this write), but it is clamped so that a
                # framing change can never turn it into a slice from the end.
                reached_at = min(max(counter.reached_at - start, 0), len(chunk.data))
        if not self._armed:
            return chunk, None
        cut = None
        if self.after_bytes is not None and self._down_bytes >= self.after_bytes:
            cut = max(self.after_bytes - before, 0)
        if reached_at is not None or self._counted_enough(counter, events):
            at_event = len(chunk.data) if reached_at is None else reached_at
            if counter is not None and reached_at is not None and (cut is None or at_event < cut):
                self._events_at_mark = counter.reached_events
            cut = at_event if cut is None else min(cut, at_event)
        if cut is None:
            return chunk, None
        self._down_bytes = before + cut
        return Chunk(chunk.direction, chunk.data[:cut]), Chunk(chunk.direction, chunk.data[cut:])

    def _counted_enough(self, counter: AgentEventCounter | None, events: int | None = None) -> bool:
        if counter is None:
            return False
        events = counter.events if events is None else events
        return (
            (self.after_events is not None and events >= self.after_events)
            or (
                self.after_tool_fragments is not None
                and counter.tool_fragments >= self.after_tool_fragments
            )
            or (
                self.after_reasoning_tokens is not None
                and counter.reasoning_tokens >= self.after_reasoning_tokens
            )
        )

    @property
    def downstream_events(self) -> int:
        """SSE events counted in the response stream so far (with `after_events`), or
        up to the mark once a write was split there."""
        if self._events_at_mark is not None:
            return self._events_at_mark
        return self._event_counter.events if self._event_counter is not None else 0

    @property
    def downstream_bytes(self) -> int:
        """Downstream bytes counted before the trigger (up to the mark once it trips)."""
        return self._down_bytes


class AgentEventCounter(EventCounter):
    """An `EventCounter` that also counts tool-call argument fragments and events that
    carry reasoning, read from the same framing (nothing is framed twice), in the dialect
    of the API its request asked (`middlebox.core.dialects`: chat `delta.tool_calls` and
    `delta.reasoning`, Responses `response.function_call_arguments.delta` and
    `response.reasoning_text.delta`, Messages `input_json_delta` and `thinking_delta`)."""

    def __init__(self, position: Position | None = None) -> None:
        super().__init__(position)
        self.tool_fragments = 0
        self.reasoning_tokens = 0
        self.reached_at: int | None = None
        self.reached_events = 0
        # (message, bound, body offset) of a response whose SSE framing stopped at a bound
        # in the last bytes fed; `_over` is the last such response
        self.overflow: tuple[int, str, int] | None = None
        self._over = -1

    def feed(self, data: bytes, until: Callable[[AgentEventCounter], bool] | None = None) -> int:
        """Count `data`; with `until`, `reached_at` is the stream offset right after the
        first event after which `until(self)` holds (None if none): after its blank line,
        and after the HTTP chunk's CRLF when the event ends its chunk and the CRLF came
        in the same bytes (an event boundary, as `cut` places one)."""
        self.reached_at = None
        self.overflow = None
        if self.own:
            self.reader.stream.feed(data)
        pieces = self.reader.advance(len(data))
        for number, framed in enumerate(pieces):
            for line in framed.lines:
                if line.kind is SseKind.OVERFLOW and framed.piece.message != self._over:
                    self._over = framed.piece.message
                    self.overflow = (self._over, line.field or "", line.offset)
                event = line.event
                if event is not None:
                    self.events += 1
                    meaning = read(event, self.dialect(framed.piece.message))
                    self.tool_fragments += meaning.tool_fragments
                    self.reasoning_tokens += meaning.token is TokenKind.REASONING
                    if until is not None and self.reached_at is None and until(self):
                        self.reached_at = _event_end(pieces, number, line)
                        self.reached_events = self.events
        return self.events


def _event_end(pieces: list[Framed], number: int, line: SsePiece) -> int:
    """The stream offset right after `line` (a dispatching blank line that ends in
    piece `number`; lines carry body offsets of their message, a piece its stream
    offset and body offset), past the chunk's CRLF when the line ends the chunk's data."""
    framed = pieces[number]
    piece = framed.piece
    piece_end = piece.offset + len(piece.data)
    end = min(max(piece.offset + line.offset + len(line.data) - framed.body_offset, piece.offset),
              piece_end)  # fmt: skip
    if end == piece_end and number + 1 < len(pieces):
        after = pieces[number + 1].piece
        if after.kind is PieceKind.CHUNK_TRAILER_CRLF:
            return after.offset + len(after.data)
    return end
