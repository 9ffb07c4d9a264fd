"""Counting and classifying the SSE events of a response stream (pure).

- `EventCounter`: dispatched SSE events in the downstream stream at one place in the
  path, read from the connection's framing (`middlebox.core.framed`), so counting
  frames nothing again; on its own (outside a pipeline) it frames what it is fed.
- `token_bearing`: whether a vLLM/OpenAI SSE event carries generated text (a "token"
  in vLLM's sense: one engine output per frame with `--stream-interval 1`).
"""

from __future__ import annotations

import json

from middlebox.core.framed import FramedStream, Position
from middlebox.core.sse import SseEvent
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


def token_bearing(event: SseEvent) -> bool:
    """True for a chat or completions chunk with generated text in any choice
    (`delta.content`, `delta.reasoning`/`reasoning_content`, `delta.tool_calls`, or
    `text`), as vLLM's own benchmark counts output chunks (vllm/benchmarks, §7.1 of the
    wire notes); the role chunk (`content: ""`), usage, errors and `[DONE]` are not."""
    if event.is_done:
        return False
    try:
        chunk = json.loads(event.data)
    except ValueError:
        return False
    choices = chunk.get("choices") if isinstance(chunk, dict) else None
    if not isinstance(choices, list):
        return False
    for choice in choices:
        if not isinstance(choice, dict):
            continue
        if isinstance(choice.get("text"), str) and choice["text"]:
            return True
        delta = choice.get("delta")
        if isinstance(delta, dict) and any(
            delta.get(key) for key in ("content", "reasoning", "reasoning_content", "tool_calls")
        ):
            return True
    return False
