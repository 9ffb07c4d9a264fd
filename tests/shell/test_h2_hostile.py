"""Hostile HTTP/2 clients over the TLS proxy (shell/h2_streams.py, core/h2_limits.py): rapid
reset (CVE-2023-44487), a stream reset while it waits for its upstream slot, the slots'
bound, and the CONTINUATION and SETTINGS floods. Real loopback TLS, python-hyper's h2 as the
client (or as the attacker's encoder), every loop bounded in time and count.
"""

from __future__ import annotations

import socket
import ssl
import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import h2.config
import h2.connection
import h2.errors
import pytest
import trio
from trio.testing import MockClock

from bench.h2_rapid_reset import Goaway, attack, chunked_response, h2_preface, rapid_reset
from middlebox.core.h2_limits import ENHANCE_YOUR_CALM, RESET_BURST, RESET_RATE
from middlebox.observe.metrics import Metrics
from middlebox.scenario.model import TlsOptions
from middlebox.shell import h2_streams
from middlebox.shell.tls import LocalCA
from tests.harness import proxied, read_all
from tests.shell.test_h2_streams import H2Client, h2_proxy, read_request, tls_scenario

ATTACK_STREAMS = 10_000
ROUNDS = 3  # attacks (each with a normal stream beside it), and baseline normal streams
NORMAL_PIECES = 10  # the normal stream's answer: ten chunks 20 ms apart
PROTOCOL_ERROR = 0x1


@dataclass
class Upstream:
    """A loopback upstream that counts every connection the proxy dials to it."""

    accepts: int = 0
    open_now: int = 0
    most_open: int = 0
    normal: int = 0
    hold: trio.Event = field(default_factory=trio.Event)  # `/held` answers once it is set

    async def handler(self, stream: trio.SocketStream) -> None:
        self.accepts += 1
        self.open_now += 1
        self.most_open = max(self.most_open, self.open_now)
        try:
            request = await read_request(stream)
            if b"/normal" in request.split(b"\r\n")[0]:
                self.normal += 1
                for piece in chunked_response(b"data: x\n\n" * NORMAL_PIECES, NORMAL_PIECES):
                    await stream.send_all(piece)
                    await trio.sleep(0.02)
            elif b"/held" in request.split(b"\r\n")[0]:
                await self.hold.wait()
                for piece in chunked_response(b"data: held\n\n"):
                    await stream.send_all(piece)
            else:  # an attacking stream that got dialled: it ends by the proxy's RST
                await read_all(stream)
                return
            await stream.aclose()
        except trio.BrokenResourceError:
            pass
        finally:
            self.open_now -= 1


async def normal_stream(port: int, ca: LocalCA) -> float:
    """One POST /normal on a connection of its own: its whole time, its answer checked."""
    started = time.perf_counter()
    client = await H2Client.connect(port, ca)
    stream_id = await client.post("/normal")
    await client.until(client.all_over)
    answer = client.answers[stream_id]
    assert answer.ended and answer.data == b"data: x\n\n" * NORMAL_PIECES
    await trio.aclose_forcefully(client.stream)
    return time.perf_counter() - started


async def test_a_rapid_reset_of_ten_thousand_streams_ends_in_goaway_and_dials_nothing(
    tmp_path: Path,
) -> None:
    """The CVE-2023-44487 pattern, three times: 10,000 HEADERS + RST_STREAM pairs sent at
    once. Each connection ends in GOAWAY ENHANCE_YOUR_CALM once its resets pass the budget
    (a burst of RESET_BURST, RESET_RATE more a second), the streams it reset are never
    dialled (a bounded number at most: a pair split between two reads), and a normal stream
    on another connection, started with each attack, completes whole. Its time against the
    same run's baseline is printed (`make bench` holds the 2x bound: h2_rapid_reset)."""
    payload = rapid_reset(ATTACK_STREAMS)
    ca = LocalCA.load_or_create(tmp_path)
    upstream = Upstream()
    with trio.fail_after(60):
        async with proxied(upstream.handler, tls=TlsOptions(ca_dir=str(tmp_path))) as running:
            baseline = [await normal_stream(running.proxy_port, ca) for _ in range(ROUNDS)]
            goaways: list[Goaway | None] = []
            during: list[float] = []
            for _ in range(ROUNDS):
                async with trio.open_nursery() as nursery:

                    async def one_attack() -> None:
                        goaways.append(await attack(running.proxy_port, ca.cert_path, payload))

                    async def one_normal() -> None:
                        during.append(await normal_stream(running.proxy_port, ca))

                    nursery.start_soon(one_attack)
                    nursery.start_soon(one_normal)
            server = running.server
            metrics = Metrics().render(server, None)
    dials = upstream.accepts - upstream.normal
    opened = 0
    for goaway in goaways:
        assert goaway is not None, "no GOAWAY"
        assert goaway.error_code == ENHANCE_YOUR_CALM
        # Every stream up to the GOAWAY's last stream id was opened and reset: no more than
        # the budget allows in the time the attack took.
        streams = goaway.streams
        assert streams <= RESET_BURST + RESET_RATE * goaway.seconds + 1
        assert streams < ATTACK_STREAMS
        opened += streams
    assert upstream.normal == 2 * ROUNDS
    assert dials <= h2_streams.UPSTREAM_SLOTS
    assert server.h2_reset_floods == ROUNDS
    assert server.h2_streams_reset_before_dial + dials >= opened
    assert f"middlebox_h2_reset_floods_total {ROUNDS}" in metrics
    ratio = statistics.median(during) / statistics.median(baseline)
    print(
        f"rapid reset: {opened} streams opened before {ROUNDS} GOAWAYs, {dials} dialled; "
        f"normal stream {statistics.median(baseline) * 1000:.0f} ms -> "
        f"{statistics.median(during) * 1000:.0f} ms during (x{ratio:.2f})"
    )


async def test_a_client_that_resets_a_few_streams_keeps_its_connection(
    tmp_path: Path, autojump_clock: MockClock
) -> None:
    """Fifty resets, as a browser cancelling a page's requests: well within the budget, no
    GOAWAY, and the next stream on the same connection is served."""
    upstream = Upstream()
    async with h2_proxy(tmp_path, upstream.handler) as (running, client):
        for _ in range(50):
            stream_id = client.conn.get_next_available_stream_id()
            client.conn.send_headers(
                stream_id,
                [(":method", "GET"), (":path", "/x"), (":scheme", "https"), (":authority", "t")],
            )
            client.conn.reset_stream(stream_id, h2.errors.ErrorCodes.CANCEL)
        await client.flush()
        last = await client.post("/normal")
        await client.until(client.all_over)
        assert client.goaway is None
        assert client.answers[last].ended
        assert running.server.h2_reset_floods == 0


async def test_streams_past_the_upstream_slots_wait_and_are_all_served(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, autojump_clock: MockClock
) -> None:
    """Five streams at once with two upstream slots: never more than two upstream
    connections at a time, and no stream is dropped: the others wait their turn."""
    slots = 2
    monkeypatch.setattr(h2_streams, "UPSTREAM_SLOTS", slots)
    upstream = Upstream()
    async with h2_proxy(tmp_path, upstream.handler) as (_running, client):
        ids = [await client.post("/normal") for _ in range(5)]
        await client.until(client.all_over)
    assert all(client.answers[i].ended for i in ids)
    assert upstream.normal == 5
    assert upstream.most_open == slots


async def test_a_stream_reset_while_it_waits_for_a_slot_is_never_dialled(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, autojump_clock: MockClock
) -> None:
    """One slot: stream A holds it (its upstream answers only when told), stream B waits and
    is reset by the client meanwhile. B's upstream connection is never made, and counted."""
    monkeypatch.setattr(h2_streams, "UPSTREAM_SLOTS", 1)
    upstream = Upstream()
    async with h2_proxy(tmp_path, upstream.handler) as (running, client):
        held = await client.post("/held")
        await wait_until(lambda: upstream.accepts == 1)
        waiting = await client.post("/normal")
        client.conn.reset_stream(waiting, h2.errors.ErrorCodes.CANCEL)
        await client.flush()
        await wait_until(lambda: running.server.h2_streams_reset_before_dial == 1)
        upstream.hold.set()
        await client.until(lambda: client.answers[held].ended)
    assert upstream.accepts == 1 and upstream.normal == 0
    assert running.server.h2_streams_reset_before_dial == 1


async def test_a_fault_that_resets_a_waiting_stream_ends_it_without_a_dial(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, autojump_clock: MockClock
) -> None:
    """`rst_stream` firing on a stream that still waits for its upstream slot: the client
    gets the RST_STREAM with the fault's code, no upstream connection is made for it, and
    the session forgets it (nothing left open once the other stream ended)."""
    monkeypatch.setattr(h2_streams, "UPSTREAM_SLOTS", 1)
    scenario = tls_scenario("  - rst_stream: {stream: 2, at: 0.2s, error_code: CANCEL}\n", tmp_path)
    upstream = Upstream()
    async with h2_proxy(tmp_path, upstream.handler, scenario) as (running, client):
        held = await client.post("/held")
        waiting = await client.post("/normal")
        await client.until(lambda: client.answers[waiting].reset is not None)
        assert client.answers[waiting].reset == h2.errors.ErrorCodes.CANCEL
        upstream.hold.set()
        await client.until(lambda: client.answers[held].ended)
        (session,) = running.server._h2_sessions
        await wait_until(lambda: not session.streams)
    assert upstream.accepts == 1 and upstream.normal == 0
    assert running.server.h2_streams_reset_before_dial == 1


async def wait_until(done: Callable[[], bool]) -> None:
    with trio.fail_after(10):
        while not done():
            await trio.sleep(0.01)


def frame(kind: int, flags: int, stream_id: int, payload: bytes) -> bytes:
    return (
        len(payload).to_bytes(3, "big")
        + bytes([kind, flags])
        + stream_id.to_bytes(4, "big")
        + payload
    )


async def test_a_continuation_flood_ends_in_goaway_and_dials_nothing(tmp_path: Path) -> None:
    """HEADERS without END_HEADERS, then CONTINUATION frames that never end the block (the
    2024 CONTINUATION flood, CVE-2024-27316): h2 buffers at most 64 of them, then the
    connection ends with GOAWAY PROTOCOL_ERROR, and nothing is dialled upstream."""
    headers, continuation = 0x1, 0x9
    flood = frame(headers, 0, 1, b"\x82") + frame(continuation, 0, 1, b"\x84" * 16) * 1000
    upstream = Upstream()
    ca = LocalCA.load_or_create(tmp_path)
    with trio.fail_after(10):
        async with proxied(upstream.handler, tls=TlsOptions(ca_dir=str(tmp_path))) as running:
            goaway = await attack(running.proxy_port, ca.cert_path, flood)
            assert running.server.h2_reset_floods == 0
    assert goaway is not None and goaway.error_code == PROTOCOL_ERROR
    assert upstream.accepts == 0


async def test_a_settings_and_ping_flood_from_a_client_that_never_reads_is_not_read_either(
    tmp_path: Path,
) -> None:
    """SETTINGS and PING frames, each of which the proxy must answer with an ACK, from a
    client that reads nothing (CVE-2019-9515, CVE-2019-9512): the answers waiting for it
    reach OUTBOUND_LIMIT and stay there (the proxy stops reading that client, where h2
    alone would queue an ACK for every frame without end), and a normal stream on another
    connection is served meanwhile."""
    settings = frame(0x4, 0, 0, b"")
    ping = frame(0x6, 0, 0, b"12345678")
    chunk = (settings + ping) * 4000  # 104 KB
    upstream = Upstream()
    ca = LocalCA.load_or_create(tmp_path)
    with trio.fail_after(30):
        async with proxied(upstream.handler, tls=TlsOptions(ca_dir=str(tmp_path))) as running:
            sock = trio.socket.socket()
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)  # it reads nothing
            await sock.connect(("127.0.0.1", running.proxy_port))
            context = ssl.create_default_context(cafile=str(ca.cert_path))
            context.set_alpn_protocols(["h2"])
            stream = trio.SSLStream(trio.SocketStream(sock), context, server_hostname="127.0.0.1")
            await stream.do_handshake()
            await stream.send_all(h2_preface())
            (session,) = running.server._h2_sessions
            async with trio.open_nursery() as nursery:

                async def flood() -> None:
                    for _ in range(100):  # 10 MB at most: the proxy stops reading long before
                        await stream.send_all(chunk)

                nursery.start_soon(flood)
                await wait_until(lambda: session.outbound_pending >= h2_streams.OUTBOUND_LIMIT)
                await normal_stream(running.proxy_port, ca)
                pending = session.outbound_pending
                nursery.cancel_scope.cancel()
            await trio.aclose_forcefully(stream)
    assert pending <= h2_streams.OUTBOUND_LIMIT + h2_streams.FRAMES_SLICE * 2
    assert upstream.normal == 1
