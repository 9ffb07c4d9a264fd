"""Helpers for the tests that run a proxy on 127.0.0.1: a tiny SSE upstream, a raw HTTP/1.1
client, a proxy with its control API."""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass
from functools import partial
from pathlib import Path

import trio

from middlebox.compose import PROXY_STAGES
from middlebox.run.serve import LIBRARY_SCENARIOS
from middlebox.shell.control import ControlApi, ControlledProxy, pass_through, serve_control
from middlebox.shell.server import Address, ProxyConfig, listen
from tests.harness import read_all, reset

EVENTS = [b'data: {"choices":[{"delta":{"content":"hi"}}]}\n\n', b"data: [DONE]\n\n"]


def chunk(data: bytes) -> bytes:
    return f"{len(data):x}\r\n".encode() + data + b"\r\n"


async def read_head(stream: trio.SocketStream) -> bytes:
    received = b""
    while b"\r\n\r\n" not in received:
        data = await stream.receive_some(65536)
        if not data:
            break
        received += data
    head, _, rest = received.partition(b"\r\n\r\n")
    for line in head.split(b"\r\n"):
        name, _, value = line.partition(b":")
        if name.strip().lower() == b"content-length":
            while len(rest) < int(value):
                data = await stream.receive_some(65536)
                if not data:
                    break
                rest += data
    return head


async def sse_upstream(stream: trio.SocketStream, *, end: str = "complete") -> None:
    """Answer one request with a chunked event stream; `end`: complete, fin (no terminal
    chunk) or rst (an abort after the first event)."""
    if not await read_head(stream):
        return  # a peer that left without a request (`middlebox proxy`'s start-up probe)
    await stream.send_all(
        b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\n"
        b"transfer-encoding: chunked\r\n\r\n" + chunk(EVENTS[0])
    )
    await trio.sleep(0.01)
    if end == "rst":
        reset(stream)
        return
    await stream.send_all(chunk(EVENTS[1]) + (b"0\r\n\r\n" if end == "complete" else b""))
    await stream.aclose()


async def http(
    port: int,
    method: str,
    path: str,
    body: bytes = b"",
    headers: dict[str, str] | None = None,
) -> tuple[int, bytes, str]:
    """One request with `Connection: close`; returns (status, body bytes, how it ended)."""
    stream = await trio.open_tcp_stream("127.0.0.1", port)
    lines = [f"{method} {path} HTTP/1.1", "Host: 127.0.0.1", "Connection: close"]
    lines += [f"{k}: {v}" for k, v in (headers or {}).items()]
    lines.append(f"Content-Length: {len(body)}")
    await stream.send_all(("\r\n".join(lines) + "\r\n\r\n").encode() + body)
    data, ended = await read_all(stream)
    await stream.aclose()
    head, _, rest = data.partition(b"\r\n\r\n")
    status = int(head.split(b" ", 2)[1]) if head else 0
    return status, rest, ended


@dataclass
class Running:
    proxy: ControlledProxy
    proxy_port: int
    control_port: int


@asynccontextmanager
async def controlled(
    token: str | None = None,
    scenario_dir: Path | None = None,
    end: str = "complete",
    upstream_handler: Callable[[trio.SocketStream], Awaitable[None]] | None = None,
) -> AsyncIterator[Running]:
    """A controlled proxy and its control API on this event loop, before `sse_upstream`
    (ending as `end` says) or `upstream_handler`."""
    async with trio.open_nursery() as nursery:
        handler = upstream_handler or partial(sse_upstream, end=end)
        listeners = await nursery.start(partial(trio.serve_tcp, handler, 0, host="127.0.0.1"))
        upstream = Address("127.0.0.1", listeners[0].socket.getsockname()[1])
        proxy = ControlledProxy(
            ProxyConfig(upstream, pass_through(), stages=PROXY_STAGES),
            scenario_dir=scenario_dir,
            allow_scenario_header=scenario_dir is not None,
            loader=LIBRARY_SCENARIOS,
        )
        listener = listen(Address("127.0.0.1", 0))
        proxy_port = await nursery.start(proxy.serve, listener)
        control_port = await nursery.start(
            serve_control, ControlApi(proxy, token), Address("127.0.0.1", 0)
        )
        try:
            yield Running(proxy, proxy_port, control_port)
        finally:
            nursery.cancel_scope.cancel()
            listener.close()
