"""The per-connection relay: the thin trio shell around a pure fault pipeline.

Two sockets (client, upstream), read by the process's read hub (shell/hub.py) and
written at once or, when a socket would block, when the hub sees it writable again; the
pipeline is woken at its deadline by the hub's deadline heap. Every pipeline call happens
synchronously between awaits, so the pipeline is only ever driven by one piece of code at
a time and its faults need no locks (the design's "one driver"). Only without an fd for
the hub's epoll (EMFILE under a flood) does a connection fall back to a reader task per
socket, writer tasks and a timer task, in a nursery; they call the same methods the hub's
callbacks do.

The hot path is the anchors' fastest trio variant (shared/reference/
performance-anchors.md): raw non-blocking sockets, `recv`/`send` tried first, and bytes
written straight from the read's callback when the outbox is empty, so a relayed frame
costs no task wake-up of its own. A read shorter than the buffer means the socket is
drained, so the reader stops at once instead of paying a second `recv` that fails with
EAGAIN (nginx's `ngx_unix_recv` clears `rev->ready` on a short read for the same reason).
With an empty pipeline, whose `on_item` is the identity and which never pauses reading or
sets a deadline, a chunk read goes straight to the other side's outbox without being
wrapped in an item and routed, while ends still go through the pipeline.

The proxy's own nginx behaviour (header timeout, read timeout, faults/_proxy) is pure stages
in the pipeline like any fault; the relay reads two flags of theirs (`ProxyStage`): a stage
that has `finished` is dropped from the pipeline, so a connection whose path is otherwise
empty moves to the pass-through path once its request head is in, and one that has
`connection_closed` ends the connection once the relay's writes are out, without waiting for
the peers' FINs (nginx's `close()` of both sockets).

Ends are faithful: a FIN read is passed on as a FIN (`shutdown(SHUT_WR)`) and never
invented; an RST is sent as `SO_LINGER(1, 0)` then close (RFC 793's abort); a peer's
RST read on one side becomes a `Reset` item; a failed write means that peer is gone
and becomes a `Reset` travelling away from it.
"""

from __future__ import annotations

import math
import socket
import struct
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Protocol

import trio

from middlebox.core.fault import Fault, Pipeline
from middlebox.core.stream import Chunk, Direction, Eof, Item, Reset
from middlebox.observe.observer import RelayObserver
from middlebox.shell.hub import ReadHub, acquire_read_hub, release_read_hub

READ_SIZE = 64 * 1024
# Bytes queued toward one peer before we stop reading from the other: bounded memory
# per connection, and backpressure reaches the sender as TCP's window closing.
HIGH_WATER = 256 * 1024
# Reads in a row without waiting before we yield, so a bulk transfer cannot starve
# the other connections.
READS_BEFORE_YIELD = 16

_LINGER_ABORT = struct.pack("ii", 1, 0)
# What one read did: the socket is drained for now, another read may find more, or
# this side will read no more (FIN, RST, closed).
_DRAINED, _MORE, _OVER = 0, 1, 2


class ProxyStage(Protocol):
    """A stage of the proxy's own behaviour in the pipeline (faults/_proxy), as the relay
    sees it: two flags, read after pipeline calls (never per byte on the fast path)."""

    @property
    def finished(self) -> bool:
        """It passes everything through from now on and never wants a deadline."""
        ...

    @property
    def connection_closed(self) -> bool:
        """It ended the connection (FINs or RSTs both ways) and wants no more of it."""
        ...


_STAGE_ATTRIBUTES = ("finished", "connection_closed")
_IS_STAGE: dict[type, bool] = {}


def proxy_stages(faults: Sequence[Fault]) -> list[ProxyStage]:
    """The faults that are `ProxyStage`s, decided once per class: a runtime Protocol
    check (`isinstance` against a `runtime_checkable` Protocol) walks the protocol's
    attributes every time, about 50-80 µs per fault on this machine, for every
    connection; the attributes are the class's properties, so the class decides."""
    found: list[ProxyStage] = []
    for fault in faults:
        kind = type(fault)
        known = _IS_STAGE.get(kind)
        if known is None:
            known = _IS_STAGE[kind] = all(hasattr(kind, name) for name in _STAGE_ATTRIBUTES)
        if known:
            found.append(fault)  # type: ignore[arg-type]
    return found


@dataclass(eq=False)
class Side:
    """One socket of a connection. `source` is the direction of the items it produces."""

    leg: str
    sock: socket.socket
    source: Direction
    outbox: deque[bytes] = field(default_factory=deque)
    outbox_bytes: int = 0
    pending_end: Eof | Reset | None = None
    read_done: bool = False
    read_fin: bool = False  # what it sent ended with a FIN, not an RST
    write_done: bool = False
    closed: bool = False
    writer_lot: trio.lowlevel.ParkingLot = field(default_factory=trio.lowlevel.ParkingLot)


def arm_reset(sock: socket.socket) -> None:
    """Make the socket's close send an RST instead of a FIN (SO_LINGER, zero timeout)."""
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, _LINGER_ABORT)
    except OSError:
        pass  # already closed


def abort(sock: socket.socket) -> None:
    """Close with an RST instead of a FIN (SO_LINGER with a zero timeout)."""
    arm_reset(sock)
    trio.lowlevel.notify_closing(sock)
    sock.close()


def apply_buffer_sizes(
    client: socket.socket, upstream: socket.socket, sizes: dict[str, int]
) -> None:
    """Set the SO_RCVBUF/SO_SNDBUF sizes a fault asked for (see Fault.socket_buffers)."""
    options = {"rcvbuf": socket.SO_RCVBUF, "sndbuf": socket.SO_SNDBUF}
    for key, size in sizes.items():
        side, _, which = key.partition("_")
        sock = client if side == "client" else upstream
        sock.setsockopt(socket.SOL_SOCKET, options[which], size)


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
        client.setblocking(False)
        upstream.setblocking(False)
        self.client = Side("client", client, Direction.UPSTREAM)
        self.upstream = Side("upstream", upstream, Direction.DOWNSTREAM)
        self.pipeline = pipeline
        self.observer = observer
        self.clock = clock
        self._incoming: deque[Item] = deque()
        self._draining = False
        self._timer_scope: trio.CancelScope | None = None
        self._timer_started = False
        self._state_lot = trio.lowlevel.ParkingLot()
        self._done = trio.Event()
        self._nursery: trio.Nursery | None = None
        self._writers: set[str] = set()
        # The empty pipeline's fast path (module docstring): chunks skip the routing.
        self.passthrough = type(pipeline) is Pipeline and not pipeline.faults
        # The proxy's own stages still in the pipeline (see ProxyStage).
        self.stages = list(stages)
        self._hub: ReadHub | None = None
        self._hub_callbacks: dict[str, Callable[[], None]] = {}
        self._hub_paused: set[str] = set()
        # The hub's writable callbacks of the sides whose outbox waits for the socket.
        self._hub_writers: dict[str, Callable[[], None]] = {}
        # This relay's entry on the hub's deadline heap: its ticket and when it fires.
        self._timer_ticket: int | None = None
        self._timer_due: float | None = None
        self._failure: Exception | None = None

    def destination(self, direction: Direction) -> Side:
        return self.upstream if direction is Direction.UPSTREAM else self.client

    def origin(self, direction: Direction) -> Side:
        return self.client if direction is Direction.UPSTREAM else self.upstream

    async def run(self) -> None:
        try:
            try:
                self._hub = acquire_read_hub()
            except OSError:
                # No fd left for the hub's epoll (EMFILE under a flood): this connection
                # reads with a task per socket (and timer and writer tasks) instead.
                self._hub = None
            if self._hub is not None:
                # The hub reads, writes what a socket did not take whole when it can take
                # more, and wakes the pipeline at its deadline: this task only waits for
                # the end, so it needs no nursery (trio's nursery, its cancel scope and
                # its teardown were the largest part of a connection's setup). An error
                # in any of that comes back here through `_fail`, as a task's would.
                for side in (self.client, self.upstream):
                    callback = self._hub_callbacks[side.leg] = self._readable(side)
                    self._hub.register(side.sock, callback)
                self._dispatch(self.pipeline.on_open(self.clock()))
                self._after_pipeline_call()
                try:
                    await self._done.wait()
                except trio.Cancelled:
                    # One schedule point first, as a nursery's exit has: the hub reads
                    # what came with the cancel (an h2 session resets a stream's socket,
                    # then cancels its relay), so a peer's RST still goes on as an RST
                    # rather than the close below sending a FIN.
                    await trio.lowlevel.cancel_shielded_checkpoint()
                    raise
            else:
                async with trio.open_nursery() as nursery:
                    self._nursery = nursery
                    nursery.start_soon(self._read_loop, self.client)
                    nursery.start_soon(self._read_loop, self.upstream)
                    self._dispatch(self.pipeline.on_open(self.clock()))
                    self._after_pipeline_call()
                    await self._done.wait()
                    nursery.cancel_scope.cancel()
        finally:
            if self._timer_ticket is not None and self._hub is not None:
                self._hub.cancel(self._timer_ticket)
                self._timer_ticket = None
            for side in (self.client, self.upstream):
                self._leave_hub(side)
                self._unwatch_writable(side)
                if not side.closed:
                    side.closed = True
                    trio.lowlevel.notify_closing(side.sock)
                    side.sock.close()
            if self._hub is not None:
                release_read_hub(self._hub)
        if self._failure is not None:
            raise self._failure

    def inject(self, items: list[Item]) -> None:
        """Send items to the sockets past the pipeline: the proxy's own answer (nginx's
        504 on a read timeout), which no fault on the path delays or changes."""
        self._dispatch(items)
        self._wake_readers()
        self._check_done()

    def between_messages(self) -> bool:
        """An idle kept-alive connection, which graceful shutdown closes at once as nginx
        does: the path's framing says no message is under way, no fault of the path holds
        anything (none wants waking; the proxy's own stages' timers aside) and no outbox
        waits. An unframed (pass-through) connection cannot say: False."""
        framing = self.pipeline.framing if isinstance(self.pipeline, Pipeline) else None
        if framing is None or self.client.outbox or self.upstream.outbox:
            return False
        stages = {id(stage) for stage in self.stages}
        faults = self.pipeline.faults if isinstance(self.pipeline, Pipeline) else []
        held = any(f.deadline() is not None for f in faults if id(f) not in stages)
        return not held and framing.between_messages()

    # ------------------------------------------------------------------ reading

    def _reading_paused(self, side: Side) -> bool:
        if self.destination(side.source).outbox_bytes >= HIGH_WATER:
            return True
        return not self.passthrough and self.pipeline.reading_paused(side.source)

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
            self._ended(side, "rst")
            self._feed(Reset(side.source))
            return _OVER
        if not data:
            side.read_done = side.read_fin = True
            self._ended(side, "fin")
            self._feed(Eof(side.source))
            return _OVER
        if self.observer is not None:
            self.observer.read(side.leg, side.source, data, self.clock())
        if self.passthrough and not self._draining:
            # Exactly what the empty pipeline's on_item would hand _dispatch.
            peer = self.destination(side.source)
            if not peer.write_done and peer.pending_end is None:
                peer.outbox.append(data)
                peer.outbox_bytes += len(data)
                self._flush(peer)
        else:
            self._feed(Chunk(side.source, data))
        return _MORE if len(data) == READ_SIZE else _DRAINED

    async def _read_loop(self, side: Side) -> None:
        reads_in_a_row = 0
        drained = False
        while not side.read_done:
            if self._hub is not None:
                self._join_hub(side)  # the connection went pass-through: the hub reads now
                return
            if self._reading_paused(side):
                await self._state_lot.park()
                continue
            if drained:
                drained = False
                reads_in_a_row = 0
                try:
                    await trio.lowlevel.wait_readable(side.sock)
                except trio.ClosedResourceError:
                    return
                continue
            status = self._receive(side)
            if status == _OVER:
                return
            drained = status == _DRAINED
            reads_in_a_row += 1
            if reads_in_a_row >= READS_BEFORE_YIELD and not drained:
                reads_in_a_row = 0
                await trio.lowlevel.checkpoint()

    def _readable(self, side: Side) -> Callable[[], None]:
        """The hub's callback for `side`: read like `_read_loop`, without a task."""

        def readable() -> None:
            try:
                # At most READS_BEFORE_YIELD reads: level-triggered readiness brings
                # the hub back for the rest after the other sockets had their turn.
                for _ in range(READS_BEFORE_YIELD):
                    if side.read_done or side.closed:
                        self._leave_hub(side)
                        return
                    if self._reading_paused(side):
                        assert self._hub is not None
                        self._hub.pause(side.sock)
                        self._hub_paused.add(side.leg)
                        return
                    status = self._receive(side)
                    if status == _OVER:
                        self._leave_hub(side)
                        return
                    if status == _DRAINED:
                        return
            except Exception as error:  # a bug must fail this connection, not the hub
                self._fail(error)

        return readable

    def _fail(self, error: Exception) -> None:
        """An error in a hub callback: `run` raises it, after closing this relay only."""
        self._failure = error
        for each in (self.client, self.upstream):
            self._leave_hub(each)
            self._unwatch_writable(each)
        self._done.set()

    def _join_hub(self, side: Side) -> None:
        if side.read_done or side.closed or self._hub is None:
            return
        callback = self._hub_callbacks[side.leg] = self._readable(side)
        self._hub.register(side.sock, callback)
        if self._reading_paused(side):
            self._hub.pause(side.sock)
            self._hub_paused.add(side.leg)

    def _leave_hub(self, side: Side) -> None:
        callback = self._hub_callbacks.pop(side.leg, None)
        if callback is not None and self._hub is not None:
            self._hub.unregister(side.sock, callback)
        self._hub_paused.discard(side.leg)

    def _wake_readers(self) -> None:
        """Something changed that may unpause reading: wake parked reader tasks, and
        give paused hub sockets their readiness back."""
        self._state_lot.unpark_all()
        if self._hub_paused:
            for side in (self.client, self.upstream):
                if side.leg in self._hub_paused and not self._reading_paused(side):
                    self._hub_paused.discard(side.leg)
                    if side.leg in self._hub_callbacks and self._hub is not None:
                        self._hub.resume(side.sock)

    def _ended(self, side: Side, kind: str) -> None:
        if self.observer is not None:
            self.observer.ended(side.leg, side.source, f"read_{kind}", self.clock())

    # ------------------------------------------------------------ the pipeline

    def _feed(self, item: Item) -> None:
        """Hand one item to the pipeline; items that arrive while we dispatch wait in line."""
        self._incoming.append(item)
        if self._draining:
            return
        self._draining = True
        try:
            while self._incoming:
                self._dispatch(self.pipeline.on_item(self._incoming.popleft(), self.clock()))
        finally:
            self._draining = False
        self._after_pipeline_call()

    def _after_pipeline_call(self) -> None:
        if self.stages:
            self._drop_finished_stages()
        if self._hub is not None:
            if not self.passthrough:
                self._arm_hub_timer()
        elif self._timer_scope is not None:
            due = self.pipeline.deadline()
            self._timer_scope.deadline = math.inf if due is None else due
        elif (
            not self._timer_started
            and not self.passthrough
            and self._nursery is not None
            and self.pipeline.deadline() is not None
        ):
            self._timer_started = True
            self._nursery.start_soon(self._timer_loop)
        self._wake_readers()
        self._check_done()

    def _drop_finished_stages(self) -> None:
        """Take stages that have stepped aside out of the pipeline; with nothing left in
        it, relay the rest of the connection on the pass-through path (read hub)."""
        finished = [stage for stage in self.stages if stage.finished]
        if not finished or type(self.pipeline) is not Pipeline:
            return
        self.stages = [stage for stage in self.stages if not stage.finished]
        pipeline = self.pipeline
        gone = {id(stage) for stage in finished}
        pipeline.faults = [fault for fault in pipeline.faults if id(fault) not in gone]
        if pipeline.faults:
            return
        self.passthrough = True
        if self._hub is not None:
            return  # already read by the hub; a timer entry left fires and finds nothing
        try:
            self._hub = acquire_read_hub()
        except OSError:
            return  # no fd for the hub's epoll: the reader tasks carry on, still fast
        # Each reader task hands its socket to the hub when it next wakes up.
        self._state_lot.unpark_all()

    def _arm_hub_timer(self) -> None:
        """Put the pipeline's deadline on the hub's heap. An entry due no later stays:
        it fires early, finds the deadline moved and re-arms (see ReadHub)."""
        due = self.pipeline.deadline()
        if due is None or self._hub is None:
            return
        if self._timer_due is not None and self._timer_due <= due:
            return
        if self._timer_ticket is not None:
            self._hub.cancel(self._timer_ticket)
        self._timer_ticket = self._hub.schedule(due, self._on_hub_timer)
        self._timer_due = due

    def _on_hub_timer(self) -> None:
        """The hub's clock reached this relay's entry: what `_timer_loop` does on a wake."""
        self._timer_ticket = None
        self._timer_due = None
        if self._done.is_set():
            return
        try:
            due = self.pipeline.deadline()
            now = self.clock()
            if due is not None and due <= now:
                self._draining = True
                try:
                    self._dispatch(self.pipeline.on_deadline(now))
                    while self._incoming:
                        self._dispatch(
                            self.pipeline.on_item(self._incoming.popleft(), self.clock())
                        )
                finally:
                    self._draining = False
            self._after_pipeline_call()
        except Exception as error:  # a bug must fail this connection, not the hub
            self._fail(error)

    async def _timer_loop(self) -> None:
        while True:
            due = self.pipeline.deadline()
            with trio.CancelScope(deadline=math.inf if due is None else due) as scope:
                self._timer_scope = scope
                await trio.sleep_forever()
            self._timer_scope = None
            now = self.clock()
            self._draining = True
            try:
                self._dispatch(self.pipeline.on_deadline(now))
                while self._incoming:
                    self._dispatch(self.pipeline.on_item(self._incoming.popleft(), self.clock()))
            finally:
                self._draining = False
            self._after_pipeline_call()

    # ------------------------------------------------------------------ writing

    def _dispatch(self, items: list[Item]) -> None:
        for item in items:
            side = self.destination(item.direction)
            if side.write_done or side.pending_end is not None:
                if isinstance(item, Reset) and isinstance(side.pending_end, Eof):
                    # TCP sends an RST after a FIN (the peer that half-closed has now
                    # gone): it aborts what is still queued behind the FIN, if anything.
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
            self._flush(side)

    def _flush(self, side: Side) -> None:
        """Write what the socket takes now, without blocking; the hub (or the writer task)
        does the rest when the socket can take more."""
        sock = side.sock
        while side.outbox:
            data = side.outbox[0]
            try:
                sent = sock.send(data)
            except BlockingIOError:
                break
            except OSError:
                self._write_failed(side)
                return
            if self.observer is not None:
                self.observer.wrote(side.leg, side.source.opposite, data[:sent], self.clock())
            side.outbox_bytes -= sent
            if sent < len(data):
                side.outbox[0] = data[sent:]
                break
            side.outbox.popleft()
        if side.outbox:
            if side.leg in self._writers:
                side.writer_lot.unpark_all()
            elif self._nursery is not None:
                self._writers.add(side.leg)
                self._nursery.start_soon(self._write_loop, side)
            elif self._hub is not None:
                # The rest waits on the hub for the socket to take more (EPOLLOUT).
                self._writers.add(side.leg)
                callback = self._hub_writers[side.leg] = self._writable(side)
                self._hub.watch_writable(side.sock, callback)
            return
        if side.leg in self._hub_writers:
            self._unwatch_writable(side)
        if side.pending_end is not None:
            self._write_end(side, side.pending_end)

    def _writable(self, side: Side) -> Callable[[], None]:
        """The hub's callback for `side` taking more bytes: what `_write_loop` does on a
        wake, without a task."""

        def writable() -> None:
            try:
                if side.closed:
                    self._unwatch_writable(side)
                    return
                self._flush(side)
                self._wake_readers()
            except Exception as error:  # a bug must fail this connection, not the hub
                self._fail(error)

        return writable

    def _unwatch_writable(self, side: Side) -> None:
        callback = self._hub_writers.pop(side.leg, None)
        if callback is not None:
            self._writers.discard(side.leg)
            if self._hub is not None:
                self._hub.unwatch_writable(side.sock, callback)

    def _write_end(self, side: Side, end: Eof | Reset) -> None:
        side.write_done = True
        now = self.clock()
        if isinstance(end, Reset):
            if self.observer is not None:
                self.observer.ended(side.leg, end.direction, "sent_rst", now)
            side.read_done = True
            side.closed = True
            self._leave_hub(side)
            abort(side.sock)
            self._check_done()
            return
        if self.observer is not None:
            self.observer.ended(side.leg, end.direction, "sent_fin", now)
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
        if self.observer is not None:
            self.observer.ended(side.leg, side.source.opposite, "write_failed", self.clock())
        if not side.read_done:
            side.read_done = True
            self._feed(Reset(side.source))
        elif side.read_fin:
            side.read_fin = False
            # The peer half-closed earlier (its FIN went on) and has now gone altogether:
            # its kernel's RST travels on too, so the other peer stops sending to nobody
            # (nginx closes the upstream once a write to the client fails).
            self._feed(Reset(side.source))
        self._wake_readers()

    async def _write_loop(self, side: Side) -> None:
        while True:
            if not side.outbox or side.closed:
                await side.writer_lot.park()
                continue
            try:
                await trio.lowlevel.wait_writable(side.sock)
            except trio.ClosedResourceError:
                return
            self._flush(side)
            self._wake_readers()

    # ----------------------------------------------------------------- the end

    def _check_done(self) -> None:
        """Done when nothing more can move: both peers stopped sending to us, the
        pipeline holds nothing it will release, and every outbox is empty."""
        if self._done.is_set():
            return
        both_read = self.client.read_done and self.upstream.read_done
        if not both_read and not self._closed_by_a_stage():
            return
        if self.pipeline.deadline() is not None:
            return
        if self.client.outbox or self.upstream.outbox:
            return
        self._done.set()

    def _closed_by_a_stage(self) -> bool:
        """A stage closed the connection and both ends it sent are written."""
        return (
            bool(self.stages)
            and self.client.write_done
            and self.upstream.write_done
            and any(stage.connection_closed for stage in self.stages)
        )
