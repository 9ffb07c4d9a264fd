"""sse_retry: set, change or strip the `retry:` field of matched event streams.

Exercises an EventSource client's reconnect delay. WHATWG HTML ("server-sent events",
interpreting an event stream): a `retry` field whose value is ASCII digits sets the
stream's reconnection time to that many milliseconds; any other value is ignored; the field
takes effect when its line is parsed, whether or not its block dispatches an event. vLLM
never sends `retry:`, so an EventSource client falls back to its default (about 3 s in
browsers). Real hops that touch it:
- `set`: an SSE gateway or a resumable relay (Mercure, a CDN's SSE feature) that announces
  its own reconnect delay: `retry: N` goes at the start of the stream, in a block of its
  own, and every `retry:` line the server sends says N too;
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

    def __post_init__(self) -> None:
        check_choice("mode", self.mode, Mode)
        check_positive("delay", self.delay, allow_zero=True)

    @property
    def retry_ms(self) -> int:
        """The reconnection time written, in whole milliseconds (the field's unit)."""
        return round(self.delay * 1000)

    def begin(self, editor: SseBodyEditor, now: float) -> None:
        self._changed = 0
        if self.mode == "set":
            # A block with no data line dispatches nothing, but its retry field counts.
            editor.insert(0, b"retry: %d\n\n" % self.retry_ms)
            self.report(
                now,
                "set_retry",
                request=self.request_index,
                message=self.response_index,
                retry_ms=self.retry_ms,
            )

    def edit(self, editor: SseBodyEditor, line: SsePiece, now: float) -> None:
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
