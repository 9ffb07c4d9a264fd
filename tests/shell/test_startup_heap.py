"""The proxy freezes what exists once it listens (modules, scenario, composition), so the
collector's full passes scan only what connections make, and thaws it when it returns."""

from __future__ import annotations

import gc
import os
import signal

import trio

from middlebox.scenario.model import Scenario
from middlebox.shell.server import Address, ProxyConfig, ProxyServer, run_proxy


async def test_the_startup_heap_is_frozen_while_the_proxy_serves_and_thawed_after() -> None:
    assert gc.get_freeze_count() == 0
    frozen: list[int] = []
    server = ProxyServer(ProxyConfig(Address("127.0.0.1", 9), Scenario(name="heap")))
    with trio.fail_after(10):
        async with trio.open_nursery() as nursery:

            async def serve() -> None:
                await run_proxy(
                    Address("127.0.0.1", 0),
                    server,
                    ready=lambda _port: frozen.append(gc.get_freeze_count()),
                    grace=0,
                )

            nursery.start_soon(serve)
            while not frozen:
                await trio.sleep(0.01)
            os.kill(os.getpid(), signal.SIGTERM)  # run_proxy's own signal receiver takes it
    assert frozen[0] > 1000  # the interpreter's and middlebox's objects, at least
    assert gc.get_freeze_count() == 0
