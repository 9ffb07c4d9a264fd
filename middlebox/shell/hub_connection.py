"""A plain connection served by the read hub from accept to close, with no task of its own.

A handler task per connection (trio's spawn, its cancel scopes, the dial's wait on trio's
epoll, the wake-up when the relay is done, the teardown) costs a connection more than the
rest of its setup, once the relay runs on the hub (shell/hub.py; docs/performance.md,
"Connection setup"). So the accept loop hands a plain client to a `HubConnection`,
which dials the upstream without blocking and waits for the connect on the hub's epoll
(nginx's `ngx_event_connect_peer`: a non-blocking connect, then the write event), bounds
it with a timer on the hub's heap (`proxy_connect_timeout`), then starts the relay on the
hub (`Relay.start_on_hub`) and closes it when the relay says it is done. The steps are
the handler task's (`ProxyServer.handle`), in the same order, with the same counts, logs
and journal; only a refusal (an unreachable upstream: nginx's 502) runs as a task, as it
waits on the client.

The listening socket is on the hub too (`HubListener`): clients are accepted in the hub's
turns, beside the reads and connects of those it already serves, as nginx's listening
socket is one more read event of its loop, rather than by a task that trio wakes (its
epoll re-armed, the task scheduled) for every few connections.

The server chooses this only for what it covers: a plain client, a plain numeric upstream
(a name needs the resolver, which waits), a server class that does not handle connections
its own way, and an fd for the hub's epoll.
"""

from __future__ import annotations

import errno
import logging
import socket
from collections.abc import Callable
from typing import Protocol

import trio

from middlebox.scenario.model import Scenario
from middlebox.shell.hub import ReadHub, release_read_hub
from middlebox.shell.live import LiveConnection
from middlebox.shell.relay import Relay

log = logging.getLogger("middlebox.shell.server")  # the handler task's logger: the same lines

# Clients accepted in one turn of the hub at most: a flood of connects waits for the next
# turn (the listener stays readable) rather than holding up the reads of those served.
ACCEPTS_PER_TURN = 64


class ConnectionHost(Protocol):
    """What a hub-served connection needs of its server (`ProxyServer`): the handler
    task's steps, shared with it."""

    def new_relay(
        self,
        client: socket.socket,
        upstream: socket.socket,
        connection_id: int,
        scenario: Scenario,
        live: LiveConnection,
    ) -> Relay: ...

    def relay_ended(self, connection_id: int) -> None: ...

    def upstream_unreachable(self, connection_id: int, error: BaseException) -> None: ...

    def connection_closed(self, live: LiveConnection) -> None: ...

    async def refuse(
        self, client: socket.socket, scenario: Scenario, connection_id: int
    ) -> None: ...


def accept_client(listener: socket.socket, family: socket.AddressFamily) -> socket.socket:
    """One client from `listener` (raises as `accept` does: BlockingIOError when none
    waits). socket.py's `accept` turns the listener's family and type into enums (two
    Enum calls a connection); the C accept and the family taken once make the same
    socket."""
    fd, _ = listener._accept()  # type: ignore[attr-defined]
    return socket.socket(family, socket.SOCK_STREAM, 0, fd)


def _ignored_after_close(_: object) -> None:
    """A closed listener's `admit` and `failed`: never called, as nothing is accepted
    after `close`; they hold no reference back to the listener's owner."""


def _closed_already() -> None:
    """A closed connection's `LiveConnection.stop`: nothing left to stop."""


class HubConnection:
    """One connection: dialling, then relaying (or refusing), then closed."""

    def __init__(
        self,
        server: ConnectionHost,
        client: socket.socket,
        connection_id: int,
        scenario: Scenario,
        hub: ReadHub,
        refusals: trio.Nursery,
    ) -> None:
        self.server = server
        self.client = client
        self.connection_id = connection_id
        self.scenario = scenario
        self.hub = hub
        self.refusals = refusals
        self.live = LiveConnection(self.stop, [client], on_hub=True)
        self.upstream: socket.socket | None = None
        self.relay: Relay | None = None
        self.closed = False
        # The hub was acquired for this connection: the relay releases it on close, or,
        # where there is none, `_let_go`.
        self._holding_hub = True
        self._relaying = False  # the server made (or tried to make) its relay
        self._connect_ticket: int | None = None
        # The dial's one bound method (the hub compares callbacks), let go of in `_closed`.
        self._on_connected: Callable[[], None] | None = None
        self._refusal: trio.CancelScope | None = None

    def dial(
        self, family: socket.AddressFamily, sockaddr: tuple[str, int] | tuple[str, int, int, int]
    ) -> None:
        """Connect to the upstream without blocking; the relay starts once it is connected."""
        client = self.client
        client.setblocking(False)
        client.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        try:
            upstream = self.upstream = socket.socket(family, socket.SOCK_STREAM)
            upstream.setblocking(False)
            upstream.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            upstream.connect(sockaddr)
        except BlockingIOError:
            # A loopback connect too comes back EINPROGRESS: the hub watches for the
            # write event, and its heap bounds the wait (nginx's proxy_connect_timeout).
            self._on_connected = self._connected
            self.hub.watch_writable(upstream, self._on_connected)
            due = trio.current_time() + self.scenario.proxy.connect_timeout
            self._connect_ticket = self.hub.schedule(due, self._connect_timed_out)
            return
        except OSError as error:
            self._unreachable(error)
            return
        self._start_relay()

    def _connected(self) -> None:
        upstream = self.upstream
        assert upstream is not None
        self._stop_dialling()
        code = upstream.getsockopt(socket.SOL_SOCKET, socket.SO_ERROR)
        if code:
            self._unreachable(OSError(code, errno.errorcode.get(code, "connect failed")))
        else:
            self._start_relay()

    def _connect_timed_out(self) -> None:
        self._connect_ticket = None
        self._stop_dialling()
        self._unreachable(trio.TooSlowError())

    def _stop_dialling(self) -> None:
        if self.upstream is not None and self._on_connected is not None:
            self.hub.unwatch_writable(self.upstream, self._on_connected)
        if self._connect_ticket is not None:
            self.hub.cancel(self._connect_ticket)
            self._connect_ticket = None

    def _unreachable(self, error: BaseException) -> None:
        """nginx's answer for an upstream it cannot reach, from a task: it waits on the
        client (`ProxyServer.refuse`)."""
        self.server.upstream_unreachable(self.connection_id, error)
        self._close_upstream()
        self._let_go()
        self.refusals.start_soon(self._refuse)

    async def _refuse(self) -> None:
        try:
            with trio.CancelScope() as self._refusal:
                if not self.closed:
                    await self.server.refuse(self.client, self.scenario, self.connection_id)
        except Exception:
            log.exception("connection %d failed", self.connection_id)
        finally:
            self._refusal = None
            self._closed()

    def _start_relay(self) -> None:
        assert self.upstream is not None
        self._relaying = True
        try:
            relay = self.server.new_relay(
                self.client, self.upstream, self.connection_id, self.scenario, self.live
            )
            relay.on_done = self._relay_done
            self.relay = relay
            relay.start_on_hub(self.hub)
        except Exception:
            log.exception("connection %d failed", self.connection_id)
            self.stop()

    def _relay_done(self) -> None:
        # Called from inside the relay's own callback: the close waits for the end of the
        # hub's turn (`after_turn`), as the handler task's close waits for its wake-up.
        self.hub.after_turn(self.stop)

    def stop(self) -> None:
        """Close now, whatever it is doing: the relay's end, or shutdown's idle close or
        reset (`LiveConnection.stop`); a refusal under way is cancelled and closes."""
        if self.closed:
            return
        if self._refusal is not None:
            self._refusal.cancel()  # its task closes the connection
            return
        relay = self.relay
        if relay is not None:
            relay.close()  # both sockets, and the hub it holds
            relay.pipeline.release()
            self._holding_hub = False
            if relay.failure is not None:
                log.error("connection %d failed", self.connection_id, exc_info=relay.failure)
        else:
            self._stop_dialling()
            self._close_upstream()
            self._let_go()
        if self._relaying:
            self.server.relay_ended(self.connection_id)
        self._closed()

    def _close_upstream(self) -> None:
        if self.upstream is not None and self.upstream.fileno() != -1:
            self.upstream.close()

    def _let_go(self) -> None:
        if self._holding_hub and self.relay is None:
            self._holding_hub = False
            release_read_hub(self.hub)

    def _closed(self) -> None:
        if self.closed:
            return
        self.closed = True
        # What refers back to this connection (its relay's callback, its live entry's
        # stop, its dial's bound method) lets go of it: its objects are freed when the
        # last reference goes, not by the cyclic collector (thousands a second).
        self._on_connected = None
        self.live.stop = _closed_already
        if self.relay is not None:
            self.relay.on_done = None
        if self.client.fileno() != -1:
            trio.lowlevel.notify_closing(self.client)  # a refusal's task may have waited on it
            self.client.close()
        self.server.connection_closed(self.live)


class HubListener:
    """A listening socket watched by the read hub: each turn it is readable accepts up to
    ACCEPTS_PER_TURN clients and hands each to `admit`. An accept that fails (EMFILE)
    is handed to `failed` and the listener is paused for `pause` seconds (nginx's
    accept_mutex_delay), the clients waiting in the backlog meanwhile. It holds the hub
    until `close`, which its owner calls before the listener is closed."""

    def __init__(
        self,
        hub: ReadHub,
        listener: socket.socket,
        admit: Callable[[socket.socket], None],
        failed: Callable[[OSError], None],
        pause: float,
    ) -> None:
        self.hub = hub
        self.listener = listener
        self.admit = admit
        self.failed = failed
        self.pause = pause
        self.family = listener.family  # taken once (`accept_client`)
        self.closed = False
        self._resume_ticket: int | None = None
        # The one bound method the hub holds (it compares callbacks by identity).
        self._on_readable: Callable[[], None] | None = self._ready
        hub.register(listener, self._on_readable)

    def _ready(self) -> None:
        listener, family = self.listener, self.family
        for _ in range(ACCEPTS_PER_TURN):
            if self.closed:
                return
            try:
                client = accept_client(listener, family)
            except BlockingIOError:
                return
            except OSError as error:
                self.failed(error)
                self.hub.pause(listener)
                due = trio.current_time() + self.pause
                self._resume_ticket = self.hub.schedule(due, self._resume)
                return
            try:
                self.admit(client)
            except Exception:  # a bug must fail this client, not the hub or the listener
                log.exception("accepted client failed")
                if client.fileno() != -1:
                    client.close()

    def _resume(self) -> None:
        self._resume_ticket = None
        if not self.closed:
            self.hub.resume(self.listener)

    def close(self) -> None:
        """Off the hub (the listener stays open: its owner closes it); the hub let go."""
        if self.closed:
            return
        self.closed = True
        if self._resume_ticket is not None:
            self.hub.cancel(self._resume_ticket)
            self._resume_ticket = None
        if self.listener.fileno() != -1 and self._on_readable is not None:
            self.hub.unregister(self.listener, self._on_readable)
        # What refers back to its owner (the server, through `admit`) is let go.
        self._on_readable = None
        self.admit = self.failed = _ignored_after_close
        release_read_hub(self.hub)
