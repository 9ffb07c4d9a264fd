"""`dial`: a numeric upstream is connected without a resolver call; a name is resolved."""

from __future__ import annotations

import socket
from typing import Any

import pytest
import trio

from middlebox.shell import server as server_module
from middlebox.shell.server import Address, dial


async def _dial_counting(monkeypatch: pytest.MonkeyPatch, host: str) -> int:
    """Dial `host` at a listener on 127.0.0.1 and count the resolver calls it made."""
    calls: list[str] = []
    resolve = trio.socket.getaddrinfo

    async def counting(name: Any, *args: Any, **kwargs: Any) -> Any:
        calls.append(name)
        return await resolve("127.0.0.1", *args, **kwargs)

    monkeypatch.setattr(server_module.trio.socket, "getaddrinfo", counting)
    with socket.create_server(("127.0.0.1", 0)) as listener:
        sock = await dial(Address(host, listener.getsockname()[1]))
        try:
            assert sock.getpeername() == listener.getsockname()
            assert not sock.getblocking()
        finally:
            sock.close()
    return len(calls)


async def test_a_numeric_upstream_is_dialled_without_the_resolver(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    assert await _dial_counting(monkeypatch, "127.0.0.1") == 0


async def test_a_named_upstream_is_resolved(monkeypatch: pytest.MonkeyPatch) -> None:
    assert await _dial_counting(monkeypatch, "localhost") == 1


async def test_a_refused_numeric_dial_raises_the_connect_error() -> None:
    with socket.create_server(("127.0.0.1", 0)) as listener:
        port = listener.getsockname()[1]
    with pytest.raises(ConnectionRefusedError):
        await dial(Address("127.0.0.1", port))
