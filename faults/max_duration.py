"""max_duration: a gateway's or a serverless platform's cap on a whole response.

Unlike a read timeout (`idle_reaper`), this counts from the request's start however
busy the stream is, as a hard wall-clock limit does:
- AWS API Gateway's integration timeout (29 s by default for REST APIs): past it the
  client gets `504` ("Endpoint request timed out") if nothing was sent yet;
- Vercel's function `maxDuration` (300 s on current plans), Cloudflare Workers' and
  Lambda's limits: a streamed response is cut where it stands;
- any `proxy_timeout`-style total limit on a hop (e.g. an Envoy route `timeout`,
  15 s by default, which answers 504 before headers and resets after).

When the limit passes before any byte of the response reached the client, the
client gets `before_headers` (504, 502 or a reset, in nginx's error-page shape);
after that the response ends as `end`: `truncated_chunked` (FIN without the terminal
chunk, what a proxy that can no longer change the status does), `fin` (the terminal
chunk when the bytes so far end between chunks, so the HTTP message is complete and
only `[DONE]` is missing) or `rst`. The upstream connection is closed either way (reset
for `rst`), so the server learns the client is gone.

Each exchange on a keep-alive connection is timed from its own request head; a
complete response disarms the limit. Only requests that `match` selects are capped.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field
from typing import ClassVar

from faults._lib.checks import check_choice, check_positive
from faults._lib.ends import (
    BeforeHeaders,
    ResponseEnd,
    ResponseProgress,
    end_response,
    gateway_answer,
)
from faults._lib.match import RESPONSES, HttpMatched
from middlebox.core.fault import Fault, Seconds
from middlebox.core.http1 import PieceKind
from middlebox.core.stream import UP, Chunk, Direction, Eof, Item, Reset

__all__ = ["MaxDuration"]


@dataclass
class MaxDuration(HttpMatched, Fault):
    """End each selected exchange `limit` seconds after its request started."""

    name: ClassVar[str] = "max_duration"

    limit: Seconds = 30.0
    end: ResponseEnd = "truncated_chunked"
    before_headers: BeforeHeaders = "504"

    _starts: dict[int, float] = field(init=False, repr=False, default_factory=dict)
    _armed: deque[tuple[int, float]] = field(init=False, repr=False, default_factory=deque)
    _progress: ResponseProgress = field(init=False, repr=False, default_factory=ResponseProgress)
    _closed: bool = field(init=False, repr=False, default=False)

    def changes(self) -> frozenset[Direction]:
        return RESPONSES  # its answer or early end, when it fires

    def publishes(self) -> frozenset[Direction]:
        return RESPONSES  # it forwards pieces as they came

    def __post_init__(self) -> None:
        check_positive("limit", self.limit)
        check_choice("end", self.end, ResponseEnd)
        check_choice("before_headers", self.before_headers, BeforeHeaders)

    def on_item(self, item: Item, now: float) -> list[Item]:
        if self._closed:
            return []  # both sides were ended when the limit passed
        pieces = self.observe(item, now)
        if item.direction is Direction.UPSTREAM:
            for piece in pieces:
                if piece.kind is PieceKind.HEAD:
                    self._starts[piece.message] = now
            self._arm_decided()
            if not isinstance(item, Chunk):
                self._armed.clear()  # the client left; nothing to cap
            return [item]
        if isinstance(item, Chunk):
            held = self._flow.responses.held
            for message in self._progress.feed(len(item.data), pieces, held):
                self._arm_decided()  # a response head decides its request too
                while self._armed and self._armed[0][0] <= message:
                    self._armed.popleft()
                self._starts.pop(message, None)
        else:
            self._armed.clear()
        self._arm_decided()
        return [self.forwarded(item)]

    def _arm_decided(self) -> None:
        """Arm the limit for each request decided since the last call and selected."""
        for message in sorted(self._starts):
            if self.decided(message):
                start = self._starts.pop(message)
                if self.selected(message) is not None:
                    self._armed.append((message, start + self.limit))

    def deadline(self) -> float | None:
        if self._closed or not self._armed:
            return None
        return self._armed[0][1]

    def on_deadline(self, now: float) -> list[Item]:
        self._closed = True
        message, _ = self._armed[0]
        progress = self._progress
        if progress.started and progress.message == message:
            out = end_response(self.end, progress)
            out.append(Reset(UP) if self.end == "rst" else Eof(UP))
            end: str = self.end
            if self.end == "fin" and len(out) == 2 and progress.chunked:
                end = "truncated_chunked"  # mid-chunk: the message cannot be completed
        else:
            out = gateway_answer(self.before_headers)
            end = self.before_headers
        self.report(
            now,
            "limit_reached",
            response=message,
            phase="after_headers" if progress.started else "before_headers",
            end=end,
            byte=progress.offset,
            body_byte=progress.body,
        )
        return self.wrote(out)
