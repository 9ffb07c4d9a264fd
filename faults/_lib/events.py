"""Counting the SSE events of a response stream, and the dialect they are read in (pure).

`EventCounter`: dispatched SSE events in the downstream stream at one place in the path,
read from the connection's framing (`middlebox.core.framed`), so counting frames nothing
again; on its own (outside a pipeline) it frames what it is fed. What an event means (a
token, a tool-call fragment, the answer's end) is `middlebox.core.dialects`' one rule, read
in the dialect of the API the request asked (`response_dialect`): `POST /v1/responses`
answers in Responses events, `POST /v1/messages` in Anthropic's, as the scorer reads them.
"""

from __future__ import annotations

from middlebox.core.dialects import Dialect, dialect_for
from middlebox.core.framed import FramedStream, Position
from middlebox.core.stream import Direction


def response_dialect(requests: FramedStream, message: int) -> Dialect | None:
    """The dialect of response `message`, from the request it answers (its method and
    target); None when that request is not known or names no streaming API, and the
    events then read by their own shape (`middlebox.core.dialects.detect`)."""
    head = requests.request_heads.get(message)
    if head is None or head.method is None or head.target is None:
        return None
    return dialect_for(head.method, head.target)


class EventCounter:
    """Counts dispatched SSE events in the response stream at one place in the path:
    HTTP/1.1 responses de-chunked, `text/event-stream` bodies parsed by the WHATWG rules
    (so `[DONE]` counts, a comment-only keep-alive does not). It reads the connection's
    framing at `position`; without one it frames what it is fed itself (the response
    bytes, and the request bytes through `feed_request`, whose heads name the dialect)."""

    def __init__(self, position: Position | None = None) -> None:
        self.own = position is None
        if position is None:
            up, down = FramedStream(Direction.UPSTREAM), FramedStream(Direction.DOWNSTREAM)
            up.responses_to.append(down)
            position = Position(up, down)
        self.requests = position.up
        self.reader = position.down.reader()
        self.events = 0
        self._dialect: tuple[int, Dialect | None] = (-1, None)

    def feed_request(self, data: bytes) -> None:
        """Request bytes that reached this place (framed here only when on its own)."""
        if self.own:
            self.requests.feed(data)

    def dialect(self, message: int) -> Dialect | None:
        """`response_dialect` of response `message` (looked up once per response)."""
        if self._dialect[0] != message:
            self._dialect = (message, response_dialect(self.requests, message))
        return self._dialect[1]

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
