"""sse_ids: add, strip or renumber the `id:` lines of matched event streams.

Exercises clients' resume logic (WHATWG HTML "server-sent events": the last `id`
seen becomes `lastEventId`, sent back as `Last-Event-ID` when the client reconnects).
vLLM never sends `id:` (reference §1.1), so:
- `add` numbers each dispatched event that has no id (`id: N`, N from `start`), as a
  resumable gateway or an SSE relay such as Mercure does; the line goes just before
  the blank line that ends the event, with the same line ending;
- `strip` removes every `id:` line, as a proxy that normalises events does, so a
  client relying on `Last-Event-ID` loses its place;
- `renumber` rewrites every `id:` value to `start + event index`, as when a replica
  or a restarted relay numbers from scratch, so ids repeat or jump across a resume.

Every API vLLM streams is edited the same way, because `id:` is an SSE field and not
part of any API's data: chat and completions (data-only events), Responses and Messages
(named events: the `id:` line goes after their `event:` and `data:` lines, before the
blank line). A Responses stream carries its own resume position in the data
(`sequence_number`, which `GET /v1/responses/{id}?stream=true&starting_after=N` takes);
this fault never rewrites data, so renumbering the ids there makes `Last-Event-ID` and
`sequence_number` disagree, as behind a relay that numbers a resumed stream from scratch,
while the API's own position stays the server's. `add` counts a response's events from
`start`: with `start: 0` the ids equal the sequence numbers of a Responses stream read
from its beginning (not of a resumed replay, which starts past 0).

Edits are at line granularity with `faults._sse_edit.SseBodyEditor`: on a chunked
response each chunk that holds a changed line is re-encoded, every other chunk goes
out byte for byte; a Content-Length response is left alone and reported as skipped.
A line or event over the proxy's bound (`proxy.sse_max_line`, `sse_max_event`) ends the
editing of that response: the ids already changed stay changed, the rest passes as it comes,
and the fault reports `stepped_aside` (`faults._lib.sse_edit`).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import ClassVar, Literal

from faults._lib.checks import check_choice
from faults._lib.sse_edit import SseBodyEditor, SseRewriter
from middlebox.core.fault import Fault
from middlebox.core.sse import SseKind, SsePiece

__all__ = ["SseIds"]

Mode = Literal["add", "strip", "renumber"]


@dataclass
class SseIds(SseRewriter, Fault):
    """Add, strip or renumber `id:` lines in matched responses' event streams."""

    name: ClassVar[str] = "sse_ids"

    mode: Mode = "add"
    start: int = 1

    _changed: int = field(init=False, repr=False, compare=False, default=0)
    _events: int = field(init=False, repr=False, compare=False, default=0)

    def __post_init__(self) -> None:
        check_choice("mode", self.mode, Mode)

    def begin(self, editor: SseBodyEditor, now: float) -> None:
        self._changed = self._events = 0

    def edit(self, editor: SseBodyEditor, line: SsePiece, now: float) -> None:
        new = self._rewrite(line)
        if line.event is not None:
            self._events += 1
        if new is None:
            return
        editor.replace(line, new)
        if not self._changed:
            self.report(
                now,
                "rewriting_ids",
                mode=self.mode,
                request=self.request_index,
                message=self.response_index,
                event=self._events - (line.event is not None),
                body_offset=line.offset,
            )
        self._changed += 1

    def finish(self, now: float) -> None:
        if self._changed:
            self.report(now, "rewrote_ids", request=self.request_index, lines=self._changed)

    def _rewrite(self, line: SsePiece) -> bytes | None:
        """The bytes that replace `line`, or None to keep it."""
        if self.mode == "add":
            event = line.event
            if line.kind is not SseKind.BLANK or event is None or event.id is not None:
                return None
            # The blank line is the line ending; the id line takes the same one.
            return b"id: %d" % (self.start + event.index) + line.data + line.data
        if line.kind is not SseKind.FIELD or line.field != "id":
            return None
        if self.mode == "strip":
            return b""
        # The block this line is in will dispatch the next event.
        return b"id: %d" % (self.start + self._events) + line.data[line.value_end :]
