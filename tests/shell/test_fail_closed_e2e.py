"""Fail closed end to end, on real sockets through the proxy as `middlebox proxy`
serves it (compose.PROXY_STAGES, the control API's counters): an upstream that sends an
invalid head gives the client nginx's 502; one that breaks its chunked body after the head
gives the client the good part and a close; one that closes before its head is whole
gives the client nginx's 502 and none of the head; a smuggled request gets 400 and never reaches
the upstream; each is counted in /metrics under its Prometheus name."""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass
from functools import partial

import pytest
import trio
from trio.testing import MockClock

from middlebox.compose import PROXY_STAGES
from middlebox.core.responses import error_response
from middlebox.observe.prometheus import parse_text
from middlebox.run.serve import LIBRARY_SCENARIOS
from middlebox.shell.control import ControlApi, ControlledProxy, pass_through, serve_control
from middlebox.shell.server import Address, ProxyConfig, listen
from tests.harness import read_all
from tests.shell.support import chunk, http, read_head

# An SSE-aware fault that never fires: the path is HTTP-aware, so it is framed.
SCENARIO = b"name: framed\npath:\n  - cut: {after: events, count: 1000}\n"
SSE_HEAD = (
    b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ntransfer-encoding: chunked\r\n\r\n"
)
EVENT = b"data: {}\n\n"


@dataclass
class Upstream:
    answer: bytes
    requests: int = 0

    async def serve(self, stream: trio.SocketStream) -> None:
        if not await read_head(stream):
            return
        self.requests += 1
        await stream.send_all(self.answer)
        await trio.sleep(0.05)
        await stream.aclose()


@dataclass
class Running:
    proxy_port: int
    control_port: int
    upstream: Upstream

    async def metric(self, name: str) -> float:
        _, text, _ = await http(self.control_port, "GET", "/metrics")
        return parse_text(text.decode())[name]


@asynccontextmanager
async def proxied(answer: bytes) -> AsyncIterator[Running]:
    upstream = Upstream(answer)
    async with trio.open_nursery() as nursery:
        listeners = await nursery.start(
            partial(trio.serve_tcp, upstream.serve, 0, host="127.0.0.1")
        )
        address = Address("127.0.0.1", listeners[0].socket.getsockname()[1])
        proxy = ControlledProxy(
            ProxyConfig(address, pass_through(), stages=PROXY_STAGES), loader=LIBRARY_SCENARIOS
        )
        listener = listen(Address("127.0.0.1", 0))
        proxy_port = await nursery.start(proxy.serve, listener)
        control_port = await nursery.start(
            serve_control, ControlApi(proxy, None), Address("127.0.0.1", 0)
        )
        # set in-process, not by PUT /scenario (parsed in a child process, real time)
        proxy.set_scenario(LIBRARY_SCENARIOS.text(SCENARIO.decode()))
        try:
            yield Running(proxy_port, control_port, upstream)
        finally:
            nursery.cancel_scope.cancel()
            listener.close()


async def raw(port: int, request: bytes) -> tuple[bytes, str]:
    stream = await trio.open_tcp_stream("127.0.0.1", port)
    await stream.send_all(request)
    data, ended = await read_all(stream)
    await stream.aclose()
    return data, ended


async def settled(check: Callable[[], Awaitable[bool]]) -> None:
    while not await check():
        await trio.sleep(0.01)


CHAT = b"POST /v1/chat/completions HTTP/1.1\r\nHost: a\r\nContent-Length: 2\r\n\r\n{}"


@pytest.mark.parametrize(
    "answer",
    [
        pytest.param(b"HTTP/1.1 200 OK\r\nBad\rHeader: x\r\n\r\nsecret body", id="invalid-head"),
        # "upstream prematurely closed connection while reading response header from upstream"
        pytest.param(b"HTTP/1.1 200 OK\r\nContent-Type: text/event", id="closed-mid-head"),
        pytest.param(b"", id="closed-without-a-byte"),
    ],
)
async def test_an_upstream_without_a_whole_valid_head_gives_the_client_nginx_s_502_only(
    autojump_clock: MockClock, answer: bytes
) -> None:
    with trio.fail_after(10):
        async with proxied(answer) as run:
            data, ended = await raw(run.proxy_port, CHAT)
            assert data == error_response(502) and ended == "fin"
            assert run.upstream.requests == 1
            await settled(lambda: _equals(run, "middlebox_unframeable_responses_total", 1))


async def test_a_broken_chunked_body_after_the_head_ends_in_a_close_without_the_last_chunk(
    autojump_clock: MockClock,
) -> None:
    answer = SSE_HEAD + chunk(EVENT) + b"zz\r\n" + chunk(EVENT) + b"0\r\n\r\n"
    with trio.fail_after(10):
        async with proxied(answer) as run:
            data, ended = await raw(run.proxy_port, CHAT)
            assert data == SSE_HEAD + chunk(EVENT) and ended == "fin"
            await settled(lambda: _equals(run, "middlebox_unframeable_responses_total", 1))


async def test_a_smuggled_request_gets_400_nothing_upstream_and_is_counted(
    autojump_clock: MockClock,
) -> None:
    smuggle = (
        b"POST /v1/chat/completions HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: chunked\r\n\r\n"
        b"\r\n" + CHAT
    )
    with trio.fail_after(10):
        async with proxied(SSE_HEAD + b"0\r\n\r\n") as run:
            data, _ = await raw(run.proxy_port, smuggle)
            assert data == error_response(400)
            await settled(lambda: _equals(run, "middlebox_unframeable_requests_total", 1))
            assert run.upstream.requests == 0
            assert await run.metric("middlebox_unframeable_responses_total") == 0


async def _equals(run: Running, name: str, value: float) -> bool:
    return await run.metric(name) == value
