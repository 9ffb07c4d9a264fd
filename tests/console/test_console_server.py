"""The console's server on this event loop: the control API's authorisation in front of the
page, the feed and the fault edits; the feed's bounded rate (virtual clock); a stream and a
cut seen through a real proxy."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from functools import partial

import h11
import pytest
import trio
import trio.testing

from middlebox.compose import PROXY_STAGES
from middlebox.console.server import FEED_INTERVAL, MAX_REQUEST_BODY, Console, serve_console
from middlebox.run.serve import LIBRARY_SCENARIOS
from middlebox.shell.control import ControlledProxy, pass_through
from middlebox.shell.server import Address, ProxyConfig, listen
from tests.shell.support import http, sse_upstream

TOKEN = "s3cret-token"


@asynccontextmanager
async def console_running(
    token: str | None = None, end: str = "complete"
) -> AsyncIterator[tuple[Console, int, int]]:
    """A proxy before `sse_upstream`, its console attached; yields (console, proxy port,
    console port)."""
    async with trio.open_nursery() as nursery:
        handler = partial(sse_upstream, end=end)
        listeners = await nursery.start(partial(trio.serve_tcp, handler, 0, host="127.0.0.1"))
        upstream = Address("127.0.0.1", listeners[0].socket.getsockname()[1])
        proxy = ControlledProxy(
            ProxyConfig(upstream, pass_through(), stages=PROXY_STAGES), loader=LIBRARY_SCENARIOS
        )
        console = Console(proxy, token, presets=("nginx-default",))
        console.attach()
        listener = listen(Address("127.0.0.1", 0))
        proxy_port = await nursery.start(proxy.serve, listener)
        ui_port = await nursery.start(serve_console, console, Address("127.0.0.1", 0))
        try:
            yield console, proxy_port, ui_port
        finally:
            nursery.cancel_scope.cancel()
            listener.close()


STREAM_REQUEST = b'{"stream": true}'


async def stream_once(proxy_port: int) -> tuple[int, bytes, str]:
    return await http(proxy_port, "POST", "/v1/chat/completions", STREAM_REQUEST)


# Off loopback the console needs the token (check_ui_access); with it set, loopback is
# treated the same way, which is how the control API's own tests simulate off-loopback.
@pytest.mark.parametrize(
    ("method", "path", "body"),
    [
        ("GET", "/", b""),
        ("GET", "/feed", b""),
        ("POST", "/faults", b'{"fault": "latency", "options": {"delay": "10ms"}}'),
        ("DELETE", "/faults/0", b""),
    ],
)
async def test_without_the_token_the_console_answers_401(
    method: str, path: str, body: bytes
) -> None:
    async with console_running(TOKEN) as (console, _, ui_port):
        status, answer, _ = await http(ui_port, method, path, body)
        assert status == 401, answer
        wrong = await http(ui_port, method, path + "?token=wrong", body)
        assert wrong[0] == 401
        assert console.proxy.scenario.path == ()  # no edit got through


async def test_with_the_token_the_page_and_edits_answer() -> None:
    async with console_running(TOKEN) as (console, _, ui_port):
        status, page, _ = await http(ui_port, "GET", f"/?token={TOKEN}")
        assert status == 200 and b"middlebox console" in page and b"EventSource" in page
        assert b"/*CONSOLE_JS*/" not in page  # inlined: one request, nothing from a CDN
        header = {"Authorization": f"Bearer {TOKEN}"}
        added = await http(
            ui_port, "POST", "/faults", b"proxy_buffering: {buffer_size: 4KiB}", header
        )
        assert added[0] == 201, added[1]
        assert [spec.name for spec in console.proxy.scenario.path] == ["proxy_buffering"]
        bad = await http(
            ui_port, "POST", "/faults", b"proxy_buffering: {buffer_size: huge}", header
        )
        assert bad[0] == 400
        # the loader's words, naming the field; the page shows them under the entry
        assert "proxy_buffering.buffer_size: expected a size" in json.loads(bad[1])["problems"][0]
        # a preset from the page's list adds the calibrated hop's faults
        preset = await http(ui_port, "POST", "/faults", b"preset: nginx-default", header)
        assert preset[0] == 201, preset[1]
        assert "proxy_buffering" in [spec.name for spec in console.proxy.scenario.path[1:]]


async def test_loopback_without_a_token_is_free() -> None:
    async with console_running() as (_, _, ui_port):
        assert (await http(ui_port, "GET", "/"))[0] == 200
        assert (await http(ui_port, "GET", "/api/presets"))[0] == 200


async def test_a_stream_and_a_cut_show_in_the_list() -> None:
    async with console_running(end="rst") as (_, proxy_port, ui_port):
        await stream_once(proxy_port)
        with trio.fail_after(5):
            while True:
                status, body, _ = await http(ui_port, "GET", "/api/connections")
                listing = json.loads(body)
                first = listing["connections"][0] if listing["connections"] else None
                if first and first["ending"] is not None:
                    break
                await trio.sleep(0.02)
        assert first["state"] == "cut" and "cut" in first["kinds"]
        assert first["tokens"] == {"upstream": 1, "client": 1}
        assert first["done"] == {"upstream": False, "client": False}
        status, detail, _ = await http(ui_port, "GET", f"/api/streams/{first['id']}")
        assert status == 200 and json.loads(detail)["sides"]["client"]["total_tokens"] == 1


async def test_a_complete_stream_is_done_and_smooth() -> None:
    async with console_running() as (_, proxy_port, ui_port):
        await stream_once(proxy_port)
        with trio.fail_after(5):
            while True:
                listing = json.loads((await http(ui_port, "GET", "/api/connections"))[1])
                first = listing["connections"][0] if listing["connections"] else None
                if first and first["done"]["client"]:
                    break
                await trio.sleep(0.02)
        assert first["kinds"] == [] and first["state"] in ("open", "done")
        assert first["ending"] in (None, "complete")


async def feed_updates(console: Console, seconds: float, *, busy: bool = True) -> int:
    """The updates a feed sends in `seconds` (virtual), the model moving every millisecond
    when `busy`."""
    server, client = trio.testing.memory_stream_pair()
    received = bytearray()

    async def moving() -> None:
        while True:
            console.model.version += 1
            await trio.sleep(0.001)

    async def read() -> None:
        while True:
            received.extend(await client.receive_some(65536))

    async with trio.open_nursery() as nursery:
        if busy:
            nursery.start_soon(moving)
        nursery.start_soon(read)
        nursery.start_soon(console.feed, server, h11.Connection(h11.SERVER))
        await trio.sleep(seconds)
        nursery.cancel_scope.cancel()
    return received.count(b"event: update")


async def test_the_feed_sends_at_most_ten_updates_a_second(
    mock_clock: trio.testing.MockClock,
) -> None:
    mock_clock.autojump_threshold = 0
    proxy = ControlledProxy(
        ProxyConfig(Address("127.0.0.1", 9), pass_through(), stages=PROXY_STAGES),
        loader=LIBRARY_SCENARIOS,
    )
    # free work (a CPU clock that stands still): the rate bound alone
    updates = await feed_updates(Console(proxy, cpu_clock=lambda: 0.0), 2.0)
    assert 2.0 / FEED_INTERVAL - 1 <= updates <= 2.0 / FEED_INTERVAL + 1
    # nothing moves: one update a second keeps the clock going
    quiet = Console(proxy, cpu_clock=lambda: 0.0)
    assert await feed_updates(quiet, 2.05, busy=False) == 3


async def test_a_body_over_the_console_s_limit_is_refused_unread() -> None:
    async with console_running() as (console, _, ui_port):
        over = await http(ui_port, "POST", "/faults", b"x" * (MAX_REQUEST_BODY + 1))
        assert over[0] == 413 and json.loads(over[1]) == {"error": "body too large"}
        # at the limit the body is read and the control API's own route answers it
        at = await http(ui_port, "POST", "/faults", b"x" * MAX_REQUEST_BODY)
        assert at[0] == 400 and "body too large" not in at[1].decode()
        assert console.proxy.scenario.path == ()
