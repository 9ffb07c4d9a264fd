"""No HTTP/2 fault is silently bypassed by bytes that cannot be framed (fail closed, on the HTTP/2
path): a malformed preface, an HTTP/1.1 request on an h2 connection, a malformed frame among
open streams, and a client that does not pick h2 on an h2-only path each fail the connection
closed, with the error said (a GOAWAY with its code, or a failed handshake), and nothing reaches
the upstream past the faults. connection_limit holds unframeable request bytes like any others
(tests/faults/test_connection_limit.py has its unit test)."""

from __future__ import annotations

import ssl
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path

import pytest
import trio
from trio.testing import MockClock

from middlebox.run.serve import load_text
from middlebox.scenario.model import Scenario, TlsOptions
from middlebox.shell.tls import LocalCA
from tests.harness import Running, proxied
from tests.shell.test_h2_streams import H2Client, RawFrames, Seen, streaming_upstream

PROTOCOL_ERROR = 0x1
H2_FAULTS = (
    "  - rst_stream: {stream: 1, after_events: 1}\n"
    "  - h2_window: {stream: 2, after_bytes: 10}\n"
    "  - goaway: {after_streams: 5}\n"
)


def h2_scenario(ca_dir: Path, alpn: tuple[str, ...] = ("h2", "http/1.1")) -> Scenario:
    loaded = load_text(f"name: no-bypass\npath:\n{H2_FAULTS}")
    tls = TlsOptions(ca_dir=str(ca_dir), alpn=alpn)  # type: ignore[arg-type]
    return Scenario(name=loaded.name, path=loaded.path, proxy=type(loaded.proxy)(tls=tls))


@asynccontextmanager
async def no_bypass_proxy(
    tmp_path: Path,
    seen: Seen,
    *,
    forever: bool = False,
    alpn: tuple[str, ...] = ("h2", "http/1.1"),
) -> AsyncIterator[tuple[Running, LocalCA]]:
    """The HTTP/2 faults' TLS proxy (ALPN `alpn`) in front of an upstream noting what it saw
    in `seen` (`forever`: an answer that never ends), and the CA to trust; all within 10 s."""
    ca = LocalCA.load_or_create(tmp_path)
    with trio.fail_after(10):
        upstream = streaming_upstream(seen, forever=forever)
        async with proxied(upstream, h2_scenario(tmp_path, alpn)) as running:
            yield running, ca


async def tls_connect(port: int, ca: LocalCA, alpn: list[str]) -> trio.SSLStream[trio.abc.Stream]:
    context = ssl.create_default_context(cafile=str(ca.cert_path))
    context.set_alpn_protocols(alpn)
    stream = await trio.open_ssl_over_tcp_stream(
        "127.0.0.1", port, ssl_context=context, https_compatible=True
    )
    await stream.do_handshake()
    return stream


async def read_until_closed(stream: trio.SSLStream[trio.abc.Stream]) -> RawFrames:
    frames = RawFrames()
    try:
        while data := await stream.receive_some(65536):
            frames.feed(data)
    except trio.BrokenResourceError:
        pass  # a reset after the GOAWAY
    return frames


@pytest.mark.parametrize(
    "garbage",
    [
        pytest.param(b"PRI * HTTP/2.0\r\n\r\nXX\r\n\r\n", id="malformed-preface"),
        pytest.param(
            b"POST /v1/chat/completions HTTP/1.1\r\nHost: t\r\nContent-Length: 2\r\n\r\n{}",
            id="http1-request-on-h2",
        ),
        pytest.param(b"\x00" * 64, id="zeros"),
    ],
)
async def test_bytes_h2_cannot_frame_fail_the_connection_with_a_goaway(
    tmp_path: Path, garbage: bytes, autojump_clock: MockClock
) -> None:
    seen = Seen()
    async with no_bypass_proxy(tmp_path, seen) as (running, ca):
        stream = await tls_connect(running.proxy_port, ca, ["h2"])
        assert stream.selected_alpn_protocol() == "h2"
        await stream.send_all(garbage)
        frames = await read_until_closed(stream)
        while running.server.active:
            await trio.sleep(0.01)
    assert frames.goaway == (0, PROTOCOL_ERROR)  # the error, said, then the close
    assert seen.requests == []  # nothing reached the upstream


async def test_a_malformed_frame_among_open_streams_resets_every_streams_upstream(
    tmp_path: Path, autojump_clock: MockClock
) -> None:
    seen = Seen()
    async with no_bypass_proxy(tmp_path, seen, forever=True) as (running, ca):
        client = await H2Client.connect(running.proxy_port, ca)
        for n in range(2):
            await client.post(f"/{n}")
        await seen.wait_for(0)
        while len(seen.requests) < 2:
            await trio.sleep(0.01)
        # DATA on stream 0: a connection error (RFC 9113 §6.1)
        await client.stream.send_all(b"\x00\x00\x01\x00\x00\x00\x00\x00\x00X")
        frames = await read_until_closed(client.stream)
        await seen.wait_for(2)
    assert frames.goaway is not None and frames.goaway[1] == PROTOCOL_ERROR
    assert seen.ends == ["rst", "rst"]  # both upstreams are aborted, none left streaming


async def test_a_client_that_does_not_pick_h2_on_an_h2_only_path_is_refused(
    tmp_path: Path, autojump_clock: MockClock
) -> None:
    seen = Seen()
    async with no_bypass_proxy(tmp_path, seen, alpn=("h2",)) as (running, ca):
        for offered in (["http/1.1"], []):
            try:
                stream = await tls_connect(running.proxy_port, ca, offered)
                await stream.send_all(b"GET / HTTP/1.1\r\nHost: t\r\n\r\n")
                answer = await stream.receive_some(65536)
            except (trio.BrokenResourceError, ssl.SSLError):
                answer = b""
            assert answer == b"", offered  # closed: never served as HTTP/1.1
        while running.server.active:
            await trio.sleep(0.01)
        assert running.server.tls_handshake_failures == 2
    assert seen.requests == []  # its HTTP/2 faults were not passed by


async def test_an_h2_only_path_still_serves_h2(tmp_path: Path) -> None:
    seen = Seen()
    async with no_bypass_proxy(tmp_path, seen, alpn=("h2",)) as (running, ca):
        client = await H2Client.connect(running.proxy_port, ca)
        stream_id = await client.post("/ok")
        await client.until(client.all_over)
        assert running.server.tls_handshake_failures == 0
    assert client.answers[stream_id].reset == 0x8  # rst_stream applies to stream 1
