"""Serving: the aiohttp runner on HOST:PORT, and the readiness banner.

`serve` is the async form (cancel it, or set `stop`); `run_emulator` blocks this thread.
Disconnects (docs/emulator.md, "Fidelity notes"): the server runs with aiohttp's handler
cancellation, so a client that closes, resets or half-closes (aiohttp, like uvicorn, lets
the transport close on EOF) cancels its handler at once, even while the request is queued
or in prefill, as Starlette under uvicorn cancels vLLM's generator (ASGI spec 2.3).

The banner `listening on http://HOST:PORT` is the first stdout line of the emulator's
process (`python -m vllm_emulator`, `middlebox emulate`), flushed, so a parent that asked
for port 0 reads the port it got. It is written here and nowhere else.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable

from aiohttp import web

from vllm_emulator.api_handlers import add_routes
from vllm_emulator.config import EmulatorConfig
from vllm_emulator.handlers import make_app

BANNER_PREFIX = "listening on "


def banner(host: str, port: int) -> str:
    """`listening on http://HOST:PORT`; an IPv6 literal gets the brackets a URL needs."""
    shown = f"[{host}]" if ":" in host else host
    return f"{BANNER_PREFIX}http://{shown}:{port}"


def print_banner(host: str) -> Callable[[int], None]:
    """A `ready` callback that writes the banner as the first stdout line, flushed."""

    def ready(port: int) -> None:
        print(banner(host, port), flush=True)

    return ready


async def serve(
    config: EmulatorConfig,
    host: str,
    port: int,
    ready: Callable[[int], None] | None = None,
    stop: asyncio.Event | None = None,
) -> None:
    """Serve until cancelled (or `stop` is set); `ready(port)` once listening."""
    # handler_cancellation: a disconnect cancels the handler at once, like Starlette
    # under uvicorn (ASGI spec 2.3) cancels vLLM's generator (reference §3.1).
    app = make_app(config)
    add_routes(app)  # the Responses and Messages APIs (api_handlers.py)
    runner = web.AppRunner(
        app,
        handler_cancellation=True,
        access_log=None,
        keepalive_timeout=config.http_keep_alive_timeout,
    )
    await runner.setup()
    site = web.TCPSite(runner, host, port, backlog=4096)
    await site.start()
    try:
        bound = int(runner.addresses[0][1]) if runner.addresses else port
        if ready is not None:
            ready(bound)
        await (stop.wait() if stop is not None else asyncio.Event().wait())
    finally:
        with contextlib.suppress(Exception):
            await runner.cleanup()


def run_emulator(
    config: EmulatorConfig,
    host: str = "127.0.0.1",
    port: int = 0,
    ready: Callable[[int], None] | None = None,
) -> None:
    """Run the emulator in this thread until interrupted; `ready(port)` once listening."""
    with contextlib.suppress(KeyboardInterrupt):
        asyncio.run(serve(config, host, port, ready))
