"""The relay's hot-path choices (docs/performance.md) keep its behaviour: the empty
pipeline's fast path is byte-exact and ends faithfully, pass-through sockets are read
by the shared hub instead of reader tasks, writer and timer tasks start only when
needed, backpressure still holds when a reader stops reading, and one connection's
error or end never touches another's."""

from __future__ import annotations

import errno
import os
import socket
from collections.abc import Callable
from dataclasses import dataclass

import pytest
import trio
from trio.testing import MockClock

import middlebox.shell.hub as hub_module
from faults.latency import Latency
from middlebox.core.fault import Fault, FaultContext, Pipeline
from middlebox.core.stream import Direction, Eof, Item
from middlebox.shell.relay import Relay


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


async def test_an_empty_pipeline_relays_frames_byte_exact_without_per_socket_tasks() -> None:
    frames = [f"data: {n} {'x' * 180}\n\n".encode() for n in range(50)]

    async def work(relay: Relay, client: socket.socket, upstream: socket.socket) -> None:
        assert relay.passthrough
        await send_all(client, b"GET /stream HTTP/1.1\r\n\r\n")
        assert await receive_exactly(upstream, 24) == b"GET /stream HTTP/1.1\r\n\r\n"
        assert relay._hub is not None and set(relay._hub_callbacks) == {"client", "upstream"}
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


def no_fd_for_the_hub(monkeypatch: pytest.MonkeyPatch) -> None:
    """The hub's epoll cannot be made (EMFILE under a flood)."""

    def no_fds_left() -> None:
        raise OSError(errno.EMFILE, "Too many open files")

    monkeypatch.setattr(hub_module.select, "epoll", no_fds_left)


async def test_without_an_fd_for_the_hub_a_connection_reads_with_tasks_instead_of_failing(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    no_fd_for_the_hub(monkeypatch)

    async def work(relay: Relay, client: socket.socket, upstream: socket.socket) -> None:
        await send_all(client, b"ping")
        assert await receive_exactly(upstream, 4) == b"ping"
        assert relay._hub is None and relay.passthrough
        await send_all(upstream, b"pong")
        assert await receive_exactly(client, 4) == b"pong"
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
            # The writer is the hub watching the socket for room (EPOLLOUT), not a task:
            # a hub-served connection opens no nursery.
            assert "client" in relay._hub_writers and relay._nursery is None
            assert relay.client.outbox_bytes <= 512 * 1024
            assert await receive_exactly(client, len(body)) == body
        upstream.shutdown(socket.SHUT_WR)
        assert await receive_end(client) == "fin"
        client.shutdown(socket.SHUT_WR)
        assert await receive_end(upstream) == "fin"

    await relay_between(Pipeline([]), work, buffer=64 * 1024)


def record_schedules(monkeypatch: pytest.MonkeyPatch) -> list[float]:
    """Every deadline put on the hub's heap (`ReadHub.schedule`), in order."""
    scheduled: list[float] = []
    schedule = hub_module.ReadHub.schedule

    def recording(hub: hub_module.ReadHub, due: float, callback: Callable[[], None]) -> int:
        scheduled.append(due)
        return schedule(hub, due, callback)

    monkeypatch.setattr(hub_module.ReadHub, "schedule", recording)
    return scheduled


async def test_a_faulted_connection_is_read_by_the_hub_and_its_deadline_is_a_heap_entry(
    monkeypatch: pytest.MonkeyPatch, autojump_clock: MockClock
) -> None:
    scheduled = record_schedules(monkeypatch)

    async def work(relay: Relay, client: socket.socket, upstream: socket.socket) -> None:
        assert not relay.passthrough
        sent_at = trio.current_time()
        await send_all(upstream, b"held for a moment")
        assert await receive_exactly(client, 17) == b"held for a moment"
        assert relay._hub is not None and set(relay._hub_callbacks) == {"client", "upstream"}
        # Latency held the bytes 20 ms: one entry on the hub's heap released them, and
        # no reader, writer or timer task was started.
        assert len(scheduled) == 1 and scheduled[0] >= sent_at + 0.02
        assert relay._timer_ticket is None and not relay._timer_started
        assert relay._writers == set()
        upstream.shutdown(socket.SHUT_WR)
        assert await receive_end(client) == "fin"
        client.shutdown(socket.SHUT_WR)
        assert await receive_end(upstream) == "fin"

    await relay_between(Pipeline([Latency(delay=0.02)]), work)


@dataclass
class Reaper(Fault):
    """idle_reaper's timing alone: its deadline moves 60 s past every item it sees."""

    last: float = 0.0
    ended: bool = False

    def on_item(self, item: Item, now: float) -> list[Item]:
        self.last = now
        self.ended = self.ended or isinstance(item, Eof)
        return [item]

    def deadline(self) -> float | None:
        return self.last + 60.0 if self.last and not self.ended else None


async def test_a_deadline_that_only_moves_later_keeps_one_heap_entry(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    scheduled = record_schedules(monkeypatch)

    async def work(relay: Relay, client: socket.socket, upstream: socket.socket) -> None:
        for n in range(20):
            await send_all(upstream, b"data: %d\n\n" % n)
            assert await receive_exactly(client, len(b"data: %d\n\n" % n))
        # Twenty moves of the deadline, one entry: it fires early and re-arms then.
        assert len(scheduled) == 1
        upstream.shutdown(socket.SHUT_WR)
        assert await receive_end(client) == "fin"
        client.shutdown(socket.SHUT_WR)
        assert await receive_end(upstream) == "fin"

    await relay_between(Pipeline([Reaper()]), work)


async def test_without_an_fd_for_the_hub_a_faulted_connection_uses_its_timer_task(
    monkeypatch: pytest.MonkeyPatch, autojump_clock: MockClock
) -> None:
    no_fd_for_the_hub(monkeypatch)

    async def work(relay: Relay, client: socket.socket, upstream: socket.socket) -> None:
        assert relay._hub is None and not relay._timer_started
        await send_all(upstream, b"held for a moment")
        assert await receive_exactly(client, 17) == b"held for a moment"
        assert relay._timer_started
        upstream.shutdown(socket.SHUT_WR)
        assert await receive_end(client) == "fin"
        client.shutdown(socket.SHUT_WR)
        assert await receive_end(upstream) == "fin"

    await relay_between(Pipeline([Latency(delay=0.02)]), work)


def open_fds() -> int:
    return len(os.listdir("/proc/self/fd"))


async def test_the_read_hub_closes_its_epoll_when_the_last_relay_ends(
    autojump_clock: MockClock,
) -> None:
    async def work(relay: Relay, client: socket.socket, upstream: socket.socket) -> None:
        await send_all(upstream, b"x")
        assert await receive_exactly(client, 1) == b"x"
        upstream.shutdown(socket.SHUT_WR)
        client.shutdown(socket.SHUT_WR)
        assert await receive_end(client) == "fin"

    before = open_fds()
    await relay_between(Pipeline([]), work)
    with trio.fail_after(5):
        while open_fds() > before:  # the hub's task closes the epoll on its next turn
            await trio.sleep(0.001)
    assert open_fds() == before


class Exploding:
    """An observer with a bug: it fails on the first read it sees."""

    def read(self, leg: str, direction: Direction, data: bytes, now: float) -> None:
        raise RuntimeError("observer bug")

    def wrote(self, leg: str, direction: Direction, data: bytes, now: float) -> None:
        pass

    def ended(self, leg: str, direction: Direction, kind: str, now: float) -> None:
        pass


async def test_an_error_in_a_hub_read_fails_that_relay_only(autojump_clock: MockClock) -> None:
    broken_client, broken_peer = pair()
    broken_upstream, broken_upstream_peer = pair()
    broken = Relay(broken_peer, broken_upstream, Pipeline([]), observer=Exploding())
    errors: list[BaseException] = []

    async def run_broken() -> None:
        try:
            await broken.run()
        except RuntimeError as error:
            errors.append(error)

    async def work(relay: Relay, client: socket.socket, upstream: socket.socket) -> None:
        async with trio.open_nursery() as nursery:
            nursery.start_soon(run_broken)
            await send_all(broken_client, b"boom")
            with trio.fail_after(5):
                while not errors:
                    await trio.sleep(0.001)
            # The healthy relay shares the hub and carries on.
            await send_all(upstream, b"still fine")
            assert await receive_exactly(client, 10) == b"still fine"
        upstream.shutdown(socket.SHUT_WR)
        client.shutdown(socket.SHUT_WR)
        assert await receive_end(client) == "fin"

    await relay_between(Pipeline([]), work)
    for sock in (broken_client, broken_upstream_peer):
        sock.close()
    assert [str(error) for error in errors] == ["observer bug"]
    assert broken.client.closed and broken.upstream.closed


async def test_a_writer_that_fails_on_the_hub_ends_its_connection_and_is_raised(
    autojump_clock: MockClock,
) -> None:
    body = bytes(range(256)) * 4096  # 1 MiB: more than the socket buffers take at once
    client, client_peer = pair(64 * 1024)
    upstream, upstream_peer = pair()
    pipeline = Pipeline([])
    pipeline.bind(FaultContext())
    relay = Relay(client_peer, upstream, pipeline)
    failure: list[BaseException] = []

    async def run_relay() -> None:
        try:
            await relay.run()
        except RuntimeError as error:
            failure.append(error)

    def broken_flush(side: object) -> None:
        raise RuntimeError("a bug in the writer")

    with trio.fail_after(10):
        async with trio.open_nursery() as nursery:
            nursery.start_soon(run_relay)
            nursery.start_soon(send_all, upstream_peer, body)
            while "client" not in relay._hub_writers:
                await trio.sleep(0.01)
            relay._flush = broken_flush  # type: ignore[method-assign]
            await receive_exactly(client, 1024)  # room again: the hub wakes the writer
            while not failure:
                await trio.sleep(0.01)
            nursery.cancel_scope.cancel()
    # The error ended this connection (both sockets closed, off the hub) and came out of
    # `run`, as a failing writer task's did through the relay's nursery.
    assert str(failure[0]) == "a bug in the writer"
    assert relay.client.closed and relay.upstream.closed
    assert relay._hub_writers == {} and relay._hub_callbacks == {}
    for sock in (client, upstream_peer):
        sock.close()


def test_an_fd_closed_without_unregistering_is_registered_afresh_when_reused() -> None:
    # The kernel forgets a closed fd by itself; its number may come back with the next
    # socket, which must be watched for reads although the hub's books still hold it.
    hub = hub_module.ReadHub()
    first, first_peer = pair()
    second, second_peer = pair()
    try:
        fd = first.fileno()
        hub.register(first, lambda: None)
        first.close()  # no unregister
        reused = socket.socket(fileno=os.dup2(second.fileno(), fd))  # the number, again
        hub.register(reused, lambda: None)
        second_peer.send(b"x")
        assert [ready for ready, _ in hub.epoll.poll(1.0)] == [fd]
        reused.close()
    finally:
        for sock in (first_peer, second, second_peer):
            sock.close()
        hub.epoll.close()
