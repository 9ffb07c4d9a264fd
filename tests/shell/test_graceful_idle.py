"""Graceful shutdown closes idle kept-alive connections at once, as nginx's
`ngx_close_idle_connections` does, and lets an exchange in flight finish: the relay's
`between_messages` (the framing's pure query, what the faults hold, the outboxes)."""

from __future__ import annotations

import random
import socket
from collections.abc import Iterator
from functools import partial

import pytest
import trio
from trio.testing import MockClock

from faults.latency import Latency
from faults.sse_ids import SseIds
from middlebox.compose import PROXY_STAGES, registry
from middlebox.core.fault import FaultContext, Pipeline
from middlebox.core.stream import DOWN, UP, Chunk
from middlebox.scenario.load import load_scenario_text
from middlebox.scenario.model import ProxyOptions
from middlebox.shell.relay import Relay
from middlebox.shell.server import Address, ProxyConfig, ProxyServer, listen
from tests.request_readers import KeepAliveRequests

REQUEST = b"GET /v1/models HTTP/1.1\r\nHost: a\r\n\r\n"
RESPONSE = b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\n{}"


OPEN: list[socket.socket] = []


@pytest.fixture(autouse=True)
def _close_sockets() -> Iterator[None]:
    yield
    while OPEN:
        OPEN.pop().close()


def relay_over(*faults: object, stages: bool = True) -> tuple[Relay, Pipeline]:
    client_side, upstream_side = PROXY_STAGES.around(ProxyOptions(read_timeout=60.0))
    path = [*client_side, *faults, *upstream_side] if stages else list(faults)
    pipeline = Pipeline(path)  # type: ignore[arg-type]
    pipeline.bind(FaultContext(1, random.Random(0)))
    pipeline.on_open(0.0)
    a, b = socket.socketpair()
    c, d = socket.socketpair()
    for sock in (b, d):
        sock.close()
    OPEN.extend((a, c))
    own = [*client_side, *upstream_side] if stages else []
    return Relay(a, c, pipeline, stages=own), pipeline  # type: ignore[arg-type]


def test_a_connection_is_idle_only_between_a_whole_answer_and_the_next_request() -> None:
    relay, pipeline = relay_over(SseIds())
    assert relay.between_messages()
    pipeline.on_item(Chunk(UP, REQUEST), 1.0)
    assert not relay.between_messages()  # the read timer runs: a stage, but the request waits
    pipeline.on_item(Chunk(DOWN, RESPONSE), 2.0)
    assert relay.between_messages()


def test_a_fault_still_holding_the_answer_keeps_it_busy() -> None:
    relay, pipeline = relay_over(Latency(delay=5.0, direction="downstream"), SseIds())
    pipeline.on_item(Chunk(UP, REQUEST), 1.0)
    pipeline.on_item(Chunk(DOWN, RESPONSE), 2.0)  # framed as it entered, held by the delay
    assert not relay.between_messages()
    pipeline.on_deadline(7.0)
    assert relay.between_messages()


def test_bytes_waiting_in_an_outbox_keep_it_busy() -> None:
    relay, _ = relay_over(SseIds())
    relay.client.outbox.append(b"x")
    assert not relay.between_messages()


def test_an_unframed_pass_through_connection_cannot_say_so_is_never_idle() -> None:
    relay, _ = relay_over(Latency(delay=0.0), stages=False)
    assert not relay.between_messages()


# -- graceful shutdown on real sockets (bounded: a connection held to the grace fails it) --

SLOW_EVENTS = 6
FRAMED = "name: framed\npath:\n  - cut: {after: events, count: 1000}\n"


async def keep_alive_upstream(stream: trio.SocketStream) -> None:
    """Serves requests on one connection: `/slow` streams six chunks 50 ms apart."""
    requests = KeepAliveRequests(stream)
    try:
        while (head := await requests.next_head()) is not None:
            if head.startswith(b"GET /slow"):
                await stream.send_all(
                    b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\n"
                    b"Transfer-Encoding: chunked\r\n\r\n"
                )
                for index in range(SLOW_EVENTS):
                    event = b"data: %d\n\n" % index
                    await stream.send_all(b"%x\r\n%s\r\n" % (len(event), event))
                    await trio.sleep(0.05)
                await stream.send_all(b"0\r\n\r\n")
            else:
                await stream.send_all(RESPONSE)
    except trio.BrokenResourceError:
        return


async def read_until(stream: trio.SocketStream, end: bytes) -> bytes:
    data = b""
    while not data.endswith(end):
        more = await stream.receive_some(65536)
        assert more, data
        data += more
    return data


async def read_to_eof(stream: trio.SocketStream) -> bytes:
    data = b""
    while more := await stream.receive_some(65536):
        data += more
    return data


async def test_shutdown_closes_an_idle_kept_alive_connection_at_once_and_lets_a_stream_end(
    autojump_clock: MockClock,
) -> None:
    scenario = load_scenario_text(FRAMED, registry())
    with trio.fail_after(10):  # the grace is 60 s: holding either connection to it fails
        async with trio.open_nursery() as nursery:
            serve = partial(trio.serve_tcp, keep_alive_upstream, 0, host="127.0.0.1")
            listeners = await nursery.start(serve)
            upstream = Address("127.0.0.1", listeners[0].socket.getsockname()[1])
            server = ProxyServer(ProxyConfig(upstream, scenario, stages=PROXY_STAGES))
            port = await nursery.start(server.serve, listen(Address("127.0.0.1", 0)))
            idle = await trio.open_tcp_stream("127.0.0.1", port)
            await idle.send_all(REQUEST)
            assert await read_until(idle, b"{}") == RESPONSE  # answered, kept alive
            busy = await trio.open_tcp_stream("127.0.0.1", port)
            await busy.send_all(b"GET /slow HTTP/1.1\r\nHost: a\r\n\r\n")
            await read_until(busy, b"data: 0\n\n\r\n")  # streaming now
            nursery.start_soon(server.shutdown, 60.0)
            assert await read_to_eof(idle) == b""  # a FIN at once, no answer, no reset
            rest = await read_to_eof(busy)  # the stream ends whole, then its FIN
            assert rest.endswith(b"data: %d\n\n\r\n0\r\n\r\n" % (SLOW_EVENTS - 1))
            while server.active:
                await trio.sleep(0.01)
            assert (server.closed_idle_at_shutdown, server.reset_at_shutdown) == (2, 0)
            for stream in (idle, busy):
                await stream.aclose()
            nursery.cancel_scope.cancel()
