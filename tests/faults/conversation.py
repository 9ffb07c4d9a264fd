"""One HTTP/1.1 exchange between a client and a server that react to what a pipeline lets
through, on a virtual clock, ended as the relay ends a connection (for tests).

`faults.testing.replay` feeds a fixed timeline; here the two peers answer what reaches
them, so a request that never reaches the server is never answered, as on real sockets:

- the client sends its request at time 0, reads the answer with its own framer, and
  closes (FIN) once the final response is whole, or the server's FIN arrived, or it has
  heard nothing for `CLIENT_TIMEOUT` (it gave up: `timed_out`); an RST ends it at once;
- the server reads requests with its own framer and answers each whole one with the
  exchange's writes, one every `WRITE_GAP`; it closes (FIN) after an answer to an HTTP/1.0
  or `Connection: close` request, when idle `KEEPALIVE` after an answer (uvicorn's
  `timeout_keep_alive`, 5 s in vLLM), or once the client's FIN came and its writes are out;
- the connection is finished when the relay's `_check_done` would say so
  (middlebox/shell/relay.py): both peers stopped sending to us (each sent its end, or was
  sent an RST) or a proxy stage closed the connection and both ends went out, and the
  pipeline wants no deadline; finished stages leave the pipeline as the relay drops them.

Nothing past `horizon` virtual seconds happens: a connection not finished by then hangs.
A deadline that fires again and again at one instant without time moving is `stuck`.
"""

from __future__ import annotations

import heapq
import itertools
from collections.abc import Callable
from dataclasses import dataclass, field

from middlebox.core.fault import Pipeline, proxy_stages
from middlebox.core.http1 import Head, Http1Framer
from middlebox.core.stream import Chunk, Direction, Eof, Item, Reset

CLIENT_TIMEOUT = 86_400.0  # a day without a byte: the client gives up (a silence, not a slow path)
KEEPALIVE = 5.0  # uvicorn's timeout_keep_alive as vLLM sets it
WRITE_GAP = 0.02  # between the server's writes of one answer (a token's time)
STUCK = 10_000  # deadline wake-ups at one instant that count as a loop


@dataclass(frozen=True)
class Exchange:
    """What the client sends (`method` tells its framer whether an answer has a body) and
    the server's writes answering each request head (`answer(head)`)."""

    name: str
    request: bytes
    method: str
    answer: Callable[[Head], list[bytes]]


@dataclass
class Outcome:
    """What each peer sent and got, how each side's stream ended, and when."""

    request_sent: bytes = b""
    server_got: bytearray = field(default_factory=bytearray)
    answer_sent: bytearray = field(default_factory=bytearray)
    client_got: bytearray = field(default_factory=bytearray)
    client_end: str | None = None  # "fin" or "rst": the end the client was sent
    server_end: str | None = None
    complete: bool = False  # the client framed a whole final response
    timed_out: bool = False  # the client gave up waiting
    finished_at: float | None = None  # the relay would have ended the connection then
    stuck_at: float | None = None  # a deadline looped at this instant
    server_requests: int = 0  # whole requests the server framed

    @property
    def finished(self) -> bool:
        return self.finished_at is not None


class Conversation:
    """The two peers and the pipeline between them (see the module docstring)."""

    def __init__(self, pipeline: Pipeline, exchange: Exchange, horizon: float) -> None:
        self.pipeline = pipeline
        self.exchange = exchange
        self.horizon = horizon
        self.outcome = Outcome(request_sent=exchange.request)
        self.stages = proxy_stages(pipeline.faults)
        self._queue: list[tuple[float, int, Callable[[], None]]] = []
        self._seq = itertools.count()
        self.now = 0.0
        # the client
        self._client_framer = Http1Framer("response")
        self._client_framer.expect_response_to(exchange.method)
        self._client_closed = False  # it sent its end (or was reset)
        self._client_heard = 0.0  # when a byte (or the open) last reached it
        self._client_read_done = False
        self._client_write_done = False
        # the server
        self._server_framer = Http1Framer("request")
        self._server_closed = False
        self._server_read_done = False
        self._server_write_done = False
        self._server_busy_until = 0.0  # when its last scheduled write goes out
        self._server_generation = 0  # bumped by each new request (the keep-alive timer)
        self._server_heads: list[Head] = []

    # -- the clock -------------------------------------------------------------------

    def at(self, time: float, action: Callable[[], None]) -> None:
        heapq.heappush(self._queue, (time, next(self._seq), action))

    def run(self) -> Outcome:
        self._route(self.pipeline.on_open(0.0))
        self.at(0.0, self._client_send)
        self.at(CLIENT_TIMEOUT, self._client_timer)
        repeats = 0
        while not self._done():
            due = self.pipeline.deadline()
            event = self._queue[0][0] if self._queue else None
            if due is not None and (event is None or due <= event):
                time = max(due, self.now)
                if time > self.horizon:
                    break
                repeats = repeats + 1 if time == self.now else 0
                if repeats > STUCK:
                    self.outcome.stuck_at = time
                    break
                self.now = time
                self._route(self.pipeline.on_deadline(time))
            elif event is not None:
                if event > self.horizon:
                    break
                self.now = max(self.now, event)
                _, _, action = heapq.heappop(self._queue)
                action()
            else:
                break  # nothing will ever happen again
        else:
            self.outcome.finished_at = self.now
        return self.outcome

    def _done(self) -> bool:
        both_read = self._client_read_done and self._server_read_done
        closed_by_stage = (
            self._client_write_done
            and self._server_write_done
            and any(stage.connection_closed for stage in self.stages)
        )
        return (both_read or closed_by_stage) and self.pipeline.deadline() is None

    def _feed(self, item: Item) -> None:
        self._route(self.pipeline.on_item(item, self.now))

    def _route(self, items: list[Item]) -> None:
        # what the relay does after every pipeline call: finished stages leave
        finished = [stage for stage in self.stages if stage.finished]
        if finished:
            gone = {id(stage) for stage in finished}
            self.stages = [stage for stage in self.stages if id(stage) not in gone]
            self.pipeline.faults = [f for f in self.pipeline.faults if id(f) not in gone]
        for item in items:
            if item.direction is Direction.UPSTREAM:
                self._to_server(item)
            else:
                self._to_client(item)

    # -- the client ------------------------------------------------------------------

    def _client_send(self) -> None:
        self._feed(Chunk(Direction.UPSTREAM, self.exchange.request))

    def _client_close(self) -> None:
        if not self._client_closed:
            self._client_closed = True
            self._client_read_done = True
            self._feed(Eof(Direction.UPSTREAM))

    def _client_timer(self) -> None:
        if self._client_closed or self.outcome.complete:
            return
        if self.now - self._client_heard >= CLIENT_TIMEOUT:
            self.outcome.timed_out = True
            self._client_close()
        else:
            self.at(self._client_heard + CLIENT_TIMEOUT, self._client_timer)

    def _to_client(self, item: Item) -> None:
        if self._client_write_done:
            return  # after its end nothing more is written to it
        if isinstance(item, Chunk):
            if self._client_closed:
                return  # it closed its socket: the write fails, it reads nothing more
            self._client_heard = self.now
            self.outcome.client_got += item.data
            pieces = self._client_framer.feed(item.data)
            if any(piece.end_of_message for piece in pieces):  # never on an interim head
                self._client_complete()
            return
        self._client_write_done = True
        if isinstance(item, Reset):
            self.outcome.client_end = "rst"
            self._client_closed = True
            self._client_read_done = True  # the relay aborted its socket
            return
        self.outcome.client_end = "fin"
        for piece in self._client_framer.feed_eof():
            if piece.end_of_message:
                self._client_complete()
        self.at(self.now, self._client_close)

    def _client_complete(self) -> None:
        if not self.outcome.complete:
            self.outcome.complete = True
            self.at(self.now, self._client_close)

    # -- the server ------------------------------------------------------------------

    def _server_write(self, item: Item) -> None:
        if self._server_closed:
            return
        if isinstance(item, Chunk):
            self.outcome.answer_sent += item.data
        else:
            self._server_closed = True
            self._server_read_done = True
        self._feed(item)

    def _to_server(self, item: Item) -> None:
        if self._server_write_done:
            return
        if isinstance(item, Chunk):
            if self._server_closed:
                return
            self.outcome.server_got += item.data
            for piece in self._server_framer.feed(item.data):
                if piece.head is not None:
                    self._server_heads.append(piece.head)
                    self._server_generation += 1
                if piece.end_of_message and self._server_heads:
                    self._answer(self._server_heads[-1])
            return
        self._server_write_done = True
        if isinstance(item, Reset):
            self.outcome.server_end = "rst"
            self._server_closed = True  # the relay aborted its socket: nothing more out
            self._server_read_done = True
            self._server_generation += 1
            return
        self.outcome.server_end = "fin"
        # the client's FIN: what it writes still goes out, then its own FIN
        self.at(max(self.now, self._server_busy_until), self._server_fin)

    def _answer(self, head: Head) -> None:
        self.outcome.server_requests += 1
        start = max(self.now, self._server_busy_until)
        writes = self.exchange.answer(head)
        for index, data in enumerate(writes):
            write = _bind(self._server_write, Chunk(Direction.DOWNSTREAM, data))
            self.at(start + index * WRITE_GAP, write)
        self._server_busy_until = start + len(writes) * WRITE_GAP
        if not head.keep_alive:
            self.at(self._server_busy_until, self._server_fin)
        else:
            generation = self._server_generation
            self.at(
                self._server_busy_until + KEEPALIVE,
                lambda: self._server_idle(generation),
            )

    def _server_idle(self, generation: int) -> None:
        if generation == self._server_generation and not self._server_framer.in_head:
            self._server_fin()

    def _server_fin(self) -> None:
        self._server_write(Eof(Direction.DOWNSTREAM))


def _bind(write: Callable[[Item], None], item: Item) -> Callable[[], None]:
    return lambda: write(item)


def converse(pipeline: Pipeline, exchange: Exchange, horizon: float = 3600.0) -> Outcome:
    """Play `exchange` through the bound `pipeline` (see the module docstring)."""
    return Conversation(pipeline, exchange, horizon).run()
