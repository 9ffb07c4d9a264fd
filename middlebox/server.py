"""The proxy server: accept, dial the upstream, build a fresh pipeline, relay (trio shell).

Each accepted connection gets an id, a seeded rng drawn from (scenario seed,
connection id) so a run replays from its seed, and a new pipeline built from the
scenario. One connection's error is logged and never stops the server. When the
upstream cannot be reached, the client gets what a real proxy sends: nginx's
`502 Bad Gateway` after reading the request head (nginx reads the request before it
connects upstream), or a reset or a close if the scenario's `proxy:` block says so.
"""

from __future__ import annotations

import errno
import logging
import random
import socket
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import urlsplit

import trio

from middlebox.fault import Fault, FaultContext, FaultReport, Pipeline
from middlebox.relay import Relay, RelayObserver, abort, apply_buffer_sizes
from middlebox.responses import error_response
from middlebox.scenario import Scenario

log = logging.getLogger("middlebox.server")

MAX_REQUEST_HEAD = 64 * 1024


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
    family = socket.AF_INET6 if ":" in address.host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind((address.host, address.port))
    sock.listen(backlog)
    sock.setblocking(False)
    return sock


ObserverFactory = Callable[[int, Scenario], RelayObserver | None]
ReportSinkFactory = Callable[[int], Callable[[FaultReport], None] | None]


@dataclass
class ProxyServer:
    """Accepts clients on `listen_address` and relays each through the scenario to `upstream`."""

    upstream: Address
    scenario: Scenario
    build_faults: Callable[[Scenario], list[Fault]] = Scenario.build_faults
    observer_factory: ObserverFactory | None = None
    report_sink_factory: ReportSinkFactory | None = None
    connections_accepted: int = 0
    connections_failed: int = 0
    active: int = 0
    shared: list[dict[str, Any]] = field(default_factory=list)

    def __post_init__(self) -> None:
        self.set_scenario(self.scenario)

    def set_scenario(self, scenario: Scenario) -> None:
        """Swap the scenario for new connections; live ones keep the pipeline they have."""
        self.scenario = scenario
        self.shared = [{} for _ in scenario.path]

    async def serve(
        self, listener: socket.socket, *, task_status: Any = trio.TASK_STATUS_IGNORED
    ) -> None:
        async with trio.open_nursery() as nursery:
            task_status.started(listener.getsockname()[1])
            while True:
                try:
                    client, _ = listener.accept()
                except BlockingIOError:
                    await trio.lowlevel.wait_readable(listener)
                    continue
                except OSError as error:  # EMFILE and friends: keep serving the others
                    log.warning("accept failed: %s", error)
                    await trio.sleep(0.01)
                    continue
                self.connections_accepted += 1
                nursery.start_soon(self.handle, client, self.connections_accepted)

    async def handle(self, client: socket.socket, connection_id: int) -> None:
        self.active += 1
        scenario = self.scenario
        try:
            client.setblocking(False)
            client.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            try:
                with trio.fail_after(scenario.proxy.connect_timeout):
                    upstream = await dial(self.upstream)
            except (OSError, trio.TooSlowError) as error:
                self.connections_failed += 1
                log.info(
                    "connection %d: upstream %s unreachable: %s",
                    connection_id,
                    self.upstream,
                    error,
                )
                await self.refuse(client, scenario)
                return
            pipeline = self.make_pipeline(scenario, connection_id)
            apply_buffer_sizes(client, upstream, pipeline.socket_buffers())
            observer = (
                self.observer_factory(connection_id, scenario) if self.observer_factory else None
            )
            await Relay(client, upstream, pipeline, observer=observer).run()
        except Exception:
            log.exception("connection %d failed", connection_id)
        finally:
            self.active -= 1
            try:
                trio.lowlevel.notify_closing(client)
            except Exception:  # already closed by the relay
                pass
            client.close()

    def make_pipeline(self, scenario: Scenario, connection_id: int) -> Pipeline:
        """A fresh pipeline; its faults draw their rngs from (scenario seed, connection id)."""
        pipeline = Pipeline(self.build_faults(scenario))
        sink = self.report_sink_factory(connection_id) if self.report_sink_factory else None
        rng = random.Random(f"{scenario.seed}:{connection_id}")
        pipeline.bind(FaultContext(connection_id, rng, sink), self.shared)
        return pipeline

    async def refuse(self, client: socket.socket, scenario: Scenario) -> None:
        """Answer like a proxy whose upstream is down: 502 (nginx), an RST, or a bare close."""
        how = scenario.proxy.on_upstream_unreachable
        if how == "reset":
            abort(client)
            return
        if how == "502":
            await read_request_head(client)
            await send_all(client, error_response(502))
        try:
            client.shutdown(socket.SHUT_WR)
        except OSError:
            pass


async def read_request_head(sock: socket.socket) -> bytes:
    """Read until the end of the request head (or 64 KiB, EOF or 5 s), as nginx does first."""
    received = b""
    with trio.move_on_after(5):
        while b"\r\n\r\n" not in received and len(received) < MAX_REQUEST_HEAD:
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
    return received


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
) -> None:
    """Serve forever (until cancelled); `ready(port)` is called once listening."""
    server = ProxyServer(upstream, scenario)
    listener = listen(listen_address)
    try:
        async with trio.open_nursery() as nursery:
            port = await nursery.start(server.serve, listener)
            if ready is not None:
                ready(port)
    finally:
        listener.close()
