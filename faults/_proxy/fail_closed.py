"""fail_closed: a request that cannot be framed is answered as nginx would, never passed on.

When an HTTP-aware fault is in the path, a message the framer refuses (a
smuggled request in a chunked body, a request line with two spaces, CL and TE together,
a CONNECT) must not reach the faults or the upstream as raw bytes: they would skip every
HTTP fault and the upstream might serve what nginx refuses. nginx answers such a request
with its error page and `Connection: close` (400; 405 for CONNECT; 501 for an unknown
transfer coding: ngx_http_request.c) and closes; bytes after a `Connection: close`
request it reads and discards without an answer.

This stage sits client-side of the scenario's faults and reads the request stream's one
framing pass (`Http1Framer.refusal`, no reader of its own: the hot path stays light).
The refused message never leaves it: bytes before it pass, the rest is swallowed, the
client gets the answer and a FIN, the upstream a FIN. When the refused message's head
already went on in an earlier read and its answer has started, only the close follows
(nginx discarding a bad body). With no HTTP-aware fault in the path nothing is framed
and the stage steps aside at once (pass-through frames nothing).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import ClassVar

from middlebox.core.fault import FaultContext, StageEvent
from middlebox.core.http1 import Http1Framer
from middlebox.core.responses import error_response
from middlebox.core.stream import DOWN, UP, Chunk, Eof, Item

from .refusing import RefusingStage

_RESPONSES = frozenset({DOWN})


@dataclass
class FailClosed(RefusingStage):
    """Answer a request the framer refuses with nginx's status and close both sides."""

    name: ClassVar[str] = "fail_closed"
    stage_event: ClassVar[StageEvent | None] = StageEvent.UNFRAMEABLE_REQUEST

    _responses: Http1Framer | None = field(init=False, repr=False, default=None)

    def bind(self, context: FaultContext) -> None:
        super().bind(context)
        position = context.framing
        if position is not None:
            self._framer = position.up.http
            self._responses = position.down.http
            if self._framer is not None:
                # it watches requests only: a response goes on as it came until it closes
                self.aside = _RESPONSES

    def on_item(self, item: Item, now: float) -> list[Item]:
        settled = self.settled(item, UP)
        if settled is not None:
            return settled
        assert self._framer is not None  # settled() answered for no framer
        refusal = self._framer.refusal
        if not isinstance(item, Chunk) or refusal is None:
            if isinstance(item, Chunk):
                self._passed += len(item.data)
            return [item]
        start = self._passed
        self._passed += len(item.data)
        # The refused message goes nowhere: cut at its start when none of it passed yet,
        # else where its bad bytes start (the head went on in an earlier read).
        cut = refusal.offset if refusal.offset >= start else max(refusal.at, start)
        out: list[Item] = [Chunk(UP, item.data[: cut - start])] if cut > start else []
        self.report(
            now,
            "refused",
            reason=refusal.reason,
            status=refusal.status,
            message=refusal.message,
            byte=refusal.at,
        )
        if refusal.status is None:
            # After a Connection: close request: read and discard, answer nothing.
            self._discarding = True
            return out
        self.connection_closed = True
        self.aside = frozenset()  # closed: nothing more goes anywhere, responses included
        answered = self._responses is not None and self._responses.message > refusal.message
        started = self._responses is not None and (
            self._responses.in_head or self._responses.in_body
        )
        if refusal.offset < start and (answered or started):
            return [*out, Eof(DOWN), Eof(UP)]  # its answer is under way: only the close
        return [*out, Chunk(DOWN, error_response(refusal.status)), Eof(DOWN), Eof(UP)]
