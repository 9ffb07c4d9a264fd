"""Plain connections to a numeric upstream are served on the read hub with no task each
(shell/hub_connection.py), and what a client and the upstream see is what the handler
task gave them: the same bytes, ends, refusals, counts and closes. A server class that
handles connections its own way keeps a task per connection."""

from __future__ import annotations

import contextlib
import errno
import gc
import logging
import socket
import weakref
from collections.abc import AsyncIterator
from dataclasses import dataclass, replace
from typing import Any, ClassVar

import pytest
import trio
from trio.testing import MockClock

from middlebox.compose import PROXY_STAGES
from middlebox.core.fault import Fault
from middlebox.core.stream import Item
from middlebox.scenario.model import FaultSpec, Scenario
from middlebox.shell.hub import acquire_read_hub, release_read_hub
from middlebox.shell.hub_connection import ACCEPTS_PER_TURN, HubListener
from middlebox.shell.server import ACCEPT_ERROR_PAUSE, Address, ProxyConfig, ProxyServer, listen
from tests.harness import read_all
from tests.reliability.support import fd_baseline, open_fds

HEAD = b"GET / HTTP/1.1\r\nHost: x\r\n\r\n"
ANSWER = b"HTTP/1.1 200 OK\r\nContent-Length: 5\r\n\r\nhello"


class TaskedServer(ProxyServer):
    """Handles each connection its own way (as the control API's server does): a task each."""

    async def _handle(self, *args: object, **kwargs: object) -> None:
        await super()._handle(*args, **kwargs)


@contextlib.asynccontextmanager
async def answering() -> AsyncIterator[int]:
    """An upstream answering each request with ANSWER (`answer_once`); yields its port."""
    async with trio.open_nursery() as nursery:
        listeners = await nursery.start(trio.serve_tcp, answer_once, 0)
        yield listeners[0].socket.getsockname()[1]
        nursery.cancel_scope.cancel()


async def request_through(port: int) -> tuple[trio.SocketStream, bytes]:
    """A client's request through the proxy at `port`, and its answer read to the body."""
    client = await trio.open_tcp_stream("127.0.0.1", port)
    await client.send_all(HEAD)
    received = b""
    while not received.endswith(b"hello"):
        received += await client.receive_some(65536)
    return client, received


def handler_tasks() -> int:
    """Tasks in this run running a connection's handler (`ProxyServer.handle`)."""
    count = 0
    todo = [trio.lowlevel.current_root_task()]
    while todo:
        task = todo.pop()
        count += task.name.endswith(".handle")
        for nursery in task.child_nurseries:
            todo.extend(nursery.child_tasks)
    return count


async def answer_once(stream: trio.SocketStream) -> None:
    await stream.receive_some(65536)
    with contextlib.suppress(trio.BrokenResourceError):
        await stream.send_all(ANSWER)
        while await stream.receive_some(65536):  # kept alive until the client leaves
            pass


@contextlib.asynccontextmanager
async def serving(
    kind: type[ProxyServer],
    upstream_port: int,
    scenario: Scenario | None = None,
    listener: socket.socket | None = None,
    **options: Any,
) -> AsyncIterator[tuple[ProxyServer, int]]:
    """A `kind` proxy in front of `upstream_port` (on `listener`, or a new one); `options`
    are more `ProxyConfig` fields."""
    async with trio.open_nursery() as nursery:
        config = ProxyConfig(
            Address("127.0.0.1", upstream_port),
            scenario or Scenario(name="t"),
            stages=PROXY_STAGES,
            **options,
        )
        server = kind(config)
        listener = listener or listen(Address("127.0.0.1", 0))
        port = await nursery.start(server.serve, listener)
        try:
            yield server, port
        finally:
            nursery.cancel_scope.cancel()
            listener.close()


@pytest.mark.parametrize("kind", [ProxyServer, TaskedServer])
async def test_plain_connections_are_served_on_the_hub_and_answer_as_a_task_did(
    kind: type[ProxyServer],
) -> None:
    with trio.fail_after(10):
        async with trio.open_nursery() as outer:
            listeners = await outer.start(trio.serve_tcp, answer_once, 0)
            upstream_port = listeners[0].socket.getsockname()[1]
            async with serving(kind, upstream_port) as (server, port):
                clients = []
                for _ in range(3):
                    client = await trio.open_tcp_stream("127.0.0.1", port)
                    await client.send_all(HEAD)
                    received = b""
                    while len(received) < len(ANSWER):
                        received += await client.receive_some(65536)
                    assert received == ANSWER
                    clients.append(client)
                on_hub = [live.on_hub for live in server.live]
                tasks = handler_tasks()
                for client in clients:
                    await client.aclose()
                while server.active:
                    await trio.sleep(0.01)
                assert not server.live
            outer.cancel_scope.cancel()
    if kind is ProxyServer:
        assert (on_hub, tasks) == ([True] * 3, 0)
    else:
        assert (on_hub, tasks) == ([False] * 3, 3)
    assert server.connections_accepted == 3


@pytest.mark.parametrize("kind", [ProxyServer, TaskedServer])
async def test_the_listener_is_on_the_hub_for_plain_connections_until_accepting_stops(
    kind: type[ProxyServer],
) -> None:
    """A server that serves on the hub has the hub accept for it (the listener's fd among
    the hub's readers); one with a task per connection keeps its accept task. Either way
    `stop_accepting` leaves the kernel refusing, and the hub forgets the listener."""
    listener = listen(Address("127.0.0.1", 0))
    fd = listener.fileno()
    with trio.fail_after(10):
        async with (
            answering() as upstream_port,
            serving(kind, upstream_port, listener=listener) as (server, port),
        ):
            client, received = await request_through(port)
            hub = acquire_read_hub()
            watched = fd in hub.callbacks
            server.stop_accepting()
            forgotten = fd not in hub.callbacks and fd not in hub.masks
            release_read_hub(hub)
            with pytest.raises(OSError):
                await trio.open_tcp_stream("127.0.0.1", port)
            await client.aclose()
            while server.active:
                await trio.sleep(0.01)
    assert received == ANSWER
    assert watched is (kind is ProxyServer)
    assert forgotten


class RunsOutOfFds(socket.socket):
    """A listener whose first accept fails as with no fd left (EMFILE)."""

    ran_out = False

    def _accept(self) -> tuple[int, Any]:
        if not self.ran_out:
            self.ran_out = True
            raise OSError(errno.EMFILE, "Too many open files")
        return super()._accept()  # type: ignore[misc]


@pytest.mark.parametrize("kind", [ProxyServer, TaskedServer])
async def test_an_accept_without_an_fd_pauses_accepting_as_nginx_does_then_serves(
    kind: type[ProxyServer], autojump_clock: MockClock, caplog: pytest.LogCaptureFixture
) -> None:
    """EMFILE on accept: counted, logged once, and accepting waits ACCEPT_ERROR_PAUSE
    (nginx's accept_mutex_delay) with the client in the backlog, then serves it."""
    plain = listen(Address("127.0.0.1", 0))
    listener = RunsOutOfFds(plain.family, socket.SOCK_STREAM, 0, plain.detach())
    with trio.fail_after(10):
        async with (
            answering() as upstream_port,
            serving(kind, upstream_port, listener=listener) as (server, port),
        ):
            started = trio.current_time()
            client, received = await request_through(port)
            waited = trio.current_time() - started
            await client.aclose()
            while server.active:
                await trio.sleep(0.01)
    assert received == ANSWER
    assert waited == pytest.approx(ACCEPT_ERROR_PAUSE)
    assert server.accept_errors == 1
    assert [r.getMessage() for r in caplog.records if "accept failed" in r.getMessage()] == [
        "accept failed: [Errno 24] Too many open files; pausing accepts"
    ]


async def test_a_turn_of_the_hub_accepts_at_most_a_batch_and_a_bad_client_only_fails_itself(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """Seventy clients waiting: one turn admits ACCEPTS_PER_TURN, the next the rest (the
    listener stays readable, level-triggered); a client whose admission raises is closed
    and logged, and the others are still admitted."""
    listener = listen(Address("127.0.0.1", 0))
    hub = acquire_read_hub()
    admitted: list[socket.socket] = []

    def admit(client: socket.socket) -> None:
        admitted.append(client)
        if len(admitted) == 1:
            raise RuntimeError("a bug admitting one client")

    clients = []
    try:
        listening = HubListener(hub, listener, admit, lambda error: None, ACCEPT_ERROR_PAUSE)
        for _ in range(70):
            client = socket.socket()
            client.connect(listener.getsockname())  # the handshake completes in the backlog
            clients.append(client)
        turn = hub.callbacks[listener.fileno()]  # what the hub calls when it is readable
        turn()
        first = len(admitted)
        turn()
        second = len(admitted) - first
        turn()  # nothing waits: the accept would block, and it returns
        listening.close()
    finally:
        for sock in [listener, *clients, *admitted]:
            sock.close()
    assert (first, second) == (ACCEPTS_PER_TURN, 70 - ACCEPTS_PER_TURN)
    assert admitted[0].fileno() == -1  # the client it failed on is closed
    assert "accepted client failed" in caplog.text


def closed_port() -> int:
    probe = socket.socket()
    probe.bind(("127.0.0.1", 0))
    port = probe.getsockname()[1]
    probe.close()
    return int(port)


@pytest.mark.parametrize("kind", [ProxyServer, TaskedServer])
async def test_an_unreachable_upstream_gets_nginx_s_502_on_the_hub_as_from_a_task(
    kind: type[ProxyServer],
) -> None:
    with trio.fail_after(10):
        async with serving(kind, closed_port()) as (server, port):
            client = await trio.open_tcp_stream("127.0.0.1", port)
            await client.send_all(HEAD)
            received, end = await read_all(client)
            while server.active:
                await trio.sleep(0.01)
    assert received.startswith(b"HTTP/1.1 502 Bad Gateway\r\n") and end == "fin"
    assert (server.connections_failed, server.active, len(server.live)) == (1, 0, 0)


async def test_a_connect_past_connect_timeout_is_refused_from_the_hub_s_timer(
    autojump_clock: MockClock,
) -> None:
    from tests.reliability.support import blackhole

    listener, fillers = blackhole()
    scenario = replace(
        Scenario(name="t"), proxy=replace(Scenario(name="t").proxy, connect_timeout=0.3)
    )
    try:
        async with serving(ProxyServer, listener.getsockname()[1], scenario) as (server, port):
            with trio.fail_after(5):
                client = await trio.open_tcp_stream("127.0.0.1", port)
                await client.send_all(HEAD)
                started = trio.current_time()
                assert [live.on_hub for live in server.live] == [True]
                received, end = await read_all(client)
                waited = trio.current_time() - started
    finally:
        for sock in [listener, *fillers]:
            sock.close()
    assert received.startswith(b"HTTP/1.1 502 Bad Gateway\r\n") and end == "fin"
    assert waited == pytest.approx(0.3)
    assert server.connections_failed == 1


async def test_cancelling_serve_closes_the_hub_s_connections_and_every_fd() -> None:
    baseline = fd_baseline()
    with trio.fail_after(10):
        async with trio.open_nursery() as outer:
            listeners = await outer.start(trio.serve_tcp, answer_once, 0)
            upstream_port = listeners[0].socket.getsockname()[1]
            async with serving(ProxyServer, upstream_port) as (server, port):
                client = await trio.open_tcp_stream("127.0.0.1", port)
                await client.send_all(HEAD)
                await client.receive_some(65536)
                assert [live.on_hub for live in server.live] == [True]
            # serve was cancelled with the connection live: its sockets closed with it
            assert (server.active, len(server.live)) == (0, 0)
            received, end = await read_all(client)
            await client.aclose()
            outer.cancel_scope.cancel()
    assert (received, end) == (b"", "fin")
    assert open_fds() == baseline


@dataclass
class Explodes(Fault):
    name: ClassVar[str] = "explodes"

    def on_item(self, item: Item, now: float) -> list[Item]:
        raise RuntimeError("a buggy fault")


async def test_a_relay_s_error_on_the_hub_is_logged_and_closes_that_connection_only(
    caplog: pytest.LogCaptureFixture,
) -> None:
    builds = iter([[Explodes()], []])
    scenario = Scenario(name="flaky", path=(FaultSpec(Explodes, {}),))
    build = lambda _scenario: next(builds)  # noqa: E731
    with trio.fail_after(10):
        async with (
            answering() as upstream_port,
            serving(ProxyServer, upstream_port, scenario, build_faults=build) as (_server, port),
        ):
            with caplog.at_level(logging.ERROR, logger="middlebox.shell.server"):
                broken = await trio.open_tcp_stream("127.0.0.1", port)
                await broken.send_all(HEAD)
                await read_all(broken)
                _healthy, received = await request_through(port)
    assert received == ANSWER
    failures = [r for r in caplog.records if r.getMessage() == "connection 1 failed"]
    assert len(failures) == 1 and failures[0].exc_info is not None
    assert "a buggy fault" in str(failures[0].exc_info[1])


THREE_FAULTS = """
name: three
path:
  - latency: {delay: 0}
  - set_header: {}
  - idle_reaper: {timeout: 600s}
"""


@pytest.mark.parametrize("kind", [ProxyServer, TaskedServer])
@pytest.mark.parametrize("faulted", [False, True], ids=["pass-through", "three faults"])
async def test_a_closed_connection_is_freed_without_the_cyclic_collector(
    kind: type[ProxyServer], faulted: bool
) -> None:
    """What refers back to a connection (its relay's `on_done`, its live entry's `stop`,
    its dial's callback) and what ties its pipeline into cycles (each fault's body pass,
    each framed stream's readers and its pair) let go at the end: thousands of
    connections a second are freed by reference counting, not left for the collector."""
    from middlebox.compose import load_text

    scenario = load_text(THREE_FAULTS) if faulted else None
    hub = acquire_read_hub()  # held: the hub outlives the connection, as on a busy proxy
    gc.collect()
    gc.disable()
    try:
        with trio.fail_after(10):
            async with trio.open_nursery() as outer:
                listeners = await outer.start(trio.serve_tcp, answer_once, 0)
                upstream_port = listeners[0].socket.getsockname()[1]
                async with serving(kind, upstream_port, scenario) as (server, port):
                    client = await trio.open_tcp_stream("127.0.0.1", port)
                    await client.send_all(HEAD)
                    received = b""
                    while not received.endswith(b"hello"):
                        received += await client.receive_some(65536)
                    (live,) = server.live
                    assert live.relay is not None
                    framing = live.relay.pipeline.framing
                    assert (framing is not None) is faulted  # framed: the faults read HTTP
                    held = [
                        weakref.ref(live.relay),
                        weakref.ref(live.relay.pipeline),
                        *(weakref.ref(stream) for stream in (framing.streams if framing else [])),
                        *(weakref.ref(fault) for fault in live.relay.pipeline.faults),
                    ]
                    if kind is ProxyServer:
                        held.append(weakref.ref(live.stop.__self__))  # type: ignore[attr-defined]
                    del live, framing
                    await client.aclose()
                    while server.active:
                        await trio.sleep(0.01)
                    await trio.sleep(0.01)  # the turn or task that closed it is over
                    alive = [ref() for ref in held if ref() is not None]
                    assert alive == []
                outer.cancel_scope.cancel()
    finally:
        gc.enable()
        release_read_hub(hub)
    assert received.startswith(b"HTTP/1.1 200 OK\r\n") and received.endswith(b"hello")


@pytest.mark.parametrize("segment", ["auto", "size"])
async def test_the_client_link_s_mss_is_asked_only_for_a_path_that_reads_it(
    segment: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    from faults.coalescer import Coalescer
    from middlebox.shell import server as server_module

    asked: list[int | None] = []
    original = server_module.client_mss

    def counted(client: socket.socket) -> int | None:
        asked.append(original(client))
        return asked[-1]

    monkeypatch.setattr(server_module, "client_mss", counted)
    built: list[Coalescer] = []

    def build(_scenario: Scenario) -> list[Fault]:
        built.append(Coalescer(window=0.001, size=1000, segment=segment))
        return list(built[-1:])

    scenario = Scenario(name="mss", path=(FaultSpec(Coalescer, {"segment": segment}),))
    with trio.fail_after(10):
        async with (
            answering() as upstream_port,
            serving(ProxyServer, upstream_port, scenario, build_faults=build) as (_server, port),
        ):
            _client, received = await request_through(port)
    assert received == ANSWER
    (fault,) = built
    if segment == "auto":
        assert len(asked) == 1 and asked[0] is not None  # the loopback MSS, 65483 on Linux
        assert fault.context.client_mss == asked[0] and fault._segment == asked[0]
    else:
        assert asked == [] and fault.context.client_mss is None
