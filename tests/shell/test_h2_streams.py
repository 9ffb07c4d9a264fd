"""HTTP/2 toward the client (shell/h2_streams.py), with python-hyper's h2 as the
client over real loopback TLS: each stream is one HTTP/1.1 connection upstream through the
same pipeline, and END_STREAM/RST_STREAM map to the upstream connection's ends and back.
"""

from __future__ import annotations

import re
import ssl
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from pathlib import Path

import h2.config
import h2.connection
import h2.events
import pytest
import trio
from trio.testing import MockClock

from bench.h2_rapid_reset import chunked_response
from middlebox.run.serve import load_text
from middlebox.scenario.model import Scenario, TlsOptions
from middlebox.shell.tls import LocalCA
from tests.harness import Handler, Running, proxied, read_all, reset

SSE = b'data: {"choices":[{"delta":{"content":"caf\xc3\xa9"}}]}\n\ndata: [DONE]\n\n'


@dataclass
class Seen:
    """What the upstream saw: one entry per connection (its request bytes, its end)."""

    requests: list[bytes] = field(default_factory=list)
    ends: list[str] = field(default_factory=list)
    changed: trio.Event = field(default_factory=trio.Event)

    def note(self) -> None:
        self.changed.set()
        self.changed = trio.Event()

    async def wait_for(self, ends: int) -> None:
        while len(self.ends) < ends:
            await self.changed.wait()


def request_complete(received: bytes) -> bool:
    head, blank, body = received.partition(b"\r\n\r\n")
    if not blank:
        return False
    if b"chunked" in head:
        return body.endswith(b"0\r\n\r\n")
    length = re.search(rb"content-length: (\d+)", head)
    return length is None or len(body) >= int(length.group(1))


async def read_request(stream: trio.SocketStream) -> bytes:
    received = b""
    while not request_complete(received):
        data = await stream.receive_some(65536)
        if not data:
            break
        received += data
    return received


def streaming_upstream(seen: Seen, pause: float = 0.0, forever: bool = False):  # type: ignore[no-untyped-def]
    async def handler(stream: trio.SocketStream) -> None:
        request = await read_request(stream)
        seen.requests.append(request)
        body = SSE + request.split(b"\r\n")[0]  # each stream's answer names its request
        try:
            pieces = chunked_response(body)
            for piece in pieces[:-1] if forever else pieces:  # forever: no last chunk
                await stream.send_all(piece)
                await trio.sleep(pause)
            if forever:
                _data, end = await read_all(stream)
                seen.ends.append(end)
                seen.note()
                return
            await stream.aclose()
            seen.ends.append("closed")
            seen.note()
        except trio.BrokenResourceError:
            seen.ends.append("rst")
            seen.note()

    return handler


@dataclass
class Answer:
    headers: list[tuple[bytes, bytes]] = field(default_factory=list)
    data: bytes = b""
    ended: bool = False
    reset: int | None = None


def answered_so_far(client: H2Client):  # type: ignore[no-untyped-def]
    """Every stream has its answer's first chunks (they end with the request line)."""
    return lambda: all(a.data.endswith(b"HTTP/1.1") for a in client.answers.values())


class H2Client:
    """A minimal HTTP/2 client (sans-IO h2 over trio TLS) for the tests."""

    def __init__(self, stream: trio.SSLStream) -> None:
        self.stream = stream
        self.conn = h2.connection.H2Connection(
            h2.config.H2Configuration(client_side=True, header_encoding=None)
        )
        self.answers: dict[int, Answer] = {}
        self.goaway: h2.events.ConnectionTerminated | None = None

    @classmethod
    async def connect(cls, port: int, ca: LocalCA) -> H2Client:
        context = ssl.create_default_context(cafile=str(ca.cert_path))
        context.set_alpn_protocols(["h2"])
        stream = await trio.open_ssl_over_tcp_stream(
            "127.0.0.1", port, ssl_context=context, https_compatible=True
        )
        await stream.do_handshake()
        assert stream.selected_alpn_protocol() == "h2"
        client = cls(stream)
        client.conn.initiate_connection()
        await client.flush()
        return client

    async def flush(self) -> None:
        await self.stream.send_all(self.conn.data_to_send())

    async def post(self, path: str, body: bytes = b"{}") -> int:
        stream_id = self.conn.get_next_available_stream_id()
        self.conn.send_headers(
            stream_id,
            [(":method", "POST"), (":path", path), (":scheme", "https"), (":authority", "t")],
        )
        self.conn.send_data(stream_id, body, end_stream=True)
        self.answers[stream_id] = Answer()
        await self.flush()
        return stream_id

    async def until(self, done) -> None:  # type: ignore[no-untyped-def]
        while not done():
            data = await self.stream.receive_some(65536)
            if not data:
                return
            for event in self.conn.receive_data(data):
                if isinstance(event, h2.events.ConnectionTerminated):
                    self.goaway = event
                answer = self.answers.get(getattr(event, "stream_id", 0))
                if answer is None:
                    continue
                if isinstance(event, h2.events.ResponseReceived):
                    answer.headers = list(event.headers)
                elif isinstance(event, h2.events.DataReceived):
                    answer.data += event.data
                    self.conn.acknowledge_received_data(
                        event.flow_controlled_length, event.stream_id
                    )
                elif isinstance(event, h2.events.StreamEnded):
                    answer.ended = True
                elif isinstance(event, h2.events.StreamReset):
                    answer.reset = event.error_code
            await self.flush()

    def all_over(self) -> bool:
        return all(a.ended or a.reset is not None for a in self.answers.values())


@asynccontextmanager
async def h2_proxy(
    tmp_path: Path, handler: Handler, scenario: Scenario | None = None
) -> AsyncIterator[tuple[Running, H2Client]]:
    """A TLS proxy (its CA in `tmp_path`, or the scenario's `proxy: {tls:}`) in front of
    `handler`, and an HTTP/2 client connected to it; all within 10 s."""
    ca = LocalCA.load_or_create(tmp_path)
    options: dict[str, object] = {}
    if scenario is None:
        options["tls"] = TlsOptions(ca_dir=str(tmp_path))
    with trio.fail_after(10):
        async with proxied(handler, scenario, **options) as running:
            yield running, await H2Client.connect(running.proxy_port, ca)


def tls_scenario(path_yaml: str, ca_dir: Path, name: str = "h2-fault") -> Scenario:
    """A scenario of `path_yaml`'s faults whose proxy terminates TLS with the CA in `ca_dir`."""
    loaded = load_text(f"name: {name}\npath:\n{path_yaml}")
    return Scenario(
        name=loaded.name,
        path=loaded.path,
        proxy=type(loaded.proxy)(tls=TlsOptions(ca_dir=str(ca_dir))),
    )


async def posts_at_once(
    tmp_path: Path, scenario: Scenario, *, pause: float, upstream_ends: int = 0
) -> tuple[H2Client, list[Answer], Seen]:
    """POST /0, /1 and /2 on three streams at once through `scenario`'s TLS proxy, in front of
    an upstream pausing `pause` s between chunks; back when every stream is over and
    `upstream_ends` upstream connections ended: the client, the three answers, the upstream's
    view."""
    seen = Seen()
    async with h2_proxy(tmp_path, streaming_upstream(seen, pause=pause), scenario) as (
        _running,
        client,
    ):
        ids = [await client.post(f"/{n}") for n in range(3)]
        await client.until(client.all_over)
        await seen.wait_for(upstream_ends)
    return client, [client.answers[i] for i in ids], seen


async def test_two_multiplexed_streams_each_get_their_own_upstream_connection(
    tmp_path: Path, autojump_clock: MockClock
) -> None:
    seen = Seen()
    async with h2_proxy(tmp_path, streaming_upstream(seen, pause=0.01)) as (running, client):
        first = await client.post("/one", b'{"n":1}')
        second = await client.post("/two", b'{"n":2}')
        await client.until(client.all_over)
        await seen.wait_for(2)
        assert running.server.connections_accepted == 3  # the TLS connection + 2 streams
    one, two = client.answers[first], client.answers[second]
    assert one.data == SSE + b"POST /one HTTP/1.1" and one.ended
    assert two.data == SSE + b"POST /two HTTP/1.1" and two.ended
    assert (b":status", b"200") in one.headers
    assert b"transfer-encoding" not in dict(one.headers)  # forbidden in HTTP/2
    assert sorted(seen.requests) == sorted(
        b"POST /%s HTTP/1.1\r\nhost: t\r\ntransfer-encoding: chunked\r\nconnection: close"
        b"\r\n\r\n7\r\n%s\r\n0\r\n\r\n" % (name, body)
        for name, body in ((b"one", b'{"n":1}'), (b"two", b'{"n":2}'))
    )


async def test_a_fault_in_the_path_acts_on_each_stream_on_its_own(
    tmp_path: Path, autojump_clock: MockClock
) -> None:
    cut = "  - cut: {after: bytes, count: 20, end: rst}\n"
    scenario = tls_scenario(cut, tmp_path, name="cut-each-stream")
    client, answers, _seen = await posts_at_once(tmp_path, scenario, pause=0.01)
    for answer in answers:
        assert answer.reset == 0x2  # INTERNAL_ERROR: the upstream leg was reset
        # cut's default `where: event_boundary`: the first boundary after body byte 20
        assert answer.data == SSE[: SSE.index(b"\n\n") + 2]
    assert client.conn.state_machine.state.name != "CLOSED"  # the connection lives on


async def test_a_client_rst_stream_resets_that_streams_upstream_connection_only(
    tmp_path: Path,
) -> None:
    seen = Seen()
    async with h2_proxy(tmp_path, streaming_upstream(seen, forever=True)) as (_running, client):
        cancelled = await client.post("/cancelled")
        kept = await client.post("/kept")
        await client.until(answered_so_far(client))
        client.conn.reset_stream(cancelled, error_code=0x8)
        await client.flush()
        await seen.wait_for(1)
        assert seen.ends == ["rst"]
        assert not client.answers[kept].ended and client.answers[kept].reset is None
        await client.stream.aclose()
        await seen.wait_for(2)
    assert seen.ends == ["rst", "rst"]


async def test_dropping_the_connection_resets_every_multiplexed_stream_at_once(
    tmp_path: Path,
) -> None:
    seen = Seen()
    async with h2_proxy(tmp_path, streaming_upstream(seen, forever=True)) as (_running, client):
        for n in range(4):
            await client.post(f"/{n}")
        await client.until(answered_so_far(client))
        transport = client.stream.transport_stream
        assert isinstance(transport, trio.SocketStream)
        reset(transport)
        await seen.wait_for(4)
    assert seen.ends == ["rst"] * 4


async def test_an_upstream_reset_mid_answer_is_an_rst_stream_for_that_stream(
    tmp_path: Path, autojump_clock: MockClock
) -> None:
    async def reset_after_head(stream: trio.SocketStream) -> None:
        await read_request(stream)
        await stream.send_all(chunked_response(SSE)[0] + b"5\r\nhello\r\n")
        await trio.sleep(0.05)
        reset(stream)

    async with h2_proxy(tmp_path, reset_after_head) as (_running, client):
        stream_id = await client.post("/x")
        await client.until(client.all_over)
    answer = client.answers[stream_id]
    assert answer.data == b"hello" and answer.reset == 0x2 and not answer.ended


async def test_an_upstream_that_closes_cleanly_mid_chunked_body_is_still_a_reset(
    tmp_path: Path,
) -> None:
    async def close_early(stream: trio.SocketStream) -> None:
        await read_request(stream)
        await stream.send_all(chunked_response(SSE)[0] + b"5\r\nhello\r\n")
        await stream.aclose()

    async with h2_proxy(tmp_path, close_early) as (_running, client):
        stream_id = await client.post("/x")
        await client.until(client.all_over)
    assert client.answers[stream_id].reset == 0x2  # never a clean END_STREAM on half an answer


async def test_a_clean_end_of_an_h2_connection_leaves_no_stream_running(
    tmp_path: Path, autojump_clock: MockClock
) -> None:
    seen = Seen()
    async with h2_proxy(tmp_path, streaming_upstream(seen)) as (running, client):
        await client.post("/x")
        await client.until(client.all_over)
        client.conn.close_connection()
        await client.flush()
        await client.stream.aclose()
        while running.server.active:
            await trio.sleep(0.01)
    assert running.server.active == 0 and seen.ends == ["closed"]


async def send_within_windows(client: H2Client, stream_id: int, body: bytes) -> None:
    """Send `body` as DATA frames no larger than the proxy's windows allow, waiting for its
    WINDOW_UPDATEs: the proxy must reopen them as the relay takes the bytes."""
    view = memoryview(body)
    while view:
        window = min(
            client.conn.local_flow_control_window(stream_id), client.conn.max_outbound_frame_size
        )
        if window <= 0:
            data = await client.stream.receive_some(65536)
            assert data, "the proxy closed while the upload waited for a window"
            for event in client.conn.receive_data(data):
                if isinstance(event, h2.events.DataReceived):
                    client.answers[stream_id].data += event.data
            continue
        piece, view = view[:window], view[window:]
        client.conn.send_data(stream_id, bytes(piece), end_stream=not view)
        await client.flush()


async def test_a_request_body_larger_than_the_initial_window_arrives_whole(
    tmp_path: Path,
) -> None:
    seen = Seen()
    body = bytes(range(256)) * 1024  # 256 KiB: four times HTTP/2's initial 64 KiB window
    ca = LocalCA.load_or_create(tmp_path)
    with trio.fail_after(20):
        async with proxied(
            streaming_upstream(seen), tls=TlsOptions(ca_dir=str(tmp_path))
        ) as running:
            client = await H2Client.connect(running.proxy_port, ca)
            stream_id = client.conn.get_next_available_stream_id()
            client.conn.send_headers(
                stream_id,
                [(":method", "POST"), (":path", "/big"), (":scheme", "https"),
                 (":authority", "t"), ("content-length", str(len(body)))],
            )  # fmt: skip
            client.answers[stream_id] = Answer()
            await send_within_windows(client, stream_id, body)
            await client.until(client.all_over)
    (request,) = seen.requests
    head, _, received = request.partition(b"\r\n\r\n")
    assert b"content-length: 262144" in head
    assert received == body
    assert client.answers[stream_id].ended


async def test_shutdown_resets_an_http2_connection_and_its_open_streams(tmp_path: Path) -> None:
    seen = Seen()
    async with h2_proxy(tmp_path, streaming_upstream(seen, forever=True)) as (running, client):
        for n in range(2):
            await client.post(f"/{n}")
        await client.until(answered_so_far(client))
        await running.server.shutdown(grace=0.05)
        await seen.wait_for(2)
        assert running.server.active == 0
        with pytest.raises(trio.BrokenResourceError):
            while await client.stream.receive_some(65536):
                pass
    assert seen.ends == ["rst", "rst"]
    assert running.server.reset_at_shutdown >= 1


@dataclass
class RawFrames:
    """Frames read without h2's state machine: python-hyper's h2 refuses a DATA frame after
    a GOAWAY (its connection is CLOSED then), though RFC 9113 §6.8 lets streams up to the
    last stream id finish, as curl's nghttp2 does. Enough to follow one drain."""

    buffer: bytes = b""
    data: dict[int, bytes] = field(default_factory=dict)
    ended: set[int] = field(default_factory=set)
    goaway: tuple[int, int] | None = None  # (last stream id, error code)
    resets: dict[int, int] = field(default_factory=dict)  # stream id -> error code

    def feed(self, data: bytes) -> None:
        self.buffer += data
        while len(self.buffer) >= 9:
            length = int.from_bytes(self.buffer[:3], "big")
            if len(self.buffer) < 9 + length:
                return
            kind, flags = self.buffer[3], self.buffer[4]
            stream_id = int.from_bytes(self.buffer[5:9], "big") & 0x7FFFFFFF
            payload, self.buffer = self.buffer[9 : 9 + length], self.buffer[9 + length :]
            if kind == 0x0:  # DATA (the proxy sends no padding)
                self.data[stream_id] = self.data.get(stream_id, b"") + payload
            if kind == 0x3:  # RST_STREAM
                self.resets[stream_id] = int.from_bytes(payload[:4], "big")
            if kind == 0x7:  # GOAWAY
                last = int.from_bytes(payload[:4], "big") & 0x7FFFFFFF
                self.goaway = (last, int.from_bytes(payload[4:8], "big"))
            if kind in (0x0, 0x1) and flags & 0x1:  # END_STREAM on DATA or HEADERS
                self.ended.add(stream_id)


async def test_a_graceful_shutdown_sends_goaway_and_lets_the_stream_in_flight_finish(
    tmp_path: Path, autojump_clock: MockClock
) -> None:
    seen = Seen()
    ca = LocalCA.load_or_create(tmp_path)
    frames = RawFrames()
    with trio.fail_after(10):
        async with proxied(
            streaming_upstream(seen, pause=0.05), tls=TlsOptions(ca_dir=str(tmp_path))
        ) as running:
            client = await H2Client.connect(running.proxy_port, ca)
            stream_id = await client.post("/draining")
            late: int | None = None
            async with trio.open_nursery() as nursery:
                nursery.start_soon(running.server.shutdown, 5.0)
                while data := await client.stream.receive_some(65536):
                    frames.feed(data)  # until the proxy closes the drained connection
                    if frames.goaway and late is None:
                        late = await client.post("/after-goaway")  # crossing the GOAWAY
            await seen.wait_for(1)
            assert running.server.reset_at_shutdown == 0
    assert frames.goaway == (stream_id, 0)  # NO_ERROR, the stream in flight is served
    assert stream_id in frames.ended
    assert frames.data[stream_id] == SSE + b"POST /draining HTTP/1.1"
    assert seen.ends == ["closed"]
    assert late is not None and frames.resets == {late: 0x7}  # REFUSED_STREAM: retry elsewhere
    assert len(seen.requests) == 1  # the refused stream never reached the upstream
