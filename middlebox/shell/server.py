"""The proxy server: accept, dial the upstream, build a fresh pipeline, relay (trio shell).

Each accepted connection gets an id, a seeded rng drawn from (scenario seed,
connection id) so a run replays from its seed, and a new pipeline built from the
scenario. One connection's error is logged and never stops the server.

The shell holds no fault logic: the proxy's own nginx behaviour is pure stages on the
virtual clock (faults/_proxy), which the composition root builds from the scenario's
`proxy:` block and hands the server as its config's `stages` (a `ProxyStages`):
- `client_header_timeout` (default 60 s, nginx's) closes a client whose first request head
  is late, unanswered (slowloris); it is counted in `header_timeouts` and journaled as the
  client side's `header_timeout` end;
- `read_timeout` (off by default; nginx's `proxy_read_timeout`) is the `idle_reaper` fault
  with the proxy's own ends: nginx's 504 before the response head, a close after it;
  counted in `read_timeouts`, journaled as the upstream side's `read_timeout` end;
- an unreachable upstream gets what a real proxy sends: nginx's `502 Bad Gateway` after
  reading the request head, or a reset or a close if the `proxy:` block says so; the
  stage is driven with the client alone (`answer_alone`).
Without `stages` the server is a bare relay (a test double): no timeouts, and an
unreachable upstream is a bare close.

Hardening of the shell itself (docs/reliability.md has every case and its result):
- `connect_timeout` bounds the dial to the upstream (nginx's proxy_connect_timeout).
- `max_connections`: connections beyond it are accepted and closed at once and
  counted in `connections_refused` (nginx closes when `worker_connections` run out).
- `shutdown(grace)`: stop accepting, let live connections finish within the grace
  period, then reset the rest (SO_LINGER 0), like a drain before a deploy.

TLS (docs/tls-http2.md) is a path of its own in front of the relay, so cleartext
HTTP/1.1 keeps its exact path: with `tls` (the CLI's --tls, or the scenario's `proxy: {tls:}`)
an accepted connection is handed to `handle_tls`, which completes the handshake and either
splices the decrypted HTTP/1.1 bytes to a loopback socket that `handle` relays like any
client (shell/tls.py), or, when ALPN picked `h2`, serves each HTTP/2 stream as one such
connection (shell/h2_streams.py). An `https://` upstream is dialled, wrapped in TLS
(verified unless `upstream_insecure`; `upstream_ca` adds a CA file) and spliced the same way.
"""

from __future__ import annotations

import contextlib
import errno
import functools
import gc
import hashlib
import ipaddress
import json
import logging
import math
import random
import signal
import socket
import ssl
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field, replace
from typing import Any, Protocol, runtime_checkable
from urllib.parse import urlsplit

import trio

from middlebox.core.fault import (
    ConnectionRandom,
    Fault,
    FaultContext,
    FaultReport,
    Pipeline,
    PipelineLayout,
    ProxyStage,
    proxy_stages,
)
from middlebox.core.h2_faults import H2Fault
from middlebox.core.scenario_state import SharedState
from middlebox.core.stream import Chunk, Direction, Eof, Item, Reset
from middlebox.observe.metrics import ServerCounters
from middlebox.observe.observer import RelayObserver
from middlebox.scenario.model import ProxyOptions, Scenario, TlsOptions
from middlebox.shell.h2_streams import H2Session, serve_h2
from middlebox.shell.hub import ReadHub, acquire_read_hub
from middlebox.shell.hub_connection import HubConnection, HubListener, accept_client
from middlebox.shell.live import LiveConnection
from middlebox.shell.relay import Relay
from middlebox.shell.sides import apply_buffer_sizes, arm_reset
from middlebox.shell.tls import (
    HANDSHAKE_TIMEOUT,
    handshake,
    loopback_pair,
    negotiated,
    server_context,
    splice,
    upstream_context,
)

log = logging.getLogger("middlebox.shell.server")

# One read of a client whose upstream is down; its head is at most nginx's 32 KiB.
MAX_REQUEST_HEAD = 64 * 1024
ACCEPT_ERROR_PAUSE = 0.5
# How often run_proxy calls `ProxyServer.tick` (an on-disk journal flushes at least this often).
TICK_INTERVAL = 1.0
# How often a graceful shutdown looks for connections that became idle (an answer ended).
SHUTDOWN_IDLE_CHECK = 0.05


# The largest TCP port (a 16-bit field).
MAX_PORT = 65535


@dataclass(frozen=True)
class Address:
    host: str
    port: int
    # An https:// URL: the proxy speaks TLS to it (shell/tls.py).
    tls: bool = False

    @classmethod
    def parse(cls, text: str, default_port: int = 80) -> Address:
        """`HOST:PORT`, `[::1]:PORT` or a URL such as `http://127.0.0.1:8000` or
        `https://api.example:8443` (port 443 by default)."""
        if "://" in text:
            parts = urlsplit(text)
            if parts.scheme not in ("http", "https"):
                raise ValueError(f"only http:// and https:// upstreams are supported, got {text!r}")
            tls = parts.scheme == "https"
            try:
                port = parts.port
            except ValueError:  # urlsplit refuses a port out of range or not a number
                raise ValueError(f"expected a port from 0 to {MAX_PORT}, got {text!r}") from None
            return cls(
                parts.hostname or "127.0.0.1",
                (443 if tls else default_port) if port is None else port,
                tls,
            )
        host, sep, digits = text.rpartition(":")
        if not sep or not (digits.isascii() and digits.isdigit()):
            raise ValueError(f"expected HOST:PORT, got {text!r}")
        # bind() would refuse it with a traceback, and the port field of a sockaddr is 16 bits:
        # a larger number must not reach code that keeps only its low bits.
        if int(digits) > MAX_PORT:
            raise ValueError(f"expected a port from 0 to {MAX_PORT}, got {text!r}")
        return cls(host.strip("[]") or "127.0.0.1", int(digits))

    def __str__(self) -> str:
        return f"[{self.host}]:{self.port}" if ":" in self.host else f"{self.host}:{self.port}"


# A numeric upstream's family and socket address, as `connect` takes them.
Dialled = tuple[socket.AddressFamily, tuple[str, int] | tuple[str, int, int, int]]


@functools.lru_cache(maxsize=64)
def numeric_sockaddr(address: Address) -> Dialled | None:
    """The family and socket address of a numeric host (an IPv4 or IPv6 literal without a
    scope), which needs no resolver call; None for a name. Kept per address: parsing the
    literal (`ipaddress`) cost about 3% of a connection, and a proxy dials one upstream."""
    try:
        ip = ipaddress.ip_address(address.host)
    except ValueError:
        return None
    if ip.version == 4:
        return socket.AF_INET, (address.host, address.port)
    return socket.AF_INET6, (address.host, address.port, 0, 0)


async def dial(address: Address) -> socket.socket:
    """Connect a non-blocking stdlib socket (the relay's raw-socket hot path needs one). A
    numeric upstream (the usual `127.0.0.1:8000`) is connected without `getaddrinfo`, as
    nginx does for an address it parsed as one (`ngx_parse_url`)."""
    numeric = numeric_sockaddr(address)
    if numeric is not None:
        infos: list[tuple[Any, ...]] = [(numeric[0], socket.SOCK_STREAM, 0, "", numeric[1])]
    else:
        infos = list(
            await trio.socket.getaddrinfo(address.host, address.port, type=socket.SOCK_STREAM)
        )
    error: OSError | None = None
    for family, kind, proto, _, sockaddr in infos:
        sock = socket.socket(family, kind, proto)
        sock.setblocking(False)
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        try:
            try:
                sock.connect(sockaddr)
            except BlockingIOError:
                # Waited on trio's epoll, not the read hub's: on the hub the wait takes a
                # second task switch (the hub wakes, then wakes this task) and two more
                # epoll_ctl calls; measured, a loopback dial took about 1.7x as long and
                # `loadc connect` through the proxy gained nothing.
                await trio.lowlevel.wait_writable(sock)
                code = sock.getsockopt(socket.SOL_SOCKET, socket.SO_ERROR)
                if code:
                    raise OSError(code, errno.errorcode.get(code, "connect failed")) from None
            return sock
        except BaseException as exc:
            trio.lowlevel.notify_closing(sock)
            sock.close()
            if not isinstance(exc, OSError):
                raise
            error = exc
    raise error or OSError(f"cannot resolve {address}")


def state_scope(scenario: str, index: int, fault: str, config: Any) -> str:
    """A fault position's name in a shared store: the same in every proxy that runs it."""
    options = json.dumps(config, sort_keys=True, default=repr).encode()
    return f"{scenario}/{index}.{fault}.{hashlib.sha256(options).hexdigest()[:12]}"


def relay_clock_offset() -> float:
    """Wall clock minus the relay's clock (trio's), for journals that write wall-clock
    times: observe depends on no event loop, so the shell, which owns the clock, says."""
    return time.time() - trio.current_time()


class ListenError(OSError):
    """A listener that did not open (a busy port, an address not on this machine), with
    which one it was: a proxy opens up to three (`role`: "listen", "control" or "ui", the
    options that ask for them), and bind(2)'s error alone does not say whose it was."""

    def __init__(self, role: str, address: Address, error: OSError) -> None:
        super().__init__(error.errno, error.strerror)
        self.role = role
        self.address = address


@contextlib.contextmanager
def listening_as(role: str, address: Address) -> Iterator[None]:
    """An OSError while opening the `role` listener on `address` becomes a ListenError."""
    try:
        yield
    except OSError as error:
        raise ListenError(role, address, error) from error


def listen(address: Address, backlog: int = 1024) -> socket.socket:
    """A listening socket; `backlog` is listen(2)'s queue of completed handshakes (the
    kernel caps it at net.core.somaxconn), nginx's `listen ... backlog=`."""
    family = socket.AF_INET6 if ":" in address.host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    with listening_as("listen", address):
        try:
            sock.bind((address.host, address.port))
        except OSError:
            sock.close()
            raise
    sock.listen(backlog)
    sock.setblocking(False)
    return sock


ObserverFactory = Callable[[int, Scenario], RelayObserver | None]
ReportSinkFactory = Callable[[int], Callable[[FaultReport], None] | None]


class ProxyStages(Protocol):
    """The proxy's own nginx behaviour as pure stages, built from a scenario's `proxy:`
    block by the composition root (middlebox/compose.py; the stages live in faults/_proxy)."""

    def around(self, options: ProxyOptions) -> tuple[list[Fault], list[Fault]]:
        """Fresh stages for one connection: those before the path (the client side, seeing
        the client's bytes as they arrive) and those after it (the upstream side)."""
        ...

    def unreachable(self, options: ProxyOptions) -> Fault:
        """A fresh stage that answers the client alone when the upstream cannot be reached."""
        ...


@runtime_checkable
class _Stage(ProxyStage, Protocol):
    """`ProxyStage`, checkable at run time: which faults of a pipeline are the proxy's own."""


@dataclass(frozen=True)
class ProxyConfig:
    """What a running proxy is built from, as opposed to what it counts and holds while it
    runs: built once by the caller's composition (`middlebox.run.serve.proxy_config`) and
    handed to `ProxyServer(config)`, or to every `--workers` process alike."""

    upstream: Address
    # The scenario new connections start with (the control API may swap the server's).
    scenario: Scenario
    build_faults: Callable[[Scenario], list[Fault]] = Scenario.build_faults
    # The proxy's own nginx behaviour (compose.PROXY_STAGES); None: a bare relay.
    stages: ProxyStages | None = None
    observer_factory: ObserverFactory | None = None
    report_sink_factory: ReportSinkFactory | None = None
    # Told each connection's id once its relay has ended (an on-disk journal writes it
    # out and forgets it), and ticked every `TICK_INTERVAL` by `run_proxy` (it flushes).
    connection_ended: Callable[[int], None] | None = None
    tick: Callable[[], None] | None = None
    # Overrides the scenario's `proxy.max_connections` (the CLI's --max-connections).
    max_connections: int | None = None
    # TLS toward the client, overriding the scenario's `proxy.tls` (the CLI's --tls).
    tls: TlsOptions | None = None
    # An https:// upstream's certificate check: off with --upstream-insecure; --upstream-ca
    # adds a CA file to the system's trust store.
    upstream_insecure: bool = False
    upstream_ca: str | None = None
    # Where cross-connection fault state lives (scope -> store; middlebox.shell.state):
    # None keeps it in this process, as dicts.
    shared_state: Callable[[str], SharedState] | None = None


@dataclass
class ProxyServer(ServerCounters):
    """Accepts clients on a listener and relays each through the scenario to the upstream.

    `config` is all it is given; every other field is what it counts (`ServerCounters`,
    outside its constructor) and holds as it runs."""

    config: ProxyConfig
    # The scenario for new connections: the config's, until `set_scenario` swaps it.
    scenario: Scenario = field(init=False)
    shared: list[SharedState] = field(default_factory=list)
    live: set[LiveConnection] = field(default_factory=set, init=False, repr=False)
    _observers: dict[int, RelayObserver] = field(default_factory=dict, init=False, repr=False)
    _stage_shared: dict[str, SharedState] = field(default_factory=dict, init=False, repr=False)
    _accept_scope: trio.CancelScope | None = field(default=None, init=False, repr=False)
    _listener: socket.socket | None = field(default=None, init=False, repr=False)
    _hub_listener: HubListener | None = field(default=None, init=False, repr=False)
    _idle: trio.lowlevel.ParkingLot = field(
        default_factory=trio.lowlevel.ParkingLot, init=False, repr=False
    )
    _server_contexts: dict[TlsOptions, ssl.SSLContext] = field(
        default_factory=dict, init=False, repr=False
    )
    _upstream_context: ssl.SSLContext | None = field(default=None, init=False, repr=False)
    _h2_sessions: set[H2Session] = field(default_factory=set, init=False, repr=False)
    # The pipeline layout of the scenario it was worked out for (see make_pipeline).
    _layout_scenario: Scenario | None = field(default=None, init=False, repr=False)
    _layout: PipelineLayout | None = field(default=None, init=False, repr=False)

    def __post_init__(self) -> None:
        self.set_scenario(self.config.scenario)

    # The config's parts that the connection code (dial, pipeline, journal) reads as the
    # server's own.
    @property
    def upstream(self) -> Address:
        return self.config.upstream

    @property
    def build_faults(self) -> Callable[[Scenario], list[Fault]]:
        return self.config.build_faults

    @property
    def stages(self) -> ProxyStages | None:
        return self.config.stages

    @property
    def observer_factory(self) -> ObserverFactory | None:
        return self.config.observer_factory

    @property
    def report_sink_factory(self) -> ReportSinkFactory | None:
        return self.config.report_sink_factory

    @property
    def connection_ended(self) -> Callable[[int], None] | None:
        return self.config.connection_ended

    @property
    def upstream_insecure(self) -> bool:
        return self.config.upstream_insecure

    @property
    def upstream_ca(self) -> str | None:
        return self.config.upstream_ca

    @property
    def shared_state(self) -> Callable[[str], SharedState] | None:
        return self.config.shared_state

    def set_scenario(self, scenario: Scenario) -> None:
        """Swap the scenario for new connections; live ones keep the pipeline they have."""
        self.scenario = scenario
        self.shared = self.new_shared(scenario)

    def new_shared(self, scenario: Scenario, only: int | None = None) -> list[SharedState]:
        """Fresh state for each fault position of `scenario` (or for position `only`).

        A store names a position by scenario, index, fault and options, so proxies running
        one scenario share it and an edited fault starts afresh."""
        store = self.config.shared_state
        if store is None:
            return [{} for _ in scenario.path]
        return [
            store(state_scope(scenario.name, index, spec.name, spec.config))
            for index, spec in enumerate(scenario.path)
            if only is None or index == only
        ]

    def connection_limit(self) -> int | None:
        if self.config.max_connections is not None:
            return self.config.max_connections
        return self.scenario.proxy.max_connections

    async def serve(
        self,
        listener: socket.socket,
        *,
        task_status: trio.TaskStatus[int] = trio.TASK_STATUS_IGNORED,
    ) -> None:
        """Accept until `stop_accepting()`, then return once every connection has ended."""
        try:
            async with trio.open_nursery() as nursery:
                await self._accept(listener, nursery, task_status)
                await self.wait_idle()  # the hub's connections (tasks end with the nursery)
        finally:
            for live in list(self.live):
                if live.on_hub:
                    live.stop()  # cancelled: as a handler task's relay, its sockets close

    async def _accept(
        self, listener: socket.socket, nursery: trio.Nursery, task_status: trio.TaskStatus[int]
    ) -> None:
        dial_on_hub = self._dials_on_hub()
        with trio.CancelScope() as accept_scope:
            self._accept_scope = accept_scope
            self._listener = listener
            task_status.started(listener.getsockname()[1])
            if dial_on_hub is not None:
                try:
                    hub = acquire_read_hub()
                except OSError:  # no fd for the hub's epoll: this task accepts
                    hub = None
                if hub is not None:
                    await self._accept_on_hub(hub, listener, nursery, dial_on_hub)
                    return
            family = listener.family  # taken once (`accept_client`)
            while True:
                try:
                    client = accept_client(listener, family)
                except BlockingIOError:
                    await trio.lowlevel.wait_readable(listener)
                    continue
                except OSError as error:
                    self.accept_failed(error)
                    await trio.sleep(ACCEPT_ERROR_PAUSE)
                    continue
                self._admit(client, nursery, dial_on_hub)

    async def _accept_on_hub(
        self, hub: ReadHub, listener: socket.socket, nursery: trio.Nursery, address: Dialled
    ) -> None:
        """The listener watched by the read hub (`HubListener`) until `stop_accepting`:
        connections are accepted in the hub's turns, beside the reads and connects of
        those already served there, with no task woken for them."""
        self._hub_listener = HubListener(
            hub,
            listener,
            lambda client: self._admit(client, nursery, address),
            self.accept_failed,
            ACCEPT_ERROR_PAUSE,
        )
        try:
            await trio.sleep_forever()
        finally:
            self._hub_listener.close()
            self._hub_listener = None

    def accept_failed(self, error: OSError) -> None:
        """EMFILE and friends: counted and logged once per pause, serving the others.
        nginx disables accepting for accept_mutex_delay (500 ms) on EMFILE/ENFILE; the
        connection waits in the backlog meanwhile."""
        self.accept_errors += 1
        log.warning("accept failed: %s; pausing accepts", error)

    def _admit(
        self, client: socket.socket, nursery: trio.Nursery, dial_on_hub: Dialled | None
    ) -> None:
        """An accepted client: refused over the connection limit, else counted and served
        on the hub or by a task."""
        limit = self.connection_limit()
        if limit is not None and self.active >= limit:
            # Over the limit: close at once, as nginx does when its
            # worker_connections run out; the count says how many.
            self.connections_refused += 1
            client.close()
            return
        self.connections_accepted += 1
        self.active += 1  # counted here, so a flood cannot outrun the limit
        tls = self.config.tls or self.scenario.proxy.tls
        if tls is not None:
            nursery.start_soon(self.handle_tls, client, self.connections_accepted, tls)
        elif dial_on_hub is None or not self._serve_on_hub(
            client, self.connections_accepted, dial_on_hub, nursery
        ):
            nursery.start_soon(self.handle, client, self.connections_accepted)

    def _dials_on_hub(self) -> Dialled | None:
        """The upstream's address when plain connections can be served on the read hub with
        no task (shell/hub_connection.py): a plain numeric upstream, and a server class
        that does not handle connections its own way (a worker's numbering, the control
        API's scenario header); None where a task handles each one."""
        own = type(self).handle is not ProxyServer.handle
        own = own or type(self)._handle is not ProxyServer._handle
        if own or self.upstream.tls:
            return None
        return numeric_sockaddr(self.upstream)

    def _serve_on_hub(
        self,
        client: socket.socket,
        connection_id: int,
        address: Dialled,
        refusals: trio.Nursery,
    ) -> bool:
        try:
            hub = acquire_read_hub()
        except OSError:  # no fd for the hub's epoll (EMFILE): a task, whose relay reads
            return False
        connection = HubConnection(self, client, connection_id, self.scenario, hub, refusals)
        self.live.add(connection.live)
        try:
            connection.dial(*address)
        except Exception:  # as the handler task's: this connection fails, the server serves
            log.exception("connection %d failed", connection_id)
            connection.stop()
        return True

    def stop_accepting(self) -> None:
        """Close the listener: new connections are refused by the kernel from now on, and
        HTTP/2 connections get a GOAWAY (their streams in flight may finish)."""
        for session in list(self._h2_sessions):
            session.drain()
        if self._accept_scope is not None:
            self._accept_scope.cancel()
        if self._hub_listener is not None:
            self._hub_listener.close()  # off the hub's epoll before its fd is closed
        if self._listener is not None:
            listener, self._listener = self._listener, None
            trio.lowlevel.notify_closing(listener)
            listener.close()

    async def wait_idle(self) -> None:
        while self.active:
            await self._idle.park()

    def reset_all(self) -> int:
        """Abort every live connection with an RST on both sides; returns how many."""
        live = list(self.live)
        for connection in live:
            connection.reset()
        return len(live)

    def close_idle(self) -> int:
        """Close every live connection that is between messages with a FIN; how many."""
        closed = sum(connection.close_if_idle() for connection in list(self.live))
        self.closed_idle_at_shutdown += closed
        return closed

    async def shutdown(self, grace: float) -> None:
        """Stop accepting, close idle kept-alive connections at once and the others as
        their exchange ends (nginx's graceful shutdown), within `grace` seconds; reset
        the rest. An unframed (pass-through) connection cannot tell: it has the grace."""
        self.stop_accepting()
        with trio.move_on_after(grace):
            while self.active:
                self.close_idle()
                with trio.move_on_after(SHUTDOWN_IDLE_CHECK):
                    await self.wait_idle()
        if self.active:
            self.reset_at_shutdown += self.reset_all()
            log.info("shutdown: reset %d connections after %.1fs", self.reset_at_shutdown, grace)
            with trio.move_on_after(5):
                await self.wait_idle()

    async def handle(self, client: socket.socket, connection_id: int) -> None:
        scenario = self.scenario
        scope = trio.CancelScope()
        live = LiveConnection(scope.cancel, [client])
        self.live.add(live)
        try:
            with scope:
                if self.upstream.tls:  # the splice to the upstream's TLS runs beside the relay
                    async with trio.open_nursery() as helpers:
                        await self._handle(client, connection_id, scenario, live, helpers)
                else:
                    await self._handle(client, connection_id, scenario, live)
        except Exception:
            log.exception("connection %d failed", connection_id)
        finally:
            self.connection_closed(live)
            if client.fileno() != -1:  # the relay closes it; a refusal leaves it open
                trio.lowlevel.notify_closing(client)
                client.close()

    async def _handle(
        self,
        client: socket.socket,
        connection_id: int,
        scenario: Scenario,
        live: LiveConnection,
        helpers: trio.Nursery | None = None,
    ) -> None:
        options = scenario.proxy
        client.setblocking(False)
        client.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        try:
            # A bare cancel scope rather than `trio.fail_after` (a generator-based context
            # manager around one): the same deadline, a few dozen µs less per connection.
            deadline = trio.current_time() + options.connect_timeout
            with trio.CancelScope(deadline=deadline) as dialling:
                if helpers is None:
                    upstream = await dial(self.upstream)
                else:
                    upstream = await self.dial_tls_upstream(helpers)
            if dialling.cancelled_caught:
                raise trio.TooSlowError  # nginx's proxy_connect_timeout ran out
        except (OSError, trio.TooSlowError, trio.BrokenResourceError) as error:
            self.upstream_unreachable(connection_id, error)
            await self.refuse(client, scenario, connection_id)
            return
        try:
            relay = self.new_relay(client, upstream, connection_id, scenario, live)
            try:
                await relay.run()
            finally:
                relay.pipeline.release()
        finally:
            if helpers is not None and upstream.fileno() != -1:
                upstream.close()  # the relay never ran: end the splice behind it too
            self.relay_ended(connection_id)

    def new_relay(
        self,
        client: socket.socket,
        upstream: socket.socket,
        connection_id: int,
        scenario: Scenario,
        live: LiveConnection,
    ) -> Relay:
        """The relay of a dialled connection, its pipeline and observer made (`relay_ended`
        lets go of them, whether or not this returned)."""
        live.sockets.append(upstream)
        observer = self.observer_factory(connection_id, scenario) if self.observer_factory else None
        if observer is not None:
            self._observers[connection_id] = observer
        pipeline = self.make_pipeline(scenario, connection_id)
        if pipeline.reads_client_mss():
            pipeline.set_client_mss(client_mss(client))
        apply_buffer_sizes(client, upstream, pipeline.socket_buffers())
        stages = proxy_stages(pipeline.faults)
        live.relay = Relay(client, upstream, pipeline, observer=observer, stages=stages)
        return live.relay

    def relay_ended(self, connection_id: int) -> None:
        observer = self._observers.pop(connection_id, None)
        if self.connection_ended is not None and observer is not None:
            self.connection_ended(connection_id)

    def upstream_unreachable(self, connection_id: int, error: BaseException) -> None:
        self.connections_failed += 1
        log.info("connection %d: upstream %s unreachable: %s", connection_id, self.upstream, error)

    def connection_closed(self, live: LiveConnection) -> None:
        """A connection's end, counted (graceful shutdown waits for `active` to reach 0)."""
        self.live.discard(live)
        self.active -= 1
        self._idle.unpark_all()

    async def handle_tls(self, client: socket.socket, connection_id: int, tls: TlsOptions) -> None:
        """A TLS client: the handshake (bounded like nginx's, by the header timeout), then
        HTTP/1.1 spliced into `handle`, or HTTP/2 with one `handle` per stream."""
        handed_on = False
        try:
            client.setblocking(False)
            client.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            context = self.server_context(tls)
            limit = self.scenario.proxy.client_header_timeout or HANDSHAKE_TIMEOUT
            try:
                with trio.fail_after(limit):
                    stream = await handshake(client, context)
            except (trio.TooSlowError, trio.BrokenResourceError, OSError) as error:
                self.tls_handshake_failures += 1
                log.info("connection %d: TLS handshake failed: %s", connection_id, error)
                return
            if negotiated(stream) == "h2":
                # Its streams are live connections of their own; this one is what a
                # shutdown resets (and with it every stream still open).
                scope = trio.CancelScope()
                live = LiveConnection(scope.cancel, [client])
                self.live.add(live)
                try:
                    with scope:
                        # Only its HTTP/2 faults, bound alone: no framing is made (and left
                        # pending in the journal) for a connection that relays no bytes itself.
                        h2_faults = [
                            f for f in self.build_faults(self.scenario) if isinstance(f, H2Fault)
                        ]
                        rng = random.Random(f"{self.scenario.seed}:{connection_id}")
                        Pipeline(h2_faults).bind(FaultContext(connection_id, rng))
                        await serve_h2(
                            self.relay_stream,
                            stream,
                            connection_id,
                            self._h2_sessions,
                            h2_faults,
                            self.report_sink_factory,
                            self,
                        )
                finally:
                    self.live.discard(live)
                return
            relay_end, splice_end = loopback_pair()
            handed_on = True  # `handle` counts this connection down
            async with trio.open_nursery() as nursery:
                nursery.start_soon(splice, stream, splice_end)
                await self.handle(relay_end, connection_id)
        except Exception:
            log.exception("TLS connection %d failed", connection_id)
        finally:
            if not handed_on:
                self.active -= 1
                self._idle.unpark_all()
                if client.fileno() != -1:
                    client.close()

    def scenario_info(self) -> tuple[str, int]:
        return self.scenario.name, len(self.scenario.path)

    async def relay_stream(
        self, relay_end: socket.socket, told: Callable[[int], None] | None = None
    ) -> None:
        """One HTTP/2 stream's HTTP/1.1 connection (shell/h2_streams.py), relayed like any
        client: its own connection id (`told` it), pipeline, upstream connection and journal."""
        self.connections_accepted += 1
        self.active += 1
        if told is not None:
            told(self.connections_accepted)
        await self.handle(relay_end, self.connections_accepted)

    def server_context(self, tls: TlsOptions) -> ssl.SSLContext:
        """One client-facing context per TLS block (its certificate is issued once)."""
        context = self._server_contexts.get(tls)
        if context is None:
            context = self._server_contexts[tls] = server_context(tls)
        return context

    async def dial_tls_upstream(self, helpers: trio.Nursery) -> socket.socket:
        """Dial an https:// upstream, complete its handshake, and return the relay's end of
        a loopback pair whose other end a splice (run in `helpers`) carries to it."""
        if self._upstream_context is None:
            self._upstream_context = upstream_context(
                insecure=self.upstream_insecure, cafile=self.upstream_ca
            )
        sock = await dial(self.upstream)
        stream = await handshake(sock, self._upstream_context, server_hostname=self.upstream.host)
        relay_end, splice_end = loopback_pair()
        helpers.start_soon(splice, stream, splice_end)
        return relay_end

    def make_pipeline(self, scenario: Scenario, connection_id: int) -> Pipeline:
        """A fresh pipeline: the proxy's own stages around the scenario's faults. Its
        faults draw their rngs from (scenario seed, connection id)."""
        path = self.build_faults(scenario)
        sink = self.report_sink_factory(connection_id) if self.report_sink_factory else None
        shared = self.shared
        if self.stages is not None:
            client_side, upstream_side = self.stages.around(scenario.proxy)
            path = [*client_side, *path, *upstream_side]
            shared = [
                *(self._stage_state(s.name) for s in client_side),
                *shared,
                *(self._stage_state(s.name) for s in upstream_side),
            ]
            sink = self._counting_sink(connection_id, sink)
        pipeline = Pipeline(path)
        rng = ConnectionRandom(f"{scenario.seed}:{connection_id}")
        # The layout (framing shape, wiring) follows from the scenario's config alone:
        # worked out on its first connection and reused (a new scenario object, as every
        # edit makes, works it out again; `bind` checks that the classes still fit).
        known = self._layout if self._layout_scenario is scenario else None
        if known is None:
            known = PipelineLayout.of(path)
            if known.framing is not None:
                # The scenario's bounds on what the SSE framing holds (proxy.sse_max_*)
                framing = replace(known.framing, sse_limits=scenario.proxy.sse_limits)
                known = replace(known, framing=framing)
            self._layout_scenario, self._layout = scenario, known
        pipeline.bind(FaultContext(connection_id, rng, sink), shared, known)
        return pipeline

    def _stage_state(self, name: str) -> SharedState:
        if name not in self._stage_shared:
            self._stage_shared[name] = (
                {} if self.shared_state is None else self.shared_state(f"proxy/{name}")
            )
        return self._stage_shared[name]

    def _counting_sink(
        self, connection_id: int, inner: Callable[[FaultReport], None] | None
    ) -> Callable[[FaultReport], None]:
        """Reports pass on; a report of one of the proxy's own stages is also counted and
        journaled as how that side of the connection ended."""

        def sink(report: FaultReport) -> None:
            event = report.stage_event
            if event is not None:
                self.count_stage(event)
                observer = self._observers.get(connection_id)
                if observer is not None:
                    observer.ended(event.leg, event.direction, event.end, report.time)
            if inner is not None:
                inner(report)

        return sink

    async def refuse(self, client: socket.socket, scenario: Scenario, connection_id: int) -> None:
        """Answer like a proxy whose upstream is down: the `unreachable` stage decides
        (nginx's 502 after the head, its 400s, an RST or a close); without stages, a close."""
        if self.stages is None:
            try:
                client.shutdown(socket.SHUT_WR)
            except OSError:
                pass
            return
        stage = self.stages.unreachable(scenario.proxy)
        rng = random.Random(f"{scenario.seed}:{connection_id}")
        stage.bind(FaultContext(connection_id, rng))
        await answer_alone(client, stage)


def client_mss(client: socket.socket) -> int | None:
    """The path MSS toward the client (TCP_MAXSEG), for `segment: auto` faults."""
    try:
        return int(client.getsockopt(socket.IPPROTO_TCP, socket.TCP_MAXSEG))
    except (OSError, AttributeError):
        return None


async def answer_alone(client: socket.socket, stage: Fault) -> None:
    """Drive `stage` with the client's side alone (there is no upstream), through a
    `Pipeline` as a relay drives its path: what it sends toward the client is written,
    its wake time bounds the wait for the client, and its first end (a FIN or an RST)
    ends the connection (the caller closes the socket; an RST is armed here)."""
    pipeline = Pipeline([stage])  # bound already: routing is all
    effects = pipeline.open(trio.current_time())
    while True:
        for item in effects.items:
            if item.direction is not Direction.DOWNSTREAM:
                continue  # nothing can reach an upstream that is not there
            if isinstance(item, Chunk):
                await send_all(client, item.data)
            elif isinstance(item, Eof):
                try:
                    client.shutdown(socket.SHUT_WR)
                except OSError:
                    pass
                return
            else:
                arm_reset(client)
                return
        received: Item | None = None
        with trio.move_on_at(math.inf if effects.wake is None else effects.wake):
            received = await receive_item(client)
        now = trio.current_time()
        effects = pipeline.wake(now) if received is None else pipeline.feed(received, now)
        if received is not None and not isinstance(received, Chunk) and not effects.items:
            return  # the client ended and the stage has nothing to say


async def receive_item(sock: socket.socket) -> Item:
    """The client's next bytes as an item: a chunk, its FIN (`Eof`) or its RST (`Reset`)."""
    while True:
        try:
            data = sock.recv(MAX_REQUEST_HEAD)
        except BlockingIOError:
            await trio.lowlevel.wait_readable(sock)
            continue
        except OSError:
            return Reset(Direction.UPSTREAM)
        return Chunk(Direction.UPSTREAM, data) if data else Eof(Direction.UPSTREAM)


async def send_all(sock: socket.socket, data: bytes) -> None:
    view = memoryview(data)
    while view:
        try:
            sent = sock.send(view)
        except BlockingIOError:
            await trio.lowlevel.wait_writable(sock)
            continue
        except OSError:
            return
        view = view[sent:]


async def _ticking(tick: Callable[[], None]) -> None:
    while True:
        await trio.sleep(TICK_INTERVAL)
        tick()


async def run_proxy(
    listen_address: Address,
    server: ProxyServer,
    *,
    ready: Callable[[int], None] | None = None,
    grace: float = 10.0,
    backlog: int = 1024,
    listener: socket.socket | None = None,
) -> ProxyServer:
    """Serve until SIGTERM or SIGINT, then shut down gracefully and return the server.

    The first signal stops accepting and gives live connections `grace` seconds to
    finish before they are reset; a second signal resets them at once. `ready(port)` is
    called once listening. The caller writes journals and reports from the server.
    `listener` serves an already listening socket instead (a `--workers` process's)."""
    listener = listener or listen(listen_address, backlog)
    try:
        with trio.open_signal_receiver(signal.SIGTERM, signal.SIGINT) as signals:
            async with trio.open_nursery() as nursery:
                port = await nursery.start(server.serve, listener)
                freeze_startup_heap()
                if server.config.tick is not None:
                    nursery.start_soon(_ticking, server.config.tick)
                if ready is not None:
                    ready(port)
                async for signum in signals:
                    log.info("signal %s: draining for %.1fs", signal.Signals(signum).name, grace)
                    break

                async def reset_on_second_signal() -> None:
                    async for _ in signals:
                        server.reset_at_shutdown += server.reset_all()

                nursery.start_soon(reset_on_second_signal)
                await server.shutdown(grace)
                nursery.cancel_scope.cancel()
    finally:
        gc.unfreeze()
        listener.close()
    return server


def freeze_startup_heap() -> None:
    """What exists once the proxy listens (modules, the scenario, the composition, the
    console) lives as long as the process: frozen (`gc.freeze`), the collector's full
    passes skip it and scan only what connections made, so a full pass pauses the relays
    for half as long (docs/performance.md, "The startup heap frozen")."""
    gc.collect()  # what is garbage now is freed, not frozen
    gc.freeze()
