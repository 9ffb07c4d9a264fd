"""sse_retry: set, change or strip the `retry:` field of matched event streams.

Exercises an EventSource client's reconnect delay. WHATWG HTML ("server-sent events",
interpreting an event stream): a `retry` field whose value is ASCII digits sets the
stream's reconnection time to that many milliseconds; any other value is ignored; the field
takes effect when its line is parsed, whether or not its block dispatches an event. vLLM
never sends `retry:`, so an EventSource client falls back to its default (about 3 s in
browsers). Real hops that touch it:
- `set`: an SSE gateway or a resumable relay (Mercure, a CDN's SSE feature) that announces
  its own reconnect delay: `retry: N` goes into the first event's block (just before the
  blank line that dispatches it, with the same line ending), and every `retry:` line the
  server sends says N too. Not in a block of its own: the spec dispatches nothing for a
  block without data, but the OpenAI Python SDK and httpx-sse then yield an empty event
  and fail to parse it (seen with scenarios/sse-retry-set.yaml), which no real gateway
  that serves those clients can afford;
- `change`: a hop that rewrites the server's own `retry:` lines to N (and adds none);
- `strip`: a normaliser that drops `retry:` lines, so the client keeps its default.

Edits are at line granularity with `faults._lib.sse_edit.SseBodyEditor`: on a chunked
response only the chunks that hold a changed line are re-encoded (an inserted block is a
chunk of its own); a Content-Length response is left alone and reported as skipped.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import ClassVar, Literal

from faults._lib.checks import check_choice, check_positive
from faults._lib.sse_edit import SseBodyEditor, SseRewriter
from middlebox.core.fault import Fault, Seconds
from middlebox.core.sse import SseKind, SsePiece

__all__ = ["SseRetry"]

Mode = Literal["set", "change", "strip"]


@dataclass
class SseRetry(SseRewriter, Fault):
    """Set, change or strip `retry:` lines in matched responses' event streams."""

    name: ClassVar[str] = "sse_retry"

    mode: Mode = "set"
    delay: Seconds = 3.0

    _changed: int = field(init=False, repr=False, compare=False, default=0)
    _announced: bool = field(init=False, repr=False, compare=False, default=False)

    def __post_init__(self) -> None:
        check_choice("mode", self.mode, Mode)
        check_positive("delay", self.delay, allow_zero=True)

    @property
    def retry_ms(self) -> int:
        """The reconnection time written, in whole milliseconds (the field's unit)."""
        return round(self.delay * 1000)

    def begin(self, editor: SseBodyEditor, now: float) -> None:
        self._changed = 0
        self._announced = self.mode != "set"

    def edit(self, editor: SseBodyEditor, line: SsePiece, now: float) -> None:
        if not self._announced and line.kind is SseKind.BLANK and line.event is not None:
            # The blank line is the line ending; the retry line takes the same one.
            editor.replace(line, b"retry: %d" % self.retry_ms + line.data + line.data)
            self._announced = True
            self.report(
                now,
                "set_retry",
                request=self.request_index,
                message=self.response_index,
                event=line.event.index,
                body_offset=line.offset,
                retry_ms=self.retry_ms,
            )
            return
        if line.kind is not SseKind.FIELD or line.field != "retry":
            return
        if self.mode == "strip":
            editor.replace(line, b"")
        else:
            ending = line.data[line.value_end :]  # the line keeps its own terminator
            editor.replace(line, b"retry: %d" % self.retry_ms + ending)
        self._changed += 1

    def finish(self, now: float) -> None:
        if self._changed:
            self.report(
                now,
                "rewrote_retry",
                mode=self.mode,
                request=self.request_index,
                lines=self._changed,
            )
