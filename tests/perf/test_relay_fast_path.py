"""The relay's hot-path choices (docs/performance.md) keep its behaviour: the empty
pipeline's fast path is byte-exact and ends faithfully, writer and timer tasks start
only when needed, and backpressure still holds when a reader stops reading."""

from __future__ import annotations

import socket

import trio

from faults.latency import Latency
from middlebox.fault import Fault, FaultContext, Pipeline
from middlebox.relay import Relay


def pair(buffer: int | None = None) -> tuple[socket.socket, socket.socket]:
    """A connected loopback TCP pair (the relay reads FIN and RST like a real peer's);
    `buffer` pins both ends' socket buffers (no autotuning), so backpressure shows."""
    with socket.socket() as listener:
        listener.bind(("127.0.0.1", 0))
        listener.listen(1)
        near = socket.socket()
        if buffer is not None:
            near.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, buffer)
            listener.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, buffer)
        near.connect(listener.getsockname())
        far, _ = listener.accept()
    near.setblocking(False)
    far.setblocking(False)
    return near, far


async def send_all(sock: socket.socket, data: bytes) -> None:
    view = memoryview(data)
    while view:
        try:
            view = view[sock.send(view) :]
        except BlockingIOError:
            await trio.lowlevel.wait_writable(sock)


async def receive_exactly(sock: socket.socket, size: int) -> bytes:
    received = bytearray()
    while len(received) < size:
        try:
            data = sock.recv(65536)
        except BlockingIOError:
            await trio.lowlevel.wait_readable(sock)
            continue
        assert data, "unexpected FIN"
        received += data
    return bytes(received)


async def receive_end(sock: socket.socket) -> str:
    while True:
        try:
            data = sock.recv(65536)
        except BlockingIOError:
            await trio.lowlevel.wait_readable(sock)
            continue
        except ConnectionResetError:
            return "rst"
        if not data:
            return "fin"


async def relay_between(pipeline: Fault, work: object, buffer: int | None = None) -> Relay:
    client, client_peer = pair(buffer)
    upstream, upstream_peer = pair()
    pipeline.bind(FaultContext())
    relay = Relay(client_peer, upstream, pipeline)
    with trio.fail_after(10):
        async with trio.open_nursery() as nursery:
            nursery.start_soon(relay.run)
            await work(relay, client, upstream_peer)  # type: ignore[operator]
    for sock in (client, upstream_peer):
        sock.close()
    return relay


async def test_an_empty_pipeline_relays_frames_byte_exact_with_two_tasks_and_carries_fin() -> None:
    frames = [f"data: {n} {'x' * 180}\n\n".encode() for n in range(50)]

    async def work(relay: Relay, client: socket.socket, upstream: socket.socket) -> None:
        assert relay.passthrough
        await send_all(client, b"GET /stream HTTP/1.1\r\n\r\n")
        assert await receive_exactly(upstream, 24) == b"GET /stream HTTP/1.1\r\n\r\n"
        for frame in frames:
            await send_all(upstream, frame)
            assert await receive_exactly(client, len(frame)) == frame
        # Nothing ever blocked and no fault asked for a deadline: no writer, no timer.
        assert relay._writers == set() and not relay._timer_started
        upstream.shutdown(socket.SHUT_WR)
        assert await receive_end(client) == "fin"
        client.shutdown(socket.SHUT_WR)
        assert await receive_end(upstream) == "fin"

    await relay_between(Pipeline([]), work)


async def test_an_rst_from_the_upstream_reaches_the_client_through_the_fast_path() -> None:
    async def work(relay: Relay, client: socket.socket, upstream: socket.socket) -> None:
        await send_all(upstream, b"partial")
        assert await receive_exactly(client, 7) == b"partial"
        upstream.setsockopt(
            socket.SOL_SOCKET, socket.SO_LINGER, b"\x01\x00\x00\x00\x00\x00\x00\x00"
        )
        upstream.close()
        assert await receive_end(client) == "rst"

    await relay_between(Pipeline([]), work)


async def test_a_client_that_stops_reading_starts_a_writer_and_backpressure_bounds_the_relay() -> (
    None
):
    body = bytes(range(256)) * 8192  # 2 MiB, far beyond the socket buffers and HIGH_WATER

    async def work(relay: Relay, client: socket.socket, upstream: socket.socket) -> None:
        async with trio.open_nursery() as nursery:
            nursery.start_soon(send_all, upstream, body)
            # The client reads nothing yet: the relay's write blocks, its writer starts,
            # and the upstream's sender is held back by TCP's window.
            with trio.move_on_after(0.3):
                await trio.sleep_forever()
            assert "client" in relay._writers
            assert relay.client.outbox_bytes <= 512 * 1024
            assert await receive_exactly(client, len(body)) == body
        upstream.shutdown(socket.SHUT_WR)
        assert await receive_end(client) == "fin"
        client.shutdown(socket.SHUT_WR)
        assert await receive_end(upstream) == "fin"

    await relay_between(Pipeline([]), work, buffer=64 * 1024)


async def test_a_fault_with_a_deadline_gets_its_timer_task_only_once_it_holds_bytes() -> None:
    async def work(relay: Relay, client: socket.socket, upstream: socket.socket) -> None:
        assert not relay.passthrough
        assert not relay._timer_started
        await send_all(upstream, b"held for a moment")
        assert await receive_exactly(client, 17) == b"held for a moment"
        assert relay._timer_started
        upstream.shutdown(socket.SHUT_WR)
        assert await receive_end(client) == "fin"
        client.shutdown(socket.SHUT_WR)
        assert await receive_end(upstream) == "fin"

    await relay_between(Pipeline([Latency(delay=0.02)]), work)
