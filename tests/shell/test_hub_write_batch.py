"""Writes a faulted relay makes inside the hub's turn go out at the turn's end, beside the
other sockets' writes (`ReadHub.write_soon`), at most WRITE_BATCH sockets at a time; an
empty pipeline's reads, and writes made outside a turn, are sent at once. The order is
read from one observer shared by the relays (it sees each read and each write as it
happens)."""

from __future__ import annotations

import gc
import socket
import weakref
from dataclasses import dataclass, field

import trio

from faults.set_header import SetHeader
from middlebox.core.fault import FaultContext, Pipeline
from middlebox.core.stream import Chunk, Direction
from middlebox.shell.hub import WRITE_BATCH, acquire_read_hub, release_read_hub
from middlebox.shell.relay import Relay
from tests.shell.test_relay_fast_path import pair, receive_end, receive_exactly, send_all

REQUEST = b"GET /stream HTTP/1.1\r\nHost: x\r\n\r\n"
HEAD = b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nTransfer-Encoding: chunked\r\n\r\n"
HEAD_OUT = HEAD[:-2] + b"X-Accel-Buffering: no\r\n\r\n"
FRAME = b"c\r\ndata: one\n\n\r\n"


@dataclass
class Log:
    """What the relays did, in order: ("read" | "wrote", connection, leg), and how each
    side ended: ("ended", connection, "leg kind")."""

    events: list[tuple[str, int, str]] = field(default_factory=list)

    def observer(self, connection: int) -> Watch:
        return Watch(self, connection)


@dataclass
class Watch:
    log: Log
    connection: int

    def read(self, leg: str, direction: Direction, data: bytes, now: float) -> None:
        self.log.events.append(("read", self.connection, leg))

    def wrote(self, leg: str, direction: Direction, data: bytes, now: float) -> None:
        self.log.events.append(("wrote", self.connection, leg))

    def ended(self, leg: str, direction: Direction, kind: str, now: float) -> None:
        self.log.events.append(("ended", self.connection, f"{leg} {kind}"))


@dataclass
class Connection:
    relay: Relay
    client: socket.socket
    server: socket.socket


def faulted() -> Pipeline:
    """set_header on the responses: a fault on the path that changes no frame's bytes."""
    return Pipeline([SetHeader(headers={"X-Accel-Buffering": "no"})])


async def relays(
    count: int, make: type[Pipeline] | object, log: Log, nursery: trio.Nursery
) -> list[Connection]:
    """`count` relays on the hub, each past its request and response head, `log` cleared."""
    connections = []
    for number in range(count):
        client, client_peer = pair()
        upstream, server = pair()
        pipeline = make()  # type: ignore[operator]
        pipeline.bind(FaultContext(connection_id=number))
        relay = Relay(client_peer, upstream, pipeline, observer=log.observer(number))
        nursery.start_soon(relay.run)
        connections.append(Connection(relay, client, server))
    for each in connections:
        await send_all(each.client, REQUEST)
        assert await receive_exactly(each.server, len(REQUEST)) == REQUEST
        await send_all(each.server, HEAD)
        expected = HEAD_OUT if each.relay.pipeline.faults else HEAD
        assert await receive_exactly(each.client, len(expected)) == expected
    log.events.clear()
    return connections


async def one_frame_each(connections: list[Connection]) -> None:
    """A frame from every server at once (before the hub's next turn), then each client
    gets it."""
    for each in connections:
        each.server.send(FRAME)  # loopback: in the relay's socket when send returns
    for each in connections:
        assert await receive_exactly(each.client, len(FRAME)) == FRAME


def close(connections: list[Connection], nursery: trio.Nursery) -> None:
    for each in connections:
        each.client.close()
        each.server.close()
    nursery.cancel_scope.cancel()


async def one_frame_through(
    count: int, make: type[Pipeline] | object
) -> list[tuple[str, int, str]]:
    """The reads and writes of `count` relays, one frame each, all readable in one turn."""
    log = Log()
    with trio.fail_after(20):
        async with trio.open_nursery() as nursery:
            connections = await relays(count, make, log, nursery)
            await one_frame_each(connections)
            close(connections, nursery)
    return [event for event in log.events if event[0] != "ended"]


async def test_a_faulted_relays_writes_in_a_turn_go_out_together_at_its_end() -> None:
    events = await one_frame_through(3, faulted)
    reads = [event for event in events if event[0] == "read"]
    writes = [event for event in events if event[0] == "wrote"]
    assert sorted(reads) == [("read", n, "upstream") for n in range(3)]
    assert sorted(writes) == [("wrote", n, "client") for n in range(3)]
    # the three reads in one turn, then the three writes at its end
    assert events == reads + writes


async def test_an_empty_pipeline_writes_each_read_at_once() -> None:
    events = await one_frame_through(3, Pipeline)
    assert len(events) == 6
    for read, wrote in zip(events[::2], events[1::2], strict=True):
        assert read[0] == "read" and wrote == ("wrote", read[1], "client")


async def test_at_most_write_batch_sockets_wait_in_one_turn() -> None:
    count = WRITE_BATCH + 2
    events = await one_frame_through(count, faulted)
    kinds = [event[0] for event in events]
    assert kinds.count("read") == kinds.count("wrote") == count
    # WRITE_BATCH reads, their writes, then the rest's reads and writes
    assert kinds[: 2 * WRITE_BATCH] == ["read"] * WRITE_BATCH + ["wrote"] * WRITE_BATCH
    first = events[:WRITE_BATCH]
    assert events[WRITE_BATCH : 2 * WRITE_BATCH] == [
        ("wrote", number, "client") for _, number, _ in first
    ]


async def test_a_write_outside_the_hubs_turn_goes_out_at_once() -> None:
    log = Log()
    with trio.fail_after(10):
        async with trio.open_nursery() as nursery:
            (connection,) = await relays(1, faulted, log, nursery)
            # the control API's way in (`Relay.inject`), from a task, not the hub's turn
            connection.relay.inject([Chunk(Direction.DOWNSTREAM, FRAME)])
            assert log.events == [("wrote", 0, "client")]
            assert connection.client.recv(100) == FRAME  # there before any await
            close([connection], nursery)


async def test_ends_waiting_for_the_turns_end_are_sent_before_the_relay_is_done() -> None:
    """Both peers end in one turn: the FINs wait with the frame, and the relay is not done
    (its sockets closed) until they are sent, each recorded as sent."""
    log = Log()
    with trio.fail_after(10):
        async with trio.open_nursery() as nursery:
            (connection,) = await relays(1, faulted, log, nursery)
            connection.client.shutdown(socket.SHUT_WR)
            connection.server.send(FRAME)
            connection.server.shutdown(socket.SHUT_WR)
            assert await receive_exactly(connection.client, len(FRAME)) == FRAME
            assert await receive_end(connection.client) == "fin"
            assert await receive_end(connection.server) == "fin"
            await connection.relay._done.wait()
            close([connection], nursery)
    ends = [event[2] for event in log.events if event[0] == "ended"]
    assert sorted(ends) == [
        "client read_fin",
        "client sent_fin",
        "upstream read_fin",
        "upstream sent_fin",
    ]


async def test_a_finished_relay_is_freed_without_the_cyclic_collector() -> None:
    """The flush callback a side keeps for the hub holds its relay; the relay lets go of it
    when it ends, so a connection's objects go when the last reference does, not at the
    next garbage collection (thousands of connections a second would make that work)."""
    log = Log()
    # Held here, the hub outlives the relay (its release's frames would hold the relay a
    # moment: a busy proxy's hub is not released per connection).
    hub = acquire_read_hub()
    gc.disable()
    try:
        with trio.fail_after(10):
            async with trio.open_nursery() as nursery:
                (connection,) = await relays(1, faulted, log, nursery)
                connection.server.send(FRAME)
                assert await receive_exactly(connection.client, len(FRAME)) == FRAME
                assert connection.relay.upstream.write_later is not None  # it was used
                connection.client.shutdown(socket.SHUT_WR)
                connection.server.shutdown(socket.SHUT_WR)
                # the relay's task ends by itself (no cancel, whose traceback would hold it)
        connection.client.close()
        connection.server.close()
        freed = weakref.ref(connection.relay)
        del connection
        assert freed() is None
    finally:
        gc.enable()
        release_read_hub(hub)
