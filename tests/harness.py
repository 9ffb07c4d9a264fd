"""Real-socket test harness: an upstream on 127.0.0.1 and a middlebox proxy in front of it.

Used by the relay, server and fault end-kind tests. Everything listens on loopback
with port 0 and lives inside the test's nursery, so it stops with the test.
"""

from __future__ import annotations

import errno
import os
import socket
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass, replace
from functools import partial
from typing import Any

import pytest
import trio

from middlebox.compose import PROXY_STAGES
from middlebox.scenario.model import Scenario
from middlebox.shell.server import Address, ProxyConfig, ProxyServer, listen

Handler = Callable[[trio.SocketStream], Awaitable[None]]


@dataclass
class Running:
    proxy_port: int
    upstream_port: int
    server: ProxyServer

    async def connect(self) -> trio.SocketStream:
        return await trio.open_tcp_stream("127.0.0.1", self.proxy_port)


@asynccontextmanager
async def proxied(
    handler: Handler, scenario: Scenario | None = None, **server_options: Any
) -> AsyncIterator[Running]:
    """Start `handler` as the upstream and a proxy in front of it; yield their ports.

    `server_options` are `ProxyConfig` fields; the proxy has its own nginx behaviour
    (`PROXY_STAGES`) unless `stages=None` is passed."""
    server_options.setdefault("stages", PROXY_STAGES)
    async with trio.open_nursery() as nursery:
        listeners = await nursery.start(partial(trio.serve_tcp, handler, 0, host="127.0.0.1"))
        upstream_port = listeners[0].socket.getsockname()[1]
        config = ProxyConfig(Address("127.0.0.1", upstream_port), scenario or Scenario(name="test"))
        server = ProxyServer(replace(config, **server_options))
        listener = listen(Address("127.0.0.1", 0))
        proxy_port = await nursery.start(server.serve, listener)
        try:
            yield Running(proxy_port, upstream_port, server)
        finally:
            nursery.cancel_scope.cancel()
            listener.close()


async def read_all(stream: trio.SocketStream) -> tuple[bytes, str]:
    """Read to the end; return the bytes and how it ended: 'fin' or 'rst'."""
    received = bytearray()
    while True:
        try:
            data = await stream.receive_some(65536)
        except trio.BrokenResourceError as error:
            cause = error.__cause__
            if isinstance(cause, OSError) and cause.errno == errno.ECONNRESET:
                return bytes(received), "rst"
            raise
        if not data:
            return bytes(received), "fin"
        received += data


async def send_in_pieces(stream: trio.SocketStream, data: bytes, cuts: list[int]) -> None:
    """Send `data` as separate writes split at the given offsets."""
    previous = 0
    for cut in [*sorted(cuts), len(data)]:
        if cut > previous:
            await stream.send_all(data[previous:cut])
            await trio.lowlevel.checkpoint()  # let the proxy read each piece on its own
        previous = cut


def reset(stream: trio.SocketStream) -> None:
    """Abort with an RST, as a crashing peer or a middlebox would."""
    stream.socket.setsockopt(
        socket.SOL_SOCKET, socket.SO_LINGER, b"\x01\x00\x00\x00\x00\x00\x00\x00"
    )
    stream.socket.close()


def needs(found: object, what: str) -> pytest.MarkDecorator:
    """Skip a test whose system part (Chromium, tshark) is absent on a developer's machine,
    but never in CI: `.ci/run` installs those parts, so there their absence must fail."""
    return pytest.mark.skipif(
        not found and not os.environ.get("CI"),
        reason=f"{what} is not installed here (.ci/run installs it; under CI=true this fails)",
    )


def free_port() -> int:
    """A port on 127.0.0.1 with nothing listening (bound then released)."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])
