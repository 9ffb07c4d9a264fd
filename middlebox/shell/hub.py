"""The read hub: readiness and deadlines for every relay of a trio run, in one task.

One `ReadHub` per trio run (started by the first relay that needs it, stopped by the last
one out) waits on its own epoll set: each relay's sockets are registered once,
level-triggered (no re-arm per read), and when sockets are readable the hub runs their
relays' callbacks synchronously in one task wake-up, the way an asyncio protocol or
nginx's event loop handles readiness; it halved the CPU per frame of a loaded
pass-through relay against a reader task per socket. Bytes a socket did not take whole
wait for EPOLLOUT on the same epoll set (nginx's write event); what a faulted relay writes
during a turn waits for the turn's end and goes out with the other sockets' writes
(`write_soon`), so a peer reading many sockets is woken once for several. A relay's next
deadline goes on the hub's one deadline heap (nginx's timer tree, with its lazy re-arm: a
deadline that only moves later keeps its entry), served by the same wait as readiness. So a
relay on the hub has no reader, writer or timer task or nursery of its own (trio's
nursery, cancel scope and teardown were the largest part of a connection's setup in a
profile under `loadc connect`), and a plain connection none at all: its connect, its
close and the listener that accepted it are on the hub too (shell/hub_connection.py).

The hub waits inside trio: its epoll fd is one of trio's. While sockets keep coming ready
it runs up to TURNS_PER_WAKE turns per wake-up, each a poll of its own set, before it
goes back to trio's wait; what must follow a turn whole (a connection's close, which may
not run inside its relay's callback) is queued for the turn's end (`after_turn`).
"""

from __future__ import annotations

import heapq
import math
import select
import socket
from collections.abc import Callable

import trio

# What wakes a reader and a writer on the hub: a hang-up or an error wakes both, so the
# read sees the FIN or RST and the write its EPIPE.
_READABLE_EVENTS = select.EPOLLIN | select.EPOLLHUP | select.EPOLLERR
_WRITABLE_EVENTS = select.EPOLLOUT | select.EPOLLHUP | select.EPOLLERR
# Turns the hub runs in one wake-up while sockets keep coming ready. A further turn costs
# one epoll_wait of the hub's own set; going back to trio costs the re-arm of the hub's fd
# in trio's epoll (a one-shot registration), trio's wait and a task switch: more than a
# tenth of a connection's CPU under a stream of new connections (docs/performance.md,
# "Connection setup"). The bound keeps trio's other tasks (a refusal, the control API)
# waiting a few turns at most.
TURNS_PER_WAKE = 4
# Sockets whose writes wait for the end of a turn before they go out together: enough to
# batch a busy turn's writes, few enough that the first waits at most a few callbacks.
WRITE_BATCH = 16


class ReadHub:
    """Readiness and deadlines for relays, one per trio run (see the module docstring).

    Sockets stay registered (EPOLLIN, level-triggered) while their relay reads them;
    a paused side is modified to no read events and back, so data left unread fires
    again. A socket that did not take a write whole is also watched for EPOLLOUT until
    its outbox is empty (`watch_writable`): the relay's writes wait on the hub like its
    reads, so a connection needs no writer task (and no nursery to hold one). Callbacks
    run inside the hub's task and must not raise (the relay catches and keeps its own
    errors). Unregister before closing a socket: the kernel forgets a closed fd by
    itself, but the fd number may be reused by the next socket.
    """

    def __init__(self) -> None:
        self.epoll = select.epoll()
        self.callbacks: dict[int, Callable[[], None]] = {}
        self.writable: dict[int, Callable[[], None]] = {}
        # The events each registered fd is watched for (absent: not registered).
        self.masks: dict[int, int] = {}
        self.users = 0
        self.scope = trio.CancelScope()
        # The process's one deadline heap: (due, ticket). An entry is live while its
        # ticket is in `tickets` (which holds the callback, so a cancelled entry keeps no
        # relay alive); a relay whose deadline moves later keeps its entry (it fires early
        # and re-arms, nginx's lazy timers), so a fault that pushes its deadline on every
        # read (idle_reaper) costs no heap push per read.
        self.timers: list[tuple[float, int]] = []
        self.tickets: dict[int, Callable[[], None]] = {}
        self.next_ticket = 0
        self.waiting: trio.CancelScope | None = None
        # Inside a turn (callbacks running), a relay's writes wait in `pending_writes`
        # (`write_soon`) and go out together at the turn's end, or every WRITE_BATCH.
        self.in_turn = False
        self.pending_writes: list[Callable[[], None]] = []
        # What waits for the end of the turn, after its writes (`after_turn`).
        self.turn_ends: list[Callable[[], None]] = []
        # Wake-ups from trio, and turns run in them (several while sockets keep coming
        # ready: TURNS_PER_WAKE).
        self.wakes = 0
        self.turns = 0

    def _watch(self, fd: int, mask: int) -> None:
        """Watch `fd` for `mask`; with no events and no reader left, forget it."""
        known = self.masks.get(fd)
        if mask == known:
            return
        keep = bool(mask) or fd in self.callbacks  # a paused reader stays, at no events
        try:
            if known is None:
                if not keep:
                    return
                self.epoll.register(fd, mask)
            elif keep:
                try:
                    self.epoll.modify(fd, mask)
                except FileNotFoundError:  # an old socket's number (see register)
                    self.epoll.register(fd, mask)
            else:
                self.epoll.unregister(fd)
        except (OSError, ValueError):
            pass  # closed under us: the kernel dropped it already
        if keep:
            self.masks[fd] = mask
        else:
            self.masks.pop(fd, None)

    def register(self, sock: socket.socket, callback: Callable[[], None]) -> None:
        fd = sock.fileno()
        self.callbacks[fd] = callback
        writing = self.writable.get(fd)
        mask = select.EPOLLIN | (select.EPOLLOUT if writing is not None else 0)
        # Always registered afresh, never trusted from `masks`: a socket closed without
        # unregistering (the kernel forgets it) leaves its fd's entries behind, and a
        # new socket may get that fd number.
        try:
            self.epoll.register(fd, mask)
        except FileExistsError:
            self.epoll.modify(fd, mask)
        self.masks[fd] = mask

    def unregister(self, sock: socket.socket, callback: Callable[[], None]) -> None:
        fd = sock.fileno()
        if fd >= 0 and self.callbacks.get(fd) is callback:
            del self.callbacks[fd]
            self._watch(fd, self.masks.get(fd, 0) & select.EPOLLOUT)

    def pause(self, sock: socket.socket) -> None:
        fd = sock.fileno()
        self._watch(fd, self.masks.get(fd, 0) & ~select.EPOLLIN)

    def resume(self, sock: socket.socket) -> None:
        fd = sock.fileno()
        self._watch(fd, self.masks.get(fd, 0) | select.EPOLLIN)

    def watch_writable(self, sock: socket.socket, callback: Callable[[], None]) -> None:
        """Call `callback` whenever `sock` can take more bytes, until `unwatch_writable`."""
        fd = sock.fileno()
        self.writable[fd] = callback
        self._watch(fd, self.masks.get(fd, 0) | select.EPOLLOUT)

    def unwatch_writable(self, sock: socket.socket, callback: Callable[[], None]) -> None:
        fd = sock.fileno()
        if fd >= 0 and self.writable.get(fd) is callback:
            del self.writable[fd]
            self._watch(fd, self.masks.get(fd, 0) & ~select.EPOLLOUT)

    def write_soon(self, callback: Callable[[], None]) -> bool:
        """Inside a turn, queue `callback` (a relay's flush) for the turn's end and answer
        True; outside one (a handler task, a control request), answer False: write now."""
        if not self.in_turn:
            return False
        self.pending_writes.append(callback)
        return True

    def after_turn(self, callback: Callable[[], None]) -> None:
        """Call `callback` once this turn's callbacks and writes are done, before the next
        turn or sleep (a connection's close, which must not run inside its relay's
        callback); outside a turn, on the next one."""
        if self.in_turn:
            self.turn_ends.append(callback)
        else:
            self.schedule(trio.current_time(), callback)

    def _write_pending(self) -> None:
        while self.pending_writes:
            pending, self.pending_writes = self.pending_writes, []
            for callback in pending:
                callback()

    def schedule(self, due: float, callback: Callable[[], None]) -> int:
        """Call `callback` (in the hub's task) once trio's clock reaches `due`; returns
        the ticket that `cancel` takes."""
        ticket = self.next_ticket
        self.next_ticket += 1
        self.tickets[ticket] = callback
        heapq.heappush(self.timers, (due, ticket))
        if self.waiting is not None and due < self.waiting.deadline:
            self.waiting.deadline = due  # the hub sleeps on a later one: wake it sooner
        return ticket

    def cancel(self, ticket: int) -> None:
        self.tickets.pop(ticket, None)
        # Short connections with long deadlines (a 60 s reaper, thousands of connections
        # a second) would fill the heap with dead entries: rebuild it once they are
        # most of it, which keeps the cost per cancel constant on average.
        if len(self.timers) > 64 and len(self.timers) > 2 * len(self.tickets):
            self.timers = [entry for entry in self.timers if entry[1] in self.tickets]
            heapq.heapify(self.timers)

    def _fire_due(self) -> None:
        timers, tickets = self.timers, self.tickets
        now = trio.current_time()
        due: list[Callable[[], None]] = []
        while timers and timers[0][0] <= now:
            _, ticket = heapq.heappop(timers)
            callback = tickets.pop(ticket, None)
            if callback is not None:
                due.append(callback)
        # Deadlines set by these callbacks wait for the next turn, and the hub yields to
        # trio after TURNS_PER_WAKE turns at most, so a fault that keeps asking for "now"
        # cannot starve the run.
        for callback in due:
            callback()

    def _earliest(self) -> float:
        timers, tickets = self.timers, self.tickets
        while timers and timers[0][1] not in tickets:
            heapq.heappop(timers)  # cancelled: dropped when it reaches the top
        return timers[0][0] if timers else math.inf

    def _serve(self) -> bool:
        """One turn (`_turn`), its pending writes, then what waits for its end; whether
        any socket was ready in it."""
        self.turns += 1
        self.in_turn = True
        try:
            ready = self._turn()
        finally:
            self.in_turn = False
        self._write_pending()
        if self.turn_ends:
            ends, self.turn_ends = self.turn_ends, []
            for callback in ends:
                callback()
        return ready

    def _turn(self) -> bool:
        """The due deadlines, then every ready socket's callbacks; the writes they make
        go out at the end, WRITE_BATCH sockets at a time (see `write_soon`). Whether
        any socket was ready."""
        if self.timers:
            self._fire_due()
        pending = self.pending_writes
        ready = self.epoll.poll(0, 1024)
        for fd, events in ready:
            if events & _WRITABLE_EVENTS:
                # Writes first: a drained outbox may unpause the other side.
                callback = self.writable.get(fd)
                if callback is not None:
                    callback()
            if events & _READABLE_EVENTS:
                callback = self.callbacks.get(fd)
                if callback is not None:
                    callback()
            if len(pending) >= WRITE_BATCH:
                self._write_pending()
                pending = self.pending_writes
        return bool(ready)

    async def run(self) -> None:
        try:
            with self.scope:
                while True:
                    # Sleep until a socket is readable or the earliest deadline, in one
                    # wait: readiness and timers are served by the same wake-up.
                    with trio.CancelScope(deadline=self._earliest()) as waiting:
                        self.waiting = waiting
                        await trio.lowlevel.wait_readable(self.epoll.fileno())
                    self.waiting = None
                    self.wakes += 1
                    for _ in range(TURNS_PER_WAKE):
                        if not self._serve():
                            break
        finally:
            self.waiting = None
            self.epoll.close()


_HUB: trio.lowlevel.RunVar[ReadHub | None] = trio.lowlevel.RunVar(
    "middlebox_read_hub", default=None
)


def acquire_read_hub() -> ReadHub:
    """This trio run's hub, started (as a system task) when the first relay needs it."""
    hub = _HUB.get()
    if hub is None:
        hub = ReadHub()
        _HUB.set(hub)
        trio.lowlevel.spawn_system_task(hub.run, name="middlebox.shell.hub.ReadHub")
    hub.users += 1
    return hub


def release_read_hub(hub: ReadHub) -> None:
    """The last relay out stops the hub and closes its epoll fd (no fd outlives use)."""
    hub.users -= 1
    if hub.users == 0:
        hub.scope.cancel()
        if _HUB.get() is hub:
            _HUB.set(None)
