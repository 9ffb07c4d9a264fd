"""The nginx presets' client timers on real sockets, through the proxy as `middlebox proxy`
serves it (PUT /scenario read by compose.load_text, compose.PROXY_STAGES): the preset lends
`keepalive_timeout` and `client_body_timeout`, the scenario shortens one, and the server
closes an idle kept-alive connection or answers a stalled body with nginx's 408."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from functools import partial

import trio

from faults._proxy.request_timeouts import request_timeout_answer
from middlebox.compose import PROXY_STAGES
from middlebox.run.serve import LIBRARY_SCENARIOS
from middlebox.shell.control import ControlApi, ControlledProxy, pass_through, serve_control
from middlebox.shell.server import Address, ProxyConfig, listen
from tests.harness import read_all
from tests.shell.support import http

OK = b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok"


async def keep_alive_upstream(stream: trio.SocketStream) -> None:
    """Answers each request head with OK and keeps the connection until the proxy closes."""
    received = b""
    while True:
        data = await stream.receive_some(65536)
        if not data:
            return
        received += data
        while b"\r\n\r\n" in received:
            head, _, received = received.partition(b"\r\n\r\n")
            if b"Content-Length: 10" in head:
                continue  # a body that never comes whole: no answer (the client stalls)
            await stream.send_all(OK)


@asynccontextmanager
async def proxied(scenario: bytes) -> AsyncIterator[int]:
    async with trio.open_nursery() as nursery:
        listeners = await nursery.start(
            partial(trio.serve_tcp, keep_alive_upstream, 0, host="127.0.0.1")
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
        status, body, _ = await http(control_port, "PUT", "/scenario", scenario)
        assert status == 200, body
        try:
            yield proxy_port
        finally:
            nursery.cancel_scope.cancel()
            listener.close()


def nginx_streaming(proxy: str) -> bytes:
    return f"name: t\npath:\n  - preset: nginx-streaming\nproxy: {proxy}\n".encode()


async def test_an_idle_kept_alive_connection_is_closed_at_the_keepalive_timeout() -> None:
    with trio.fail_after(10):
        async with proxied(nginx_streaming("{keepalive_timeout: 300ms}")) as port:
            stream = await trio.open_tcp_stream("127.0.0.1", port)
            await stream.send_all(b"GET /v1/models HTTP/1.1\r\nHost: a\r\n\r\n")
            data, ended = await read_all(stream)  # without the timer: open until fail_after
            await stream.aclose()
            # the answer, then nginx's silent close of the idle connection (a FIN)
            assert data == OK and ended == "fin"


async def test_a_stalled_body_gets_nginx_s_408_from_the_preset_s_body_timer() -> None:
    with trio.fail_after(10):
        async with proxied(nginx_streaming("{client_body_timeout: 300ms}")) as port:
            stream = await trio.open_tcp_stream("127.0.0.1", port)
            await stream.send_all(
                b"POST /v1/chat/completions HTTP/1.1\r\nHost: a\r\nContent-Length: 10\r\n\r\n{}"
            )
            data, ended = await read_all(stream)
            await stream.aclose()
            assert data == request_timeout_answer() and ended == "fin"
