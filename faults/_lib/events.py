"""Counting the SSE events of a response stream (pure).

`EventCounter`: dispatched SSE events in the downstream stream at one place in the path,
read from the connection's framing (`middlebox.core.framed`), so counting frames nothing
again; on its own (outside a pipeline) it frames what it is fed. What an event means (a
token, a tool-call fragment, the answer's end) is `middlebox.core.dialects`' one rule.
"""

from __future__ import annotations

from middlebox.core.framed import FramedStream, Position
from middlebox.core.stream import Direction


class EventCounter:
    """Counts dispatched SSE events in the response stream at one place in the path:
    HTTP/1.1 responses de-chunked, `text/event-stream` bodies parsed by the WHATWG rules
    (so `[DONE]` counts, a comment-only keep-alive does not). It reads the connection's
    framing at `position`; without one it frames what it is fed itself."""

    def __init__(self, position: Position | None = None) -> None:
        self.own = position is None
        stream = FramedStream(Direction.DOWNSTREAM) if position is None else position.down
        self.reader = stream.reader()
        self.events = 0

    def feed(self, data: bytes) -> int:
        """Count response bytes that reached this place; returns the events so far."""
        if self.own:
            self.reader.stream.feed(data)
        for framed in self.reader.advance(len(data)):
            for line in framed.lines:
                if line.event is not None:
                    self.events += 1
        return self.events

    def close(self) -> None:
        self.reader.close()
