"""Byte-exactness under stress: hypothesis drives real sockets through the proxy with
random sizes, write splits and interleavings of both directions (through pass-through
and through byte-preserving faults), and the framers with both directions of an
exchange interleaved at random, and SSE carried inside random HTTP chunking."""

from __future__ import annotations

import itertools
import random
from functools import partial

import trio
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from trio.testing import MockClock

from faults.coalescer import Coalescer
from faults.slicer import Slicer
from middlebox.core.http1 import Http1Exchange, Piece, PieceKind, coalesce, encode_chunk
from middlebox.core.sse import SseFramer
from middlebox.core.stream import Direction
from middlebox.scenario.model import FaultSpec, Scenario
from middlebox.shell.server import Address, ProxyConfig, ProxyServer, listen
from tests.harness import read_all

SCENARIOS = {
    "pass-through": Scenario(name="pass-through"),
    "slicer": Scenario(name="sliced", path=(FaultSpec(Slicer, {}),)),
    "coalescer": Scenario(name="coalesced", path=(FaultSpec(Coalescer, {}),)),
}

sizes = st.lists(
    st.one_of(st.integers(0, 64), st.integers(65, 4096), st.integers(4097, 100_000)),
    max_size=12,
)


async def relay_once(
    scenario: Scenario, up: list[bytes], down: list[bytes], order: list[bool], client_first: bool
) -> tuple[bytes, str, bytes, str]:
    """Send `up` from a client and `down` from an upstream, in `order` (True: a client
    write next), each side reading concurrently; FIN from both ends; return what each
    side received and how its stream ended."""
    upstream_ready: trio.MemorySendChannel[trio.SocketStream]
    upstream_ready, upstream_streams = trio.open_memory_channel(1)
    received: dict[str, tuple[bytes, str]] = {}

    async def upstream(stream: trio.SocketStream) -> None:
        await upstream_ready.send(stream)
        received["upstream"] = await read_all(stream)

    async with trio.open_nursery() as nursery:
        listeners = await nursery.start(partial(trio.serve_tcp, upstream, 0, host="127.0.0.1"))
        upstream_at = Address("127.0.0.1", listeners[0].socket.getsockname()[1])
        server = ProxyServer(ProxyConfig(upstream_at, scenario))
        listener = listen(Address("127.0.0.1", 0))
        port = await nursery.start(server.serve, listener)
        client = await trio.open_tcp_stream("127.0.0.1", port)

        async def client_reader() -> None:
            received["client"] = await read_all(client)

        nursery.start_soon(client_reader)
        server_side = await upstream_streams.receive()
        pending_up, pending_down = list(up), list(down)
        for client_turn in order:
            if client_turn and pending_up:
                await client.send_all(pending_up.pop(0))
            elif pending_down:
                await server_side.send_all(pending_down.pop(0))
            await trio.lowlevel.checkpoint()
        for data in pending_up:
            await client.send_all(data)
        for data in pending_down:
            await server_side.send_all(data)
        ends = [client, server_side] if client_first else [server_side, client]
        for stream in ends:
            await stream.send_eof()
        with trio.fail_after(20):
            while len(received) < 2:
                await trio.sleep(0.005)
        await client.aclose()
        await server_side.aclose()
        nursery.cancel_scope.cancel()
    listener.close()
    return (*received["upstream"], *received["client"])


@settings(
    max_examples=15,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
@given(
    st.sampled_from(sorted(SCENARIOS)),
    sizes,
    sizes,
    st.lists(st.booleans(), max_size=24),
    st.booleans(),
    st.integers(0, 2**32),
)
def test_random_writes_both_ways_cross_the_proxy_byte_exact_and_end_with_fin(
    scenario: str,
    up_sizes: list[int],
    down_sizes: list[int],
    order: list[bool],
    client_first: bool,
    seed: int,
) -> None:
    rng = random.Random(seed)
    up = [rng.randbytes(size) for size in up_sizes]
    down = [rng.randbytes(size) for size in down_sizes]
    got_up, up_end, got_down, down_end = trio.run(
        relay_once,
        SCENARIOS[scenario],
        up,
        down,
        order,
        client_first,
        clock=MockClock(autojump_threshold=0),  # the coalescer's window passes virtually
    )
    assert got_up == b"".join(up)
    assert got_down == b"".join(down)
    assert (up_end, down_end) == ("fin", "fin")


# ---------------------------------------------------------------- the framers


@st.composite
def exchanges(draw: st.DrawFn) -> tuple[bytes, bytes, list[int], list[int]]:
    """A keep-alive connection's request stream and response stream, with where each
    request head ends and where each response starts."""
    requests, responses = b"", b""
    head_ends, response_starts = [], []
    for _ in range(draw(st.integers(1, 4))):
        method = draw(st.sampled_from(["GET", "POST", "HEAD"]))
        body = draw(st.binary(max_size=200)) if method == "POST" else b""
        head = f"{method} /v1/completions HTTP/1.1\r\nHost: x\r\n"
        head += f"Content-Length: {len(body)}\r\n\r\n" if method == "POST" else "\r\n"
        requests += head.encode()
        head_ends.append(len(requests))
        requests += body
        payload = draw(st.binary(max_size=300))
        response_starts.append(len(responses))
        if draw(st.booleans()):
            encoded = (
                b"".join(encode_chunk(payload[i : i + 7]) for i in range(0, len(payload), 7))
                + b"0\r\n\r\n"
            )
            framing = "Transfer-Encoding: chunked"
        else:
            encoded, framing = payload, f"Content-Length: {len(payload)}"
        responses += f"HTTP/1.1 200 OK\r\n{framing}\r\n\r\n".encode()
        responses += b"" if method == "HEAD" else encoded
    return requests, responses, head_ends, response_starts


def cut(data: st.DataObject, stream: bytes) -> list[bytes]:
    cuts = sorted(data.draw(st.lists(st.integers(0, len(stream)), max_size=20)))
    edges = [0, *cuts, len(stream)]
    return [stream[a:b] for a, b in itertools.pairwise(edges)]


def shape(pieces: list[Piece]) -> list[tuple[PieceKind, bytes, int, bool]]:
    return [(p.kind, p.data, p.message, p.end_of_message) for p in coalesce(pieces)]


@settings(max_examples=200, deadline=None)
@given(exchanges(), st.data())
def test_an_exchange_fed_both_directions_interleaved_matches_each_direction_fed_whole(
    exchange: tuple[bytes, bytes, list[int], list[int]], data: st.DataObject
) -> None:
    requests, responses, head_ends, response_starts = exchange
    reference = Http1Exchange()
    whole_up = reference.feed(Direction.UPSTREAM, requests)
    whole_down = reference.feed(Direction.DOWNSTREAM, responses)

    exchange_under_test = Http1Exchange()
    up_parts, down_parts = cut(data, requests), cut(data, responses)
    got: dict[Direction, list[Piece]] = {Direction.UPSTREAM: [], Direction.DOWNSTREAM: []}
    fed = {Direction.UPSTREAM: 0, Direction.DOWNSTREAM: 0}
    while up_parts or down_parts:
        # A response byte can only follow its request's head, as on a real connection.
        next_down_end = fed[Direction.DOWNSTREAM] + (len(down_parts[0]) if down_parts else 0)
        needed = max(
            (end for end, start in zip(head_ends, response_starts, strict=True)
             if start < next_down_end),
            default=0,
        )  # fmt: skip
        may_answer = bool(down_parts) and fed[Direction.UPSTREAM] >= needed
        if may_answer and (not up_parts or data.draw(st.booleans())):
            direction, part = Direction.DOWNSTREAM, down_parts.pop(0)
        else:
            direction, part = Direction.UPSTREAM, up_parts.pop(0)
        got[direction] += exchange_under_test.feed(direction, part)
        fed[direction] += len(part)
    assert shape(got[Direction.UPSTREAM]) == shape(whole_up)
    assert shape(got[Direction.DOWNSTREAM]) == shape(whole_down)
    assert b"".join(p.data for p in got[Direction.DOWNSTREAM]) == responses
    for message in range(len(head_ends)):
        assert exchange_under_test.request_head(message) == reference.request_head(message)
        assert exchange_under_test.request_body(message) == reference.request_body(message)


EVENTS = st.lists(
    st.tuples(
        st.sampled_from(["", "event: delta\n", "id: 7\n", ": keep-alive\n"]),
        st.text(max_size=30).map(lambda text: text.replace("\r", "").replace("\n", "")),
        st.sampled_from(["\n\n", "\r\n\r\n", "\r\r"]),
    ),
    max_size=10,
)


@settings(max_examples=200, deadline=None)
@given(EVENTS, st.data())
def test_sse_inside_random_http_chunking_and_splits_gives_the_same_events(
    events: list[tuple[str, str, str]], data: st.DataObject
) -> None:
    body = "".join(f"{extra}data: {text}{end}" for extra, text, end in events).encode()
    chunk_cuts = cut(data, body)
    wire = b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n"
    wire += b"".join(encode_chunk(part) for part in chunk_cuts if part) + b"0\r\n\r\n"
    reference = SseFramer()
    reference_pieces = reference.feed(body) + reference.feed_eof()  # a lone CR ends at EOF
    expected = [p.event.data for p in reference_pieces if p.event is not None]

    http, sse = Http1Exchange(), SseFramer()
    seen: list[str] = []
    body_bytes = b""
    for part in cut(data, wire):
        for piece in http.feed(Direction.DOWNSTREAM, part):
            if piece.kind is PieceKind.BODY:
                body_bytes += piece.data
                seen += [p.event.data for p in sse.feed(piece.data) if p.event is not None]
            if piece.end_of_message:
                seen += [p.event.data for p in sse.feed_eof() if p.event is not None]
    assert body_bytes == body
    assert seen == expected
    assert len(expected) == sum(1 for *_, end in events)  # every block dispatches
