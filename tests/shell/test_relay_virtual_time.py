"""The relay's timing on loopback socket pairs under trio's MockClock (autojump): a fault's deadline
wakes the driver at its exact virtual time, a paused side resumes when the fault says so,
the outbox bound holds back a fast sender, FINs and RSTs cross, and the proxy's own stages
(header timeout, read timeout) close or step aside at their exact times. No real time
passes: the clock jumps whenever every task waits.
"""

from __future__ import annotations

import socket
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass, field

import trio
from trio.testing import MockClock

from faults._proxy.client_header_timeout import ClientHeaderTimeout
from faults._proxy.proxy_read_timeout import ProxyReadTimeout
from faults.latency import Latency
from faults.testing import bind_for_test
from middlebox.core.fault import Fault, Pipeline, ProxyStage
from middlebox.core.responses import error_response
from middlebox.core.stream import DOWN, Direction, Item
from middlebox.shell.relay import HIGH_WATER, Relay

REQUEST = b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Length: 2\r\n\r\n{}"


@dataclass
class Ends:
    """The test's ends of the two socket pairs: it plays the client and the upstream."""

    client: trio.socket.SocketType
    upstream: trio.socket.SocketType
    relay: Relay
    done_at: list[float] = field(default_factory=list)


def tcp_pair() -> tuple[socket.socket, socket.socket]:
    """A connected pair of TCP sockets on 127.0.0.1 (AF_UNIX pairs have no RST to test)."""
    with socket.create_server(("127.0.0.1", 0)) as listener:
        ours = socket.create_connection(listener.getsockname())
        theirs, _ = listener.accept()
    for sock in (ours, theirs):
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    return ours, theirs


@asynccontextmanager
async def relayed(
    faults: list[Fault], stages: list[ProxyStage] | None = None
) -> AsyncIterator[Ends]:
    """A relay between two socket pairs, running in the background of the test."""
    client_ours, client_theirs = tcp_pair()
    upstream_ours, upstream_theirs = tcp_pair()
    pipeline = Pipeline(faults)
    bind_for_test(pipeline)
    relay = Relay(client_theirs, upstream_theirs, pipeline, stages=stages or ())
    ends = Ends(
        trio.socket.from_stdlib_socket(client_ours),
        trio.socket.from_stdlib_socket(upstream_ours),
        relay,
    )

    async def run() -> None:
        await relay.run()
        ends.done_at.append(trio.current_time())

    async with trio.open_nursery() as nursery:
        nursery.start_soon(run)
        try:
            yield ends
        finally:
            with trio.move_on_after(3600):
                while not ends.done_at:
                    await trio.sleep(1)
            nursery.cancel_scope.cancel()
            ends.client.close()
            ends.upstream.close()


async def receive_exactly(sock: trio.socket.SocketType, size: int) -> bytes:
    data = b""
    while len(data) < size:
        more = await sock.recv(65536)
        assert more, f"closed after {data!r}"
        data += more
    return data


async def read_to_end(sock: trio.socket.SocketType) -> tuple[bytes, str]:
    data = b""
    while True:
        try:
            more = await sock.recv(65536)
        except ConnectionResetError:
            return data, "rst"
        if not more:
            return data, "fin"
        data += more


def reset(sock: trio.socket.SocketType) -> None:
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, b"\x01\x00\x00\x00\x00\x00\x00\x00")
    sock.close()


# ------------------------------------------------------------ deadlines wake the driver


async def test_a_latency_fault_s_deadline_delivers_the_bytes_at_exactly_its_time(
    autojump_clock: MockClock,
) -> None:
    async with relayed([Latency(delay=2.5)]) as ends:
        start = trio.current_time()
        await ends.client.send(b"hello")
        assert await receive_exactly(ends.upstream, 5) == b"hello"
        assert trio.current_time() - start == 2.5
        await ends.upstream.send(b"world")
        assert await receive_exactly(ends.client, 5) == b"world"
        assert trio.current_time() - start == 5.0
        ends.client.shutdown(socket.SHUT_WR)
        ends.upstream.shutdown(socket.SHUT_WR)
        assert await read_to_end(ends.upstream) == (b"", "fin")
        assert await read_to_end(ends.client) == (b"", "fin")
    assert ends.done_at == [start + 7.5]  # each FIN is delayed like data


@dataclass
class HoldUpstreamUntil(Fault):
    """Test fault: stop reading the upstream socket until `until`, then let it flow."""

    until: float = 10.0

    def reading_paused(self, source: Direction) -> bool:
        return source is DOWN and self._now < self.until

    def deadline(self) -> float | None:
        return self.until if self._now < self.until else None

    def on_deadline(self, now: float) -> list[Item]:
        self._now = now
        return []

    def on_item(self, item: Item, now: float) -> list[Item]:
        self._now = now
        return [item]

    _now: float = field(init=False, repr=False, default=0.0)


async def test_a_paused_side_is_read_again_when_the_fault_s_deadline_lifts_the_pause(
    autojump_clock: MockClock,
) -> None:
    start = trio.current_time()
    async with relayed([HoldUpstreamUntil(until=start + 10.0)]) as ends:
        await ends.upstream.send(b"held")
        assert await receive_exactly(ends.client, 4) == b"held"
        assert trio.current_time() - start == 10.0
        ends.upstream.shutdown(socket.SHUT_WR)
        ends.client.shutdown(socket.SHUT_WR)


async def test_a_client_that_never_reads_stops_the_relay_reading_the_upstream(
    autojump_clock: MockClock,
) -> None:
    """The bounded outbox: past HIGH_WATER queued toward the client, the upstream is not
    read, so its socket buffers fill and its sends stop (TCP's window closing)."""
    async with relayed([Latency(delay=0.0)]) as ends:
        sent = 0
        block = b"x" * 65536
        with trio.move_on_after(60):  # virtual: reached only once every task is stuck
            while True:
                sent += await ends.upstream.send(block)
        assert HIGH_WATER <= sent < 64 * HIGH_WATER
        queued = ends.relay.client.outbox_bytes
        assert queued >= HIGH_WATER - len(block)  # it read up to the bound, then stopped
        received = 0
        while received < sent:
            received += len(await ends.client.recv(1 << 20))
        assert received == sent
        ends.upstream.shutdown(socket.SHUT_WR)
        ends.client.shutdown(socket.SHUT_WR)


# ----------------------------------------------------------------- FIN and RST cross


async def test_a_fin_each_way_is_carried_on_its_own(autojump_clock: MockClock) -> None:
    async with relayed([Latency(delay=0.0)]) as ends:
        await ends.client.send(REQUEST)
        ends.client.shutdown(socket.SHUT_WR)
        assert await read_to_end(ends.upstream) == (REQUEST, "fin")
        await ends.upstream.send(b"late answer")  # the other direction is still open
        ends.upstream.shutdown(socket.SHUT_WR)
        assert await read_to_end(ends.client) == (b"late answer", "fin")


async def test_an_upstream_rst_reaches_the_client_as_an_rst(autojump_clock: MockClock) -> None:
    async with relayed([Latency(delay=1.0)]) as ends:
        await ends.upstream.send(b"partial")
        await trio.sleep(0.5)  # virtual: the RST leaves while the bytes are still delayed
        reset(ends.upstream)
        assert await read_to_end(ends.client) == (b"partial", "rst")


# ------------------------------------------------- the proxy's own stages, on the clock


async def test_the_header_timeout_closes_both_peers_at_exactly_its_time(
    autojump_clock: MockClock,
) -> None:
    stage = ClientHeaderTimeout(timeout=60.0)
    start = trio.current_time()
    async with relayed([stage], [stage]) as ends:
        await ends.client.send(b"POST / HTTP/1.1\r\nHost: x\r\n")  # never finished
        assert await read_to_end(ends.client) == (b"", "fin")
        assert trio.current_time() - start == 60.0
        assert await read_to_end(ends.upstream) == (b"POST / HTTP/1.1\r\nHost: x\r\n", "fin")
    # nginx's close(): the relay does not wait for either peer's FIN
    assert ends.done_at == [start + 60.0]


async def test_once_the_head_is_in_the_header_stage_steps_aside_for_the_fast_path(
    autojump_clock: MockClock,
) -> None:
    stage = ClientHeaderTimeout(timeout=60.0)
    async with relayed([stage], [stage]) as ends:
        assert not ends.relay.passthrough
        await ends.client.send(REQUEST)
        assert await receive_exactly(ends.upstream, len(REQUEST)) == REQUEST
        assert ends.relay.passthrough and ends.relay.pipeline.faults == []
        await trio.sleep(120)  # long past the header timeout: nothing fires
        await ends.upstream.send(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok")
        ends.upstream.shutdown(socket.SHUT_WR)
        ends.client.shutdown(socket.SHUT_WR)
        assert await read_to_end(ends.client) == (
            b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok",
            "fin",
        )
        assert await read_to_end(ends.upstream) == (b"", "fin")


async def test_the_read_timeout_answers_504_resets_the_upstream_and_lingers_for_the_client(
    autojump_clock: MockClock,
) -> None:
    stage = ProxyReadTimeout(timeout=30.0)
    start = trio.current_time()
    async with relayed([stage], [stage]) as ends:
        await ends.client.send(REQUEST)
        assert await receive_exactly(ends.upstream, len(REQUEST)) == REQUEST
        assert await read_to_end(ends.client) == (error_response(504), "fin")
        assert trio.current_time() - start == 30.0
        assert await read_to_end(ends.upstream) == (b"", "rst")
        # the client never closes: nginx's lingering close ends it 5 s later
    assert ends.done_at == [start + 35.0]


async def test_an_upstream_byte_re_arms_the_read_timeout(autojump_clock: MockClock) -> None:
    stage = ProxyReadTimeout(timeout=30.0)
    start = trio.current_time()
    head = b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n"
    async with relayed([stage], [stage]) as ends:
        await ends.client.send(REQUEST)
        await receive_exactly(ends.upstream, len(REQUEST))
        await trio.sleep(20)
        await ends.upstream.send(head)
        # mid-response nginx can only close: 30 s after the last byte, at t = 50
        assert await read_to_end(ends.client) == (head, "fin")
        assert trio.current_time() - start == 50.0
    assert ends.done_at == [start + 50.0]


async def test_a_client_rst_passes_through_the_stages_to_the_upstream(
    autojump_clock: MockClock,
) -> None:
    header, read = ClientHeaderTimeout(timeout=60.0), ProxyReadTimeout(timeout=30.0)
    async with relayed([header, read], [header, read]) as ends:
        await ends.client.send(b"POST / HT")
        await trio.sleep(1)
        reset(ends.client)
        assert await read_to_end(ends.upstream) == (b"POST / HT", "rst")
    assert header.deadline() is None and not header.reports  # an RST is not a header timeout
