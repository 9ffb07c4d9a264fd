"""connection_limit: the browser's per-origin cap on HTTP/1.1 connections.

A browser opens at most six HTTP/1.1 connections to one origin (Chromium's
`kMaxSocketsPerGroup` 6, Firefox's `network.http.max-persistent-connections-per-server` 6);
a seventh request (another tab, a second chat pane) waits for one of them to close, and an
SSE stream holds its connection for the whole answer. The user sees the seventh answer's
first token only after an earlier answer ended. HTTP/2 multiplexes every stream on one
connection and removes the cap (`max_concurrent_streams` is its HTTP/2 counterpart).

The fault imitates that cap for clients that have none. A connection holds one of `limit`
slots from its request's first byte until its response has ended (the end of the message,
or the connection's); a request that finds every slot taken is held, its bytes kept back
(the browser has not sent it yet), until a slot frees, first come first served. A kept-alive
connection's next request takes a slot again, as a browser reuses an idle socket. The wait
is then part of that request's perceived time to first token. The slots are counted across
connections in the fault's scenario-lifetime state (one proxy process).

- `limit` (default 6); `poll` (default 10 ms): how often a held request checks its turn
  (a pure fault cannot be woken by another connection; the shell wakes it at its deadline).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, ClassVar

from faults._lib.checks import check_positive
from middlebox.core.fault import Fault, Seconds
from middlebox.core.framed import FramedStream, Reader
from middlebox.core.stream import UP, Chunk, Direction, Eof, Item, Reset


@dataclass
class ConnectionLimit(Fault):
    """Hold requests beyond `limit` in flight at once until an earlier response ends."""

    name: ClassVar[str] = "connection_limit"
    # Its queue is a list changed in place: one process's dict, not a store of copies.
    shared_in_process: ClassVar[bool] = True

    limit: int = 6
    poll: Seconds = 0.010

    # idle (no slot), held (waiting for one), busy (holding one), ended
    _state: str = field(init=False, repr=False, default="idle")
    _held: list[Item] = field(init=False, repr=False, default_factory=list)
    _held_at: float = field(init=False, repr=False, default=0.0)
    _last: float = field(init=False, repr=False, default=0.0)
    _responses: Reader | None = field(init=False, repr=False, default=None)
    _own_framing: bool = field(init=False, repr=False, default=False)

    def __post_init__(self) -> None:
        if self.limit < 1:
            raise ValueError(f"limit must be at least 1, got {self.limit}")
        check_positive("poll", self.poll)

    def reads_http(self) -> bool:
        return True  # the response's end frees the slot

    @property
    def _shared(self) -> dict[str, Any]:
        shared = self.context.shared
        shared.setdefault("busy", 0)
        shared.setdefault("waiting", [])
        return shared  # type: ignore[return-value]

    def on_open(self, now: float) -> list[Item]:
        self._last = now
        framing = self.context.framing
        if framing is None:  # alone (a unit test): it frames what it sees itself
            self._own_framing = True
            self._responses = FramedStream(Direction.DOWNSTREAM).reader()
        else:
            self._responses = framing.down.reader()
        return []

    def on_item(self, item: Item, now: float) -> list[Item]:
        self._last = now
        out: list[Item] = []
        if self._state == "held":
            self._admit_if_turn(now, out)
        if isinstance(item, Reset) or (isinstance(item, Eof) and item.direction is UP):
            self._end(now)
            out.extend(self._held)
            self._held.clear()
            out.append(item)
            return out
        if item.direction is UP:
            if self._state == "idle" and isinstance(item, Chunk):
                self._acquire(now)
            if self._state == "held":
                self._held.append(item)  # not sent yet: the browser's request waits
                return out
        elif isinstance(item, Chunk):
            self._read_response(item.data, now)
        elif isinstance(item, Eof):
            self._end(now)
        out.append(item)
        return out

    def deadline(self) -> float | None:
        return self._last + self.poll if self._state == "held" else None

    def on_deadline(self, now: float) -> list[Item]:
        self._last = now
        out: list[Item] = []
        self._admit_if_turn(now, out)
        return out

    def _read_response(self, data: bytes, now: float) -> None:
        assert self._responses is not None
        if self._own_framing:
            self._responses.stream.feed(data)
        for framed in self._responses.advance(len(data)):
            piece = framed.piece
            interim = piece.head is not None and piece.head.is_interim
            if piece.end_of_message and not interim and self._state == "busy":
                self._release(now)

    def _acquire(self, now: float) -> None:
        shared = self._shared
        if shared["busy"] < self.limit and not shared["waiting"]:
            shared["busy"] += 1
            self._state = "busy"
            return
        self._state = "held"
        self._held_at = now
        shared["waiting"].append(self.context.connection_id)
        self.report(now, "held", busy=shared["busy"], waiting=len(shared["waiting"]))

    def _admit_if_turn(self, now: float, out: list[Item]) -> None:
        shared = self._shared
        waiting: list[int] = shared["waiting"]
        if shared["busy"] >= self.limit or not waiting:
            return
        if waiting[0] != self.context.connection_id:
            return
        waiting.pop(0)
        shared["busy"] += 1
        self._state = "busy"
        self.report(now, "admitted", waited=round(now - self._held_at, 6))
        out.extend(self._held)
        self._held.clear()

    def _release(self, now: float) -> None:
        self._shared["busy"] -= 1
        self._state = "idle"

    def _end(self, now: float) -> None:
        if self._state == "busy":
            self._release(now)
        elif self._state == "held":
            waiting: list[int] = self._shared["waiting"]
            if self.context.connection_id in waiting:
                waiting.remove(self.context.connection_id)
        self._state = "ended"
