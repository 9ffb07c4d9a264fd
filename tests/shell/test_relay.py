"""The real proxy over loopback sockets: byte-exact both ways, FIN and RST carried faithfully."""

from __future__ import annotations

import contextlib
import random
from dataclasses import dataclass
from typing import ClassVar

import trio
from trio.testing import MockClock

from middlebox.compose import PROXY_STAGES
from middlebox.core.fault import Fault
from middlebox.core.stream import Item
from middlebox.scenario.model import FaultSpec, ProxyOptions, Scenario
from middlebox.shell.server import Address, ProxyConfig, ProxyServer, listen
from tests.harness import free_port, proxied, read_all, reset, send_in_pieces


def random_payload(rng: random.Random, size: int) -> tuple[bytes, list[int]]:
    data = rng.randbytes(size)
    cuts = [rng.randrange(size + 1) for _ in range(rng.randrange(0, 12))]
    return data, cuts


async def test_random_bytes_cross_byte_exact_each_way_with_each_fin_carried_separately() -> None:
    rng = random.Random(2024)
    for round_number in range(6):
        request, request_cuts = random_payload(rng, rng.randrange(1, 300_000))
        response, response_cuts = random_payload(rng, rng.randrange(1, 300_000))
        seen_by_upstream: list[bytes] = []

        async def upstream(stream: trio.SocketStream) -> None:
            # Read the whole request to its FIN first: the client's half-close must
            # arrive as a FIN while our direction stays open.
            data, end = await read_all(stream)
            seen_by_upstream.append(data)  # noqa: B023
            assert end == "fin"
            await send_in_pieces(stream, response, response_cuts)  # noqa: B023
            await stream.send_eof()

        with trio.fail_after(20):
            async with proxied(upstream) as running:
                client = await running.connect()
                await send_in_pieces(client, request, request_cuts)
                await client.send_eof()
                received, end = await read_all(client)
                await client.aclose()
        assert seen_by_upstream == [request], f"round {round_number}: request bytes differ"
        assert received == response, f"round {round_number}: response bytes differ"
        assert end == "fin"


async def test_the_upstream_may_finish_first_while_the_client_is_still_sending() -> None:
    rng = random.Random(7)
    request, cuts = random_payload(rng, 200_000)
    got: list[bytes] = []
    upstream_done = trio.Event()

    async def upstream(stream: trio.SocketStream) -> None:
        await stream.send_all(b"early answer")
        await stream.send_eof()
        data, _ = await read_all(stream)
        got.append(data)
        upstream_done.set()

    with trio.fail_after(20):
        async with proxied(upstream) as running:
            client = await running.connect()
            answer, end = await read_all(client)
            await send_in_pieces(client, request, cuts)
            await client.send_eof()
            await upstream_done.wait()
            await client.aclose()
    assert (answer, end) == (b"early answer", "fin")
    assert got == [request]


async def test_an_upstream_rst_reaches_the_client_as_an_rst_after_the_bytes_before_it(
    autojump_clock: MockClock,
) -> None:
    async def upstream(stream: trio.SocketStream) -> None:
        await stream.receive_some(100)
        await stream.send_all(b"HTTP/1.1 200 OK\r\n\r\ndata: partial\n\n")
        await trio.sleep(0.05)
        reset(stream)

    with trio.fail_after(10):
        async with proxied(upstream) as running:
            client = await running.connect()
            await client.send_all(b"GET / HTTP/1.1\r\n\r\n")
            received, end = await read_all(client)
    assert end == "rst"
    assert received == b"HTTP/1.1 200 OK\r\n\r\ndata: partial\n\n"


async def test_a_client_rst_reaches_the_upstream_as_an_rst(autojump_clock: MockClock) -> None:
    ends: list[str] = []
    upstream_done = trio.Event()

    async def upstream(stream: trio.SocketStream) -> None:
        _, end = await read_all(stream)
        ends.append(end)
        upstream_done.set()

    with trio.fail_after(10):
        async with proxied(upstream) as running:
            client = await running.connect()
            await client.send_all(b"GET / HTTP/1.1\r\n\r\n")
            await trio.sleep(0.05)
            reset(client)
            await upstream_done.wait()
    assert ends == ["rst"]


async def test_an_unreachable_upstream_answers_like_nginx_with_a_502() -> None:
    async with trio.open_nursery() as nursery:
        config = ProxyConfig(
            Address("127.0.0.1", free_port()), Scenario(name="down"), stages=PROXY_STAGES
        )
        server = ProxyServer(config)
        listener = listen(Address("127.0.0.1", 0))
        port = await nursery.start(server.serve, listener)
        with trio.fail_after(10):
            client = await trio.open_tcp_stream("127.0.0.1", port)
            await client.send_all(b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\n\r\n")
            received, end = await read_all(client)
        nursery.cancel_scope.cancel()
    assert received.startswith(b"HTTP/1.1 502 Bad Gateway\r\n")
    assert b"<center><h1>502 Bad Gateway</h1></center>" in received
    assert end == "fin"
    assert server.connections_failed == 1


async def test_an_unreachable_upstream_can_be_answered_with_a_reset_instead() -> None:
    scenario = Scenario(name="down", proxy=ProxyOptions(on_upstream_unreachable="reset"))
    async with trio.open_nursery() as nursery:
        config = ProxyConfig(Address("127.0.0.1", free_port()), scenario, stages=PROXY_STAGES)
        server = ProxyServer(config)
        listener = listen(Address("127.0.0.1", 0))
        port = await nursery.start(server.serve, listener)
        with trio.fail_after(10):
            client = await trio.open_tcp_stream("127.0.0.1", port)
            received, end = await read_all(client)
        nursery.cancel_scope.cancel()
    assert (received, end) == (b"", "rst")


@dataclass
class Explodes(Fault):
    name: ClassVar[str] = "explodes"

    def on_item(self, item: Item, now: float) -> list[Item]:
        raise RuntimeError("a buggy fault")


async def test_one_connection_s_error_never_stops_the_server() -> None:
    async def upstream(stream: trio.SocketStream) -> None:
        # The broken connection's relay may abort before "hello" is read: this
        # upstream then sees ENOTCONN, which is the proxy's right, not a test failure.
        with contextlib.suppress(trio.BrokenResourceError):
            await stream.send_all(b"hello")
            await stream.send_eof()

    builds = iter([[Explodes()], []])
    scenario = Scenario(name="flaky", path=(FaultSpec(Explodes, {}),))
    with trio.fail_after(10):
        async with proxied(
            upstream, scenario, build_faults=lambda _scenario: next(builds)
        ) as running:
            broken = await running.connect()
            await broken.send_all(b"x")
            await read_all(broken)
            healthy = await running.connect()
            received, end = await read_all(healthy)
    assert (received, end) == (b"hello", "fin")
    assert running.server.connections_accepted == 2


def test_a_scenario_s_pipeline_layout_is_worked_out_on_its_first_connection_only() -> None:
    from faults.set_header import SetHeader

    scenario = Scenario(name="headers", path=(FaultSpec(SetHeader, {}),))
    server = ProxyServer(ProxyConfig(Address("127.0.0.1", 9), scenario, stages=PROXY_STAGES))
    first = server.make_pipeline(scenario, 1)
    second = server.make_pipeline(scenario, 2)
    # The same layout (framing shape and wiring), each connection its own streams and faults.
    assert first.layout is not None and second.layout is first.layout
    assert first.framing is not None and second.framing is not None
    assert first.framing.streams[0] is not second.framing.streams[0]
    assert first.faults[0] is not second.faults[0]
    # A new scenario object (every edit makes one) works its layout out again.
    edited = Scenario(name="headers", path=(FaultSpec(SetHeader, {"headers": {"X-Other": "1"}}),))
    server.set_scenario(edited)
    third = server.make_pipeline(edited, 3)
    assert third.layout is not first.layout
    assert server.make_pipeline(edited, 4).layout is third.layout
