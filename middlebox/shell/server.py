"""The proxy server: accept, dial the upstream, build a fresh pipeline, relay (trio shell).

Each accepted connection gets an id, a seeded rng drawn from (scenario seed,
connection id) so a run replays from its seed, and a new pipeline built from the
scenario. One connection's error is logged and never stops the server. When the
upstream cannot be reached, the client gets what a real proxy sends: nginx's
`502 Bad Gateway` after reading the request head (nginx reads the request before it
connects upstream), or a reset or a close if the scenario's `proxy:` block says so.

Hardening (docs/reliability.md has every case and its result), each shaped like nginx:
- `client_header_timeout` (default 60 s, nginx's default): a client that has not sent
  a complete first request head by then is closed without an answer, as nginx closes
  on a header timeout (it logs 408 and sends nothing). This bounds slowloris clients.
- `read_timeout` (off by default: middlebox is transparent unless told; nginx's
  `proxy_read_timeout` is 60 s): with a request outstanding and no byte from the
  upstream for that long, the client gets nginx's `504` if no response byte has come
  yet, or a closed connection mid-response, as nginx does.
- `max_connections`: connections beyond it are accepted and closed at once and
  counted in `connections_refused` (nginx closes when `worker_connections` run out).
- `shutdown(grace)`: stop accepting, let live connections finish within the grace
  period, then reset the rest (SO_LINGER 0), like a drain before a deploy.
"""

from __future__ import annotations

import errno
import logging
import math
import random
import signal
import socket
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import urlsplit

import trio

from middlebox.core.fault import Fault, FaultContext, FaultReport, Pipeline
from middlebox.core.http1 import Http1Exchange
from middlebox.core.responses import error_response
from middlebox.core.stream import Chunk, Direction, Eof, Reset
from middlebox.scenario.model import Scenario
from middlebox.shell.relay import Relay, RelayObserver, abort, apply_buffer_sizes, arm_reset

log = logging.getLogger("middlebox.shell.server")

MAX_REQUEST_HEAD = 64 * 1024
# nginx's large_client_header_buffers default (4 x 8k): a request head that does not fit
# is answered with 400 "Request Header Or Cookie Too Large" when nginx parses it.
NGINX_MAX_HEAD = 4 * 8 * 1024
NGINX_HEADER_LINE = 8 * 1024
# After answering by itself (a 504), how long the proxy waits for the client to close
# before closing for it: nginx's lingering_timeout default.
LINGER_AFTER_ANSWER = 5.0
ACCEPT_ERROR_PAUSE = 0.5

_TOO_LARGE_BODY = (
    b"<html>\r\n<head><title>400 Request Header Or Cookie Too Large</title></head>\r\n"
    b"<body>\r\n<center><h1>400 Bad Request</h1></center>\r\n"
    b"<center>Request Header Or Cookie Too Large</center>\r\n"
    b"<hr><center>nginx</center>\r\n</body>\r\n</html>\r\n"
)


@dataclass(frozen=True)
class Address:
    host: str
    port: int

    @classmethod
    def parse(cls, text: str, default_port: int = 80) -> Address:
        """`HOST:PORT`, `[::1]:PORT` or a URL such as `http://127.0.0.1:8000`."""
        if "://" in text:
            parts = urlsplit(text)
            if parts.scheme != "http":
                raise ValueError(f"only http:// upstreams are supported, got {text!r}")
            return cls(parts.hostname or "127.0.0.1", parts.port or default_port)
        host, sep, port = text.rpartition(":")
        if not sep or not port.isdigit():
            raise ValueError(f"expected HOST:PORT, got {text!r}")
        return cls(host.strip("[]") or "127.0.0.1", int(port))

    def __str__(self) -> str:
        return f"[{self.host}]:{self.port}" if ":" in self.host else f"{self.host}:{self.port}"


async def dial(address: Address) -> socket.socket:
    """Connect a non-blocking stdlib socket (the relay's raw-socket hot path needs one)."""
    infos = await trio.socket.getaddrinfo(address.host, address.port, type=socket.SOCK_STREAM)
    error: OSError | None = None
    for family, kind, proto, _, sockaddr in infos:
        sock = socket.socket(family, kind, proto)
        sock.setblocking(False)
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        try:
            try:
                sock.connect(sockaddr)
            except BlockingIOError:
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


def listen(address: Address, backlog: int = 1024) -> socket.socket:
    """A listening socket; `backlog` is listen(2)'s queue of completed handshakes (the
    kernel caps it at net.core.somaxconn), nginx's `listen ... backlog=`."""
    family = socket.AF_INET6 if ":" in address.host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind((address.host, address.port))
    sock.listen(backlog)
    sock.setblocking(False)
    return sock


ObserverFactory = Callable[[int, Scenario], RelayObserver | None]
ReportSinkFactory = Callable[[int], Callable[[FaultReport], None] | None]


class HeadWatch:
    """A relay observer that watches the client's bytes until the first request head
    ends (a blank line: CRLF CRLF, or bare LF LF as nginx also accepts), then hands the
    relay back its own observer, so a watched connection costs nothing afterwards."""

    def __init__(self, inner: RelayObserver | None) -> None:
        self.inner = inner
        self.relay: Relay | None = None
        self.complete = False
        self.client_bytes = 0
        self._tail = b""

    def read(self, leg: str, direction: Direction, data: bytes, now: float) -> None:
        if self.inner is not None:
            self.inner.read(leg, direction, data, now)
        if leg != "client" or self.complete:
            return
        self.client_bytes += len(data)
        window = self._tail + data
        if b"\n\r\n" in window or b"\n\n" in window:
            self.complete = True
            if self.relay is not None and self.relay.observer is self:
                self.relay.observer = self.inner
        self._tail = window[-2:]

    def wrote(self, leg: str, direction: Direction, data: bytes, now: float) -> None:
        if self.inner is not None:
            self.inner.wrote(leg, direction, data, now)

    def ended(self, leg: str, direction: Direction, kind: str, now: float) -> None:
        if self.inner is not None:
            self.inner.ended(leg, direction, kind, now)


class ReadWatch:
    """A relay observer for `read_timeout`: frames the requests written to the upstream
    and the responses read from it (passive framers) to know when a request is
    outstanding, and when the upstream last sent a byte (nginx's proxy_read_timeout
    runs between two reads, from the moment the request was sent)."""

    def __init__(self, inner: RelayObserver | None, now: float) -> None:
        self.inner = inner
        self.exchange = Http1Exchange()
        self.requests = 0
        self.responses_done = 0
        self.response_bytes = 0  # bytes of the outstanding response read so far
        self.last_activity = now

    def outstanding(self) -> bool:
        if self.exchange.requests.degraded or self.exchange.responses.degraded:
            return self.requests > 0 or self.exchange.requests.offset > 0
        return self.requests > self.responses_done

    def due(self) -> float | None:
        return self.last_activity if self.outstanding() else None

    def read(self, leg: str, direction: Direction, data: bytes, now: float) -> None:
        if self.inner is not None:
            self.inner.read(leg, direction, data, now)
        if leg == "upstream":
            self.last_activity = now
            self.response_bytes += len(data)
            for piece in self.exchange.feed(Direction.DOWNSTREAM, data):
                if piece.end_of_message:
                    self.responses_done += 1
                    self.response_bytes = 0

    def wrote(self, leg: str, direction: Direction, data: bytes, now: float) -> None:
        if self.inner is not None:
            self.inner.wrote(leg, direction, data, now)
        if leg == "upstream":
            self.last_activity = max(self.last_activity, now)
            for piece in self.exchange.feed(Direction.UPSTREAM, data):
                if piece.head is not None and piece.head.method is not None:
                    self.requests += 1

    def ended(self, leg: str, direction: Direction, kind: str, now: float) -> None:
        if self.inner is not None:
            self.inner.ended(leg, direction, kind, now)


@dataclass(eq=False)
class LiveConnection:
    """What shutdown needs to reset one connection: its sockets and its cancel scope."""

    scope: trio.CancelScope
    sockets: list[socket.socket]

    def reset(self) -> None:
        for sock in self.sockets:
            arm_reset(sock)
        self.scope.cancel()


@dataclass
class ProxyServer:
    """Accepts clients on `listen_address` and relays each through the scenario to `upstream`."""

    upstream: Address
    scenario: Scenario
    build_faults: Callable[[Scenario], list[Fault]] = Scenario.build_faults
    observer_factory: ObserverFactory | None = None
    report_sink_factory: ReportSinkFactory | None = None
    # Overrides the scenario's `proxy.max_connections` (the CLI's --max-connections).
    max_connections: int | None = None
    connections_accepted: int = 0
    connections_failed: int = 0
    connections_refused: int = 0
    header_timeouts: int = 0
    accept_errors: int = 0
    read_timeouts: int = 0
    reset_at_shutdown: int = 0
    active: int = 0
    shared: list[dict[str, Any]] = field(default_factory=list)
    live: set[LiveConnection] = field(default_factory=set, init=False, repr=False)
    _accept_scope: trio.CancelScope | None = field(default=None, init=False, repr=False)
    _listener: socket.socket | None = field(default=None, init=False, repr=False)
    _idle: trio.lowlevel.ParkingLot = field(
        default_factory=trio.lowlevel.ParkingLot, init=False, repr=False
    )

    def __post_init__(self) -> None:
        self.set_scenario(self.scenario)

    def set_scenario(self, scenario: Scenario) -> None:
        """Swap the scenario for new connections; live ones keep the pipeline they have."""
        self.scenario = scenario
        self.shared = [{} for _ in scenario.path]

    def connection_limit(self) -> int | None:
        if self.max_connections is not None:
            return self.max_connections
        return self.scenario.proxy.max_connections

    async def serve(
        self, listener: socket.socket, *, task_status: Any = trio.TASK_STATUS_IGNORED
    ) -> None:
        """Accept until `stop_accepting()`, then return once every connection has ended."""
        async with trio.open_nursery() as nursery:
            with trio.CancelScope() as accept_scope:
                self._accept_scope = accept_scope
                self._listener = listener
                task_status.started(listener.getsockname()[1])
                while True:
                    try:
                        client, _ = listener.accept()
                    except BlockingIOError:
                        await trio.lowlevel.wait_readable(listener)
                        continue
                    except OSError as error:  # EMFILE and friends: keep serving the others
                        # nginx disables accepting for accept_mutex_delay (500 ms) on
                        # EMFILE/ENFILE; the connection waits in the backlog meanwhile and
                        # the log gets one line per pause, not one per retry.
                        self.accept_errors += 1
                        log.warning("accept failed: %s; pausing accepts", error)
                        await trio.sleep(ACCEPT_ERROR_PAUSE)
                        continue
                    limit = self.connection_limit()
                    if limit is not None and self.active >= limit:
                        # Over the limit: close at once, as nginx does when its
                        # worker_connections run out; the count says how many.
                        self.connections_refused += 1
                        client.close()
                        continue
                    self.connections_accepted += 1
                    self.active += 1  # counted here, so a flood cannot outrun the limit
                    nursery.start_soon(self.handle, client, self.connections_accepted)

    def stop_accepting(self) -> None:
        """Close the listener: new connections are refused by the kernel from now on."""
        if self._accept_scope is not None:
            self._accept_scope.cancel()
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

    async def shutdown(self, grace: float) -> None:
        """Stop accepting, let live connections finish for `grace` seconds, reset the rest."""
        self.stop_accepting()
        with trio.move_on_after(grace):
            await self.wait_idle()
        if self.active:
            self.reset_at_shutdown += self.reset_all()
            log.info("shutdown: reset %d connections after %.1fs", self.reset_at_shutdown, grace)
            with trio.move_on_after(5):
                await self.wait_idle()

    async def handle(self, client: socket.socket, connection_id: int) -> None:
        scenario = self.scenario
        live = LiveConnection(trio.CancelScope(), [client])
        self.live.add(live)
        try:
            with live.scope:
                await self._handle(client, connection_id, scenario, live)
        except Exception:
            log.exception("connection %d failed", connection_id)
        finally:
            self.live.discard(live)
            self.active -= 1
            self._idle.unpark_all()
            try:
                trio.lowlevel.notify_closing(client)
            except Exception:  # already closed by the relay
                pass
            client.close()

    async def _handle(
        self, client: socket.socket, connection_id: int, scenario: Scenario, live: LiveConnection
    ) -> None:
        options = scenario.proxy
        client.setblocking(False)
        client.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        try:
            with trio.fail_after(options.connect_timeout):
                upstream = await dial(self.upstream)
        except (OSError, trio.TooSlowError) as error:
            self.connections_failed += 1
            log.info(
                "connection %d: upstream %s unreachable: %s", connection_id, self.upstream, error
            )
            await self.refuse(client, scenario)
            return
        live.sockets.append(upstream)
        pipeline = self.make_pipeline(scenario, connection_id)
        apply_buffer_sizes(client, upstream, pipeline.socket_buffers())
        observer = self.observer_factory(connection_id, scenario) if self.observer_factory else None
        read_watch = None
        if options.read_timeout is not None:
            read_watch = ReadWatch(observer, trio.current_time())
            observer = read_watch
        head_watch = None
        if options.client_header_timeout is not None:
            head_watch = HeadWatch(observer)
            observer = head_watch
        relay = Relay(client, upstream, pipeline, observer=observer)
        if head_watch is not None:
            head_watch.relay = relay
        async with trio.open_nursery() as nursery:
            if head_watch is not None and options.client_header_timeout is not None:
                nursery.start_soon(
                    self._header_watchdog, head_watch, options.client_header_timeout, nursery
                )
            if read_watch is not None and options.read_timeout is not None:
                nursery.start_soon(
                    self._read_watchdog, relay, read_watch, options.read_timeout, nursery
                )
            await relay.run()
            nursery.cancel_scope.cancel()

    async def _header_watchdog(
        self, watch: HeadWatch, timeout: float, nursery: trio.Nursery
    ) -> None:
        await trio.sleep(timeout)
        if not watch.complete:
            # nginx's client_header_timeout: close without an answer; cancelling the
            # relay closes both sockets (a FIN, as nginx's close() sends).
            self.header_timeouts += 1
            watch.ended("client", Direction.UPSTREAM, "header_timeout", trio.current_time())
            nursery.cancel_scope.cancel()

    async def _read_watchdog(
        self, relay: Relay, watch: ReadWatch, timeout: float, nursery: trio.Nursery
    ) -> None:
        while True:
            since = watch.due()
            now = trio.current_time()
            if since is None or since + timeout > now:
                await trio.sleep_until(now + timeout if since is None else since + timeout)
                continue
            break
        self.read_timeouts += 1
        watch.ended("upstream", Direction.DOWNSTREAM, "read_timeout", trio.current_time())
        if watch.response_bytes == 0:
            # "upstream timed out while reading response header": nginx answers 504 and
            # drops the upstream connection (an RST here, so a hung upstream that never
            # closes cannot hold the connection open).
            relay.inject(
                [
                    Chunk(Direction.DOWNSTREAM, error_response(504)),
                    Eof(Direction.DOWNSTREAM),
                    Reset(Direction.UPSTREAM),
                ]
            )
            await trio.sleep(LINGER_AFTER_ANSWER)
        # Mid-response nginx can only close the connection: the client sees a truncation.
        nursery.cancel_scope.cancel()

    def make_pipeline(self, scenario: Scenario, connection_id: int) -> Pipeline:
        """A fresh pipeline; its faults draw their rngs from (scenario seed, connection id)."""
        pipeline = Pipeline(self.build_faults(scenario))
        sink = self.report_sink_factory(connection_id) if self.report_sink_factory else None
        rng = random.Random(f"{scenario.seed}:{connection_id}")
        pipeline.bind(FaultContext(connection_id, rng, sink), self.shared)
        return pipeline

    async def refuse(self, client: socket.socket, scenario: Scenario) -> None:
        """Answer like a proxy whose upstream is down: 502 (nginx), an RST, or a bare close.

        nginx reads and parses the request head before it connects upstream, so a head
        it cannot parse gets its 400 instead, an oversized one its 400 "Request Header Or
        Cookie Too Large", and a client too slow to send one is closed unanswered."""
        how = scenario.proxy.on_upstream_unreachable
        if how == "reset":
            abort(client)
            return
        if how == "502":
            timeout = scenario.proxy.client_header_timeout
            head, complete = await read_request_head(
                client, math.inf if timeout is None else timeout
            )
            if too_large(head):
                await send_all(client, error_response(400, _TOO_LARGE_BODY))
            elif complete:
                await send_all(client, error_response(400 if malformed(head) else 502))
            elif head and malformed(head):
                await send_all(client, error_response(400))
        try:
            client.shutdown(socket.SHUT_WR)
        except OSError:
            pass


def too_large(head: bytes) -> bool:
    """Whether nginx's default buffers refuse the head: over 4 x 8k in all, or one line
    (a header field, or the request line) over 8k."""
    end = min((i for i in (head.find(b"\n\r\n"), head.find(b"\n\n")) if i >= 0), default=-1)
    section = head if end < 0 else head[:end]
    if len(section) >= NGINX_MAX_HEAD:
        return True
    return any(len(line) > NGINX_HEADER_LINE for line in section.split(b"\n"))


def malformed(head: bytes) -> bool:
    """Whether the request head cannot be parsed as HTTP/1.x (nginx answers 400)."""
    from middlebox.core.http1 import Http1Framer

    framer = Http1Framer("request")
    framer.feed(head)
    return framer.degraded is not None


async def read_request_head(sock: socket.socket, timeout: float = 5.0) -> tuple[bytes, bool]:
    """Read until the end of the request head, nginx's 32 KiB limit, EOF or `timeout`.

    Returns the bytes and whether the head is complete."""
    received = b""
    with trio.move_on_after(timeout):
        while len(received) < NGINX_MAX_HEAD:
            if b"\n\r\n" in received or b"\n\n" in received:
                return received, True
            try:
                data = sock.recv(MAX_REQUEST_HEAD)
            except BlockingIOError:
                await trio.lowlevel.wait_readable(sock)
                continue
            except OSError:
                break
            if not data:
                break
            received += data
    return received, b"\n\r\n" in received or b"\n\n" in received


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


async def run_proxy(
    listen_address: Address,
    upstream: Address,
    scenario: Scenario,
    *,
    ready: Callable[[int], None] | None = None,
    server: ProxyServer | None = None,
    grace: float = 10.0,
    backlog: int = 1024,
    listener: socket.socket | None = None,
) -> ProxyServer:
    """Serve until SIGTERM or SIGINT, then shut down gracefully and return the server.

    The first signal stops accepting and gives live connections `grace` seconds to
    finish before they are reset; a second signal resets them at once. `ready(port)` is
    called once listening. The caller writes journals and reports from the server.
    `listener` serves an already listening socket instead (a `--workers` process's)."""
    server = server or ProxyServer(upstream, scenario)
    listener = listener or listen(listen_address, backlog)
    try:
        with trio.open_signal_receiver(signal.SIGTERM, signal.SIGINT) as signals:
            async with trio.open_nursery() as nursery:
                port = await nursery.start(server.serve, listener)
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
        listener.close()
    return server
