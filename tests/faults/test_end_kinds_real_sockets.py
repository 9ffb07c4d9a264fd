"""Each way a stream can end, as a real HTTP client sees it through the real proxy.

An upstream on 127.0.0.1 streams vLLM-shaped SSE (one HTTP chunk per event, a few ms
apart); the proxy runs one fault; httpx reads the stream as an application would.
Every test is bounded by trio.fail_after.
"""

from __future__ import annotations

import errno
from typing import Any

import httpx
import pytest
import trio
from trio.testing import MockClock

from faults.cut import Cut
from faults.idle_reaper import IdleReaper
from middlebox.core.fault import Fault
from middlebox.core.http1 import LAST_CHUNK_BYTES
from middlebox.scenario.model import FaultSpec, Scenario
from tests.faults.httpstreams import DONE, SSE_HEAD, chunked, event
from tests.harness import proxied

EVENTS = [event(f"t{i}") for i in range(6)]


def scenario(cls: type[Fault], **config: Any) -> Scenario:
    return Scenario(name=f"end-kind-{cls.name}", path=(FaultSpec(cls, config),))


async def read_request(stream: trio.SocketStream) -> bytes:
    """Read one request with a Content-Length body (what httpx sends for JSON)."""
    data = b""
    while b"\r\n\r\n" not in data:
        data += await stream.receive_some(65536)
    head, _, body = data.partition(b"\r\n\r\n")
    length = next(
        int(line.split(b":", 1)[1])
        for line in head.split(b"\r\n")
        if line.lower().startswith(b"content-length:")
    )
    while len(body) < length:
        body += await stream.receive_some(65536)
    return head


class Upstream:
    """Streams EVENTS then [DONE]; records whether it saw the client's close."""

    def __init__(self, *, respond: bool = True) -> None:
        self.respond = respond
        self.saw_close = trio.Event()

    async def __call__(self, stream: trio.SocketStream) -> None:
        try:
            await read_request(stream)
            if self.respond:
                await stream.send_all(SSE_HEAD)
                for data in chunked(*EVENTS, DONE):
                    await trio.sleep(0.01)
                    await stream.send_all(data)
                await stream.send_all(LAST_CHUNK_BYTES)
            while await stream.receive_some(65536):
                pass
            self.saw_close.set()
        except (trio.BrokenResourceError, trio.ClosedResourceError):
            self.saw_close.set()


async def stream_events(port: int, received: list[str]) -> httpx.Response:
    """POST a streaming chat request and collect its `data:` lines as they arrive."""
    async with (
        httpx.AsyncClient(timeout=httpx.Timeout(5.0)) as client,
        client.stream(
            "POST",
            f"http://127.0.0.1:{port}/v1/chat/completions",
            json={"model": "m", "stream": True},
        ) as response,
    ):
        async for line in response.aiter_lines():
            if line.startswith("data: "):
                received.append(line[6:])
        return response


def caused_by(error: BaseException, code: int) -> bool:
    while error is not None:
        if isinstance(error, OSError) and error.errno == code:
            return True
        error = error.__cause__ or error.__context__  # type: ignore[assignment]
    return False


async def test_rst_reaches_the_client_as_a_connection_reset(autojump_clock: MockClock) -> None:
    received: list[str] = []
    with trio.fail_after(10):
        async with proxied(Upstream(), scenario(Cut, after="events", count=2)) as running:
            with pytest.raises(httpx.ReadError) as caught:
                await stream_events(running.proxy_port, received)
    assert caused_by(caught.value, errno.ECONNRESET)
    assert len(received) <= 2 and "[DONE]" not in received


async def test_fin_without_done_looks_like_a_normal_end_to_the_client(
    autojump_clock: MockClock,
) -> None:
    received: list[str] = []
    with trio.fail_after(10):
        async with proxied(Upstream(), scenario(Cut, count=2, end="fin")) as running:
            response = await stream_events(running.proxy_port, received)
    # No exception, a 200, two events and no [DONE]: a silent truncation.
    assert response.status_code == 200
    assert received == [e[6:-2].decode() for e in EVENTS[:2]]


async def test_a_truncated_chunked_body_is_a_protocol_error_for_the_client(
    autojump_clock: MockClock,
) -> None:
    received: list[str] = []
    with trio.fail_after(10):
        scene = scenario(Cut, count=3, end="truncated_chunked")
        async with proxied(Upstream(), scene) as running:
            with pytest.raises(httpx.RemoteProtocolError, match="incomplete chunked read"):
                await stream_events(running.proxy_port, received)
    assert received == [e[6:-2].decode() for e in EVENTS[:3]]


async def test_a_hang_leaves_the_client_waiting_until_its_own_timeout_then_its_close_passes(
    autojump_clock: MockClock,
) -> None:
    received: list[str] = []
    upstream = Upstream()
    with trio.fail_after(10):
        async with proxied(upstream, scenario(Cut, count=2, end="hang")) as running:
            with trio.move_on_after(0.5) as waiting:
                await stream_events(running.proxy_port, received)
            assert waiting.cancelled_caught  # the client gave up, not the stream
            await upstream.saw_close.wait()  # the client's close reached the server
    assert received == [e[6:-2].decode() for e in EVENTS[:2]]


@pytest.mark.parametrize(("before_headers", "status"), [("504", 504), ("502", 502)])
async def test_an_idle_reaper_before_headers_answers_with_nginx_error_page(
    before_headers: str, status: int, autojump_clock: MockClock
) -> None:
    upstream = Upstream(respond=False)
    scene = scenario(IdleReaper, timeout=0.2, before_headers=before_headers)
    with trio.fail_after(10):
        async with proxied(upstream, scene) as running:
            async with httpx.AsyncClient(timeout=httpx.Timeout(5.0)) as client:
                response = await client.post(
                    f"http://127.0.0.1:{running.proxy_port}/v1/chat/completions",
                    json={"model": "m", "stream": True},
                )
            await upstream.saw_close.wait()  # the proxy closed the upstream connection
    assert response.status_code == status
    assert response.headers["server"] == "nginx"
    assert f"<center><h1>{status} " in response.text
