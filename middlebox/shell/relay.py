"""The per-connection relay: the thin trio shell around a pure fault pipeline.

Two raw non-blocking sockets (client, upstream), read by the process's read hub
(shell/hub.py), written at once or when the hub sees a socket writable again; the hub's
deadline heap wakes the pipeline. Each pipeline call (`Pipeline.open`, `feed`, `wake`)
answers with its `Effects`, and one `apply` does them. Calls happen synchronously, so one
piece of code drives the pipeline at a time and its faults need no locks (the design's
"one driver"). `run` waits for the end in its caller's task; `start_on_hub` needs no task
(shell/hub_connection.py). Only without an fd for the hub's epoll (EMFILE) does a relay
fall back to a task per socket and a timer task, calling the same methods.

`recv`/`send` are tried first, and a read shorter than the buffer is a drained socket
(nginx's `ngx_unix_recv` clears `rev->ready` on a short read). With an empty pipeline a
read is sent from the read's callback, unrouted. A pipeline call's writes inside the hub's
turn go out at the turn's end with other sockets' (`ReadHub.write_soon`): a peer reading
many of the proxy's sockets is woken once for several writes.

Ends are faithful: a FIN read is passed on as a FIN (`shutdown(SHUT_WR)`) and never
invented; an RST is sent as `SO_LINGER(1, 0)` then close (RFC 793's abort); a peer's RST
read becomes a `Reset` item; a failed write means that peer is gone and becomes a `Reset`
travelling away from it. A stage that ended the connection (`Effects.ended`) closes it once
the writes are out, without waiting for the peers' FINs (nginx's `close()`).
"""

from __future__ import annotations

import math
import socket
from collections import deque
from collections.abc import Callable, Sequence

import trio

from middlebox.core.fault import Effects, Fault, Pipeline, ProxyStage
from middlebox.core.stream import Chunk, Direction, Eof, Item, Reset
from middlebox.observe.observer import RelayObserver
from middlebox.shell.hub import ReadHub, acquire_read_hub, release_read_hub
from middlebox.shell.sides import UNPARKED, Side, abort

READ_SIZE = 128 * 1024  # what a default receive buffer holds (tcp_rmem): 64 KiB and a head
# Queued toward one peer before we stop reading the other: TCP's window is backpressure.
HIGH_WATER = 256 * 1024
# Reads in a row before yielding, so a bulk transfer cannot starve the other connections.
READS_BEFORE_YIELD = 16

# What reading did: drained for now, maybe more, no more (FIN, RST, closed), or paused.
_DRAINED, _MORE, _OVER, _PAUSED = 0, 1, 2, 3
_Callback = Callable[[], None]


class Relay:
    """Relays one connection through `pipeline` until both directions have ended."""

    def __init__(
        self,
        client: socket.socket,
        upstream: socket.socket,
        pipeline: Fault,
        *,
        observer: RelayObserver | None = None,
        clock: Callable[[], float] = trio.current_time,
        stages: Sequence[ProxyStage] = (),
    ) -> None:
        for sock in (client, upstream):  # the server's are already: no ioctl again
            if sock.getblocking():
                sock.setblocking(False)
        self.client = Side("client", client, Direction.UPSTREAM)
        self.upstream = Side("upstream", upstream, Direction.DOWNSTREAM)
        if not isinstance(pipeline, Pipeline):
            pipeline = Pipeline([pipeline])  # one fault, bound already: routing is all
        self.pipeline = pipeline
        pipeline.set_stages(stages)  # the proxy's own stages in it (see ProxyStage)
        self.observer = observer
        self.clock = clock
        self._incoming: deque[Item] = deque()
        self._draining = False
        self._wake: float | None = None  # the last Effects' wake; _paused, _ended the same
        self._paused: frozenset[Direction] = frozenset()
        self._ended = False
        self._timer_scope: trio.CancelScope | None = None
        self._timer_started = False
        self._state_lot = UNPARKED  # reader tasks' own, made by `run` if it needs them
        self._done: trio.Event | None = None  # what `run` waits for (see _finish)
        self.finished = False
        self._nursery: trio.Nursery | None = None
        self._writers: set[str] = set()
        self.passthrough = not pipeline.faults  # the empty pipeline's fast path (see above)
        self._hub: ReadHub | None = None
        self._hub_callbacks: dict[str, _Callback] = {}  # reading sides (_hub_writers: EPOLLOUT)
        self._hub_paused: set[str] = set()
        self._hub_writers: dict[str, _Callback] = {}
        self._timer_ticket: int | None = None
        self._timer_due: float | None = None  # with the ticket: its entry on the hub's heap
        self.failure: Exception | None = None
        self.on_done: Callable[[], None] | None = None  # see start_on_hub

    def destination(self, direction: Direction) -> Side:
        return self.upstream if direction is Direction.UPSTREAM else self.client

    async def run(self) -> None:
        try:
            try:
                hub: ReadHub | None = acquire_read_hub()
            except OSError:  # no fd for the hub's epoll (EMFILE): tasks read instead
                hub = None
            done = self._done = trio.Event()
            if hub is None:
                self._state_lot = trio.lowlevel.ParkingLot()
                for side in (self.client, self.upstream):
                    side.writer_lot = trio.lowlevel.ParkingLot()
                async with trio.open_nursery() as nursery:
                    self._nursery = nursery
                    nursery.start_soon(self._read_loop, self.client)
                    nursery.start_soon(self._read_loop, self.upstream)
                    self._run(self.pipeline.open(self.clock()))
                    await done.wait()
                    nursery.cancel_scope.cancel()
            else:
                self.start_on_hub(hub)
                try:
                    await done.wait()
                except trio.Cancelled:
                    # One schedule point first, as a nursery's exit has: the hub reads an RST
                    # that came with the cancel (an h2 session's reset), and passes it on.
                    await trio.lowlevel.cancel_shielded_checkpoint()
                    raise
        finally:
            self.close()
        if self.failure is not None:
            raise self.failure

    def start_on_hub(self, hub: ReadHub) -> None:
        """Relay on `hub` (acquired for it; `close` releases it) with no task of its own;
        `on_done` is called once nothing more can move (or `failure`): then `close`."""
        self._hub = hub
        for side in (self.client, self.upstream):
            self._join_hub(side)
        self._run(self.pipeline.open(self.clock()))

    def close(self) -> None:
        """Leave the hub and close both sockets (with an RST where one was armed)."""
        if self._timer_ticket is not None and self._hub is not None:
            self._hub.cancel(self._timer_ticket)
        for side in (self.client, self.upstream):
            self._leave_hub(side)
            self._unwatch_writable(side)
            side.write_later = None  # it holds this relay: no cycle left for the GC
            if not side.closed:
                side.closed = True
                if self._hub is None:  # no trio task waits on a socket the hub reads
                    trio.lowlevel.notify_closing(side.sock)
                side.sock.close()
        if self._hub is not None:
            release_read_hub(self._hub)
            self._hub = None

    def inject(self, items: list[Item]) -> None:
        """Write items past the pipeline: the proxy's own answer (nginx's 504), unfaulted."""
        self._write_items(items)
        self._wake_readers()
        self._check_done()

    def between_messages(self) -> bool:
        """Idle between messages (graceful shutdown closes it at once, as nginx does)."""
        outbox = self.client.outbox or self.upstream.outbox
        return not outbox and self.pipeline.between_messages()

    def _feed(self, item: Item) -> None:
        """One item to the pipeline; those that come while we apply (an RST) wait in line."""
        if self._draining:
            self._incoming.append(item)
        else:
            self._run(self.pipeline.feed(item, self.clock()))

    def _run(self, effects: Effects) -> None:
        """Apply a call's effects, then feed the items that came meanwhile, one call each."""
        self._draining = True
        try:
            self.apply(effects)
            while self._incoming:
                self.apply(self.pipeline.feed(self._incoming.popleft(), self.clock()))
        finally:
            self._draining = False
        self._wake_readers()
        self._check_done()

    def apply(self, effects: Effects) -> None:
        """Do what a pipeline call asked: its items, wake time, pauses; an empty path passes."""
        self._write_items(effects.items)
        self._paused = effects.paused
        self._ended = effects.ended
        due = self._wake = effects.wake
        if effects.passthrough and not self.passthrough:
            self.passthrough = True
            if self._hub is None:  # the reader tasks hand their sockets to the hub, if any
                try:
                    self._hub = acquire_read_hub()
                except OSError:
                    return  # no fd for the hub's epoll: the reader tasks carry on, still fast
                self._state_lot.unpark_all()
        elif self._hub is not None:
            if due is not None and not self.passthrough:
                self._arm_hub_timer(due)
        elif self._timer_scope is not None:
            self._timer_scope.deadline = math.inf if due is None else due
        elif not self._timer_started and due is not None and self._nursery is not None:
            self._timer_started = True
            self._nursery.start_soon(self._timer_loop)

    def _arm_hub_timer(self, due: float) -> None:
        """The pipeline's deadline on the hub's heap; an entry due no later stays (ReadHub)."""
        assert self._hub is not None
        if self._timer_due is not None and self._timer_due <= due:
            return
        if self._timer_ticket is not None:
            self._hub.cancel(self._timer_ticket)
        self._timer_ticket = self._hub.schedule(due, self._on_hub_timer)
        self._timer_due = due

    def _on_hub_timer(self) -> None:
        self._timer_ticket = None
        self._timer_due = None
        if not self.finished:
            try:
                self._run(self.pipeline.wake(self.clock()))
            except Exception as error:  # a bug must fail this connection, not the hub
                self._fail(error)

    async def _timer_loop(self) -> None:
        while True:
            due = self._wake
            with trio.CancelScope(deadline=math.inf if due is None else due) as scope:
                self._timer_scope = scope
                await trio.sleep_forever()
            self._timer_scope = None
            self._run(self.pipeline.wake(self.clock()))

    def _reading_paused(self, side: Side) -> bool:
        full = self.destination(side.source).outbox_bytes >= HIGH_WATER
        return full or (not self.passthrough and side.source in self._paused)

    def _read_some(self, side: Side) -> int:
        """Up to READS_BEFORE_YIELD reads: _DRAINED, _OVER, _PAUSED, or _MORE (read again)."""
        for _ in range(READS_BEFORE_YIELD):
            if side.read_done or side.closed:
                return _OVER
            if self._reading_paused(side):
                return _PAUSED
            status = self._receive(side)
            if status != _MORE:
                return status
        return _MORE

    def _receive(self, side: Side) -> int:
        """One `recv` and what it means; returns _DRAINED, _MORE or _OVER."""
        try:
            data = side.sock.recv(READ_SIZE)
        except BlockingIOError:
            return _DRAINED
        except OSError:
            if side.closed:
                return _OVER
            # ECONNRESET and friends: the peer aborted; pass an RST on.
            side.read_done = True
            self._ended_side(side, side.source, "read_rst")
            self._feed(Reset(side.source))
            return _OVER
        if not data:
            side.read_done = side.read_fin = True
            self._ended_side(side, side.source, "read_fin")
            self._feed(Eof(side.source))
            return _OVER
        if self.observer is not None:
            self.observer.read(side.leg, side.source, data, self.clock())
        if self.passthrough and not self._draining:
            # Exactly what the empty pipeline's on_item would hand _write_items.
            peer = self.destination(side.source)
            if not peer.write_done and peer.pending_end is None:
                peer.outbox.append(data)
                peer.outbox_bytes += len(data)
                self._flush(peer)
        else:
            self._feed(Chunk(side.source, data))
        # A read shorter than the buffer drained the socket (module docstring).
        return _MORE if len(data) == READ_SIZE else _DRAINED

    def _hub_readable(self, side: Side) -> None:
        """The hub's callback for `side`: what `_read_loop` does on a wake, without a task."""
        status = self._read_some(side)
        if status == _OVER:
            self._leave_hub(side)
        elif status == _PAUSED:
            self._pause_on_hub(side)

    def _pause_on_hub(self, side: Side) -> None:
        assert self._hub is not None
        self._hub.pause(side.sock)
        self._hub_paused.add(side.leg)

    async def _read_loop(self, side: Side) -> None:
        while True:
            if self._hub is not None:
                self._join_hub(side)  # the connection went pass-through: the hub reads now
                return
            status = self._read_some(side)
            if status == _OVER:
                return
            if status == _PAUSED:
                await self._state_lot.park()
            elif status == _DRAINED:
                try:
                    await trio.lowlevel.wait_readable(side.sock)
                except trio.ClosedResourceError:
                    return
            else:
                await trio.lowlevel.checkpoint()

    def _hub_callback(self, action: Callable[[Relay, Side], None], side: Side) -> _Callback:
        """`action(self, side)` as the hub calls it: a bug fails this connection, not the hub."""

        def callback() -> None:
            try:
                action(self, side)
            except Exception as error:
                self._fail(error)

        return callback

    def _fail(self, error: Exception) -> None:
        """An error in a hub callback: `run` raises it (or `failure` keeps it) after closing."""
        self.failure = error
        for each in (self.client, self.upstream):
            self._leave_hub(each)
            self._unwatch_writable(each)
        self._finish()

    def _join_hub(self, side: Side) -> None:
        if side.read_done or side.closed or self._hub is None:
            return
        callback = self._hub_callbacks[side.leg] = self._hub_callback(Relay._hub_readable, side)
        self._hub.register(side.sock, callback)
        if self._reading_paused(side):
            self._pause_on_hub(side)

    def _leave_hub(self, side: Side) -> None:
        callback = self._hub_callbacks.pop(side.leg, None)
        if callback is not None and self._hub is not None:
            self._hub.unregister(side.sock, callback)
        self._hub_paused.discard(side.leg)

    def _wake_readers(self) -> None:
        """Reading may resume: wake parked reader tasks, give paused hub sockets readiness back."""
        if self._state_lot:  # reader tasks parked (no hub); there are none on the hub's path
            self._state_lot.unpark_all()
        if self._hub_paused:
            for side in (self.client, self.upstream):
                if side.leg in self._hub_paused and not self._reading_paused(side):
                    self._hub_paused.discard(side.leg)
                    if side.leg in self._hub_callbacks and self._hub is not None:
                        self._hub.resume(side.sock)

    def _write_items(self, items: list[Item]) -> None:
        for item in items:
            side = self.destination(item.direction)
            if side.write_done or side.pending_end is not None:
                if isinstance(item, Reset) and isinstance(side.pending_end, Eof):
                    # An RST after a FIN (the half-closed peer has gone) aborts what is queued.
                    side.outbox.clear()
                    side.outbox_bytes = 0
                    if not side.closed:
                        self._write_end(side, item)
                continue  # nothing else can be written after an end; the item is dropped
            if isinstance(item, Chunk):
                if item.data:
                    side.outbox.append(item.data)
                    side.outbox_bytes += len(item.data)
            else:
                side.pending_end = item
            self._write_soon(side)

    def _write_soon(self, side: Side) -> None:
        """Flush `side` now, or at the end of the hub's turn with others' (`write_soon`)."""
        if side.write_pending:
            return
        if self._hub is not None and not self.passthrough:
            if side.write_later is None:
                side.write_later = self._hub_callback(Relay._writable, side)
            side.write_pending = self._hub.write_soon(side.write_later)
        if not side.write_pending:
            self._flush(side)

    def _flush(self, side: Side) -> None:
        """Write what the socket takes now; the hub (or the writer task) does the rest."""
        if not side.send_queued(self.observer, self.clock):
            self._write_failed(side)
            return
        if side.outbox:
            if side.leg in self._writers:
                side.writer_lot.unpark_all()
            elif self._nursery is not None:
                self._writers.add(side.leg)
                self._nursery.start_soon(self._write_loop, side)
            elif self._hub is not None:
                # The rest waits on the hub for the socket to take more (EPOLLOUT).
                self._writers.add(side.leg)
                callback = self._hub_writers[side.leg] = self._hub_callback(Relay._writable, side)
                self._hub.watch_writable(side.sock, callback)
            return
        if side.leg in self._hub_writers:
            self._unwatch_writable(side)
        if side.pending_end is not None:
            self._write_end(side, side.pending_end)

    def _writable(self, side: Side) -> None:
        """`side` can take more bytes (the hub's EPOLLOUT or the writer task's wait), or
        its writes waited for the end of the hub's turn (`_write_soon`)."""
        side.write_pending = False
        if side.closed or self.finished:
            self._unwatch_writable(side)
            return
        self._flush(side)
        self._wake_readers()
        self._check_done()

    async def _write_loop(self, side: Side) -> None:
        while True:
            if not side.outbox or side.closed:
                await side.writer_lot.park()
                continue
            try:
                await trio.lowlevel.wait_writable(side.sock)
            except trio.ClosedResourceError:
                return
            self._writable(side)

    def _unwatch_writable(self, side: Side) -> None:
        callback = self._hub_writers.pop(side.leg, None)
        if callback is not None:
            self._writers.discard(side.leg)
            if self._hub is not None:
                self._hub.unwatch_writable(side.sock, callback)

    def _write_end(self, side: Side, end: Eof | Reset) -> None:
        side.write_done = True
        if isinstance(end, Reset):
            self._ended_side(side, end.direction, "sent_rst")
            side.read_done = True
            side.closed = True
            self._leave_hub(side)
            abort(side.sock)
            self._check_done()
            return
        self._ended_side(side, end.direction, "sent_fin")
        try:
            side.sock.shutdown(socket.SHUT_WR)
        except OSError:
            pass
        self._check_done()

    def _write_failed(self, side: Side) -> None:
        """EPIPE/ECONNRESET on a write: that peer is gone, so an RST travels away from it."""
        side.write_done = True
        side.outbox.clear()
        side.outbox_bytes = 0
        self._unwatch_writable(side)
        self._ended_side(side, side.source.opposite, "write_failed")
        if not side.read_done:
            side.read_done = True
            self._feed(Reset(side.source))
        elif side.read_fin:
            side.read_fin = False
            # The peer half-closed earlier and has now gone: its RST travels on too, so the
            # other stops sending to nobody (nginx closes the upstream once a write fails).
            self._feed(Reset(side.source))
        self._wake_readers()

    def _ended_side(self, side: Side, direction: Direction, kind: str) -> None:
        if self.observer is not None:
            self.observer.ended(side.leg, direction, kind, self.clock())

    def _check_done(self) -> None:
        """Done when nothing more can move: both peers stopped sending (or a stage ended the
        connection and both its ends are written), no wake is due and no write waits."""
        if self.finished:
            return
        client, upstream = self.client, self.upstream
        if not (client.read_done and upstream.read_done) and not (
            self._ended and client.write_done and upstream.write_done
        ):
            return
        pending = client.outbox or upstream.outbox or client.write_pending or upstream.write_pending
        if self._wake is None and not pending:
            self._finish()

    def _finish(self) -> None:
        self.finished = True
        if self._done is not None:
            self._done.set()
        if self.on_done is not None:
            self.on_done()
