"""A running proxy passes an SSE stream's frames through the bench's three faults in one lane
(`core/framed.py` `BodyLane`): over real sockets, frame by frame in lockstep (each frame is
one read at the proxy), the client gets every byte the server sent, the head with
set_header's field, and the lane takes the frames after the first; a journal still sees
every frame's event; with a lazy read timer, the same bytes and no lane."""

from __future__ import annotations

import pytest
import trio

from middlebox.compose import load_text
from middlebox.core.framed import BodyLane
from middlebox.core.http1 import LAST_CHUNK_BYTES, encode_chunk
from middlebox.core.stream import Direction
from middlebox.observe.journal import JournalStore
from middlebox.run.serve import proxy_config
from middlebox.shell.server import Address, ProxyServer, listen
from tests.shell.test_hub_connection import THREE_FAULTS

LAZY_READ_TIMER = """
name: lazy
path:
  - set_header: {}
  - idle_reaper: {timeout: 600s, lazy: 300ms}
"""
REQUEST = b"GET /v1/stream HTTP/1.1\r\nHost: x\r\n\r\n"
SSE_HEAD = (
    b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ntransfer-encoding: chunked\r\n\r\n"
)
FRAMES = 12


def frame(i: int) -> bytes:
    return encode_chunk(b'data: {"choices":[{"delta":{"content":"t%d"}}]}\n\n' % i)


async def stream_through(
    journal: JournalStore | None = None, scenario: str = THREE_FAULTS
) -> tuple[bytes, int]:
    """One SSE response relayed frame by frame: what the client got, and how many reads
    the lane took."""
    taken = 0
    take = BodyLane.take

    def counting(self: BodyLane, data: bytes, now: float) -> bool:
        nonlocal taken
        accepted = take(self, data, now)
        taken += accepted
        return accepted

    got_frame = trio.Event()
    sent: list[bytes] = []

    async def upstream(stream: trio.SocketStream) -> None:
        nonlocal got_frame
        request = b""
        while not request.endswith(b"\r\n\r\n"):
            request += await stream.receive_some(65536)
        for data in [SSE_HEAD, *(frame(i) for i in range(FRAMES))]:
            sent.append(data)
            await stream.send_all(data)
            await got_frame.wait()  # one frame a read at the proxy
            got_frame = trio.Event()
        await stream.send_all(LAST_CHUNK_BYTES)
        sent.append(LAST_CHUNK_BYTES)

    with pytest.MonkeyPatch.context() as patch, trio.fail_after(10):
        patch.setattr(BodyLane, "take", counting)
        async with trio.open_nursery() as nursery:
            upstream_listener, *_ = await nursery.start(trio.serve_tcp, upstream, 0)
            config = proxy_config(
                Address("127.0.0.1", upstream_listener.socket.getsockname()[1]),
                load_text(scenario),
                journal=journal,
            )
            listener = listen(Address("127.0.0.1", 0))
            port = await nursery.start(ProxyServer(config).serve, listener)
            client = await trio.open_tcp_stream("127.0.0.1", port)
            await client.send_all(REQUEST)
            received = b""
            while not received.endswith(LAST_CHUNK_BYTES):
                data = await client.receive_some(65536)
                assert data
                received += data
                if received.endswith((b"\r\n\r\n", b"\n\n\r\n")):
                    got_frame.set()
            await client.aclose()
            nursery.cancel_scope.cancel()
            listener.close()
    body = b"".join(sent[1:])
    head_end = SSE_HEAD.index(b"\r\n\r\n")
    assert received == SSE_HEAD[:head_end] + b"\r\nX-Accel-Buffering: no\r\n\r\n" + body
    return received, taken


async def test_the_frames_after_the_first_pass_in_the_lane_byte_exact() -> None:
    _, taken = await stream_through()
    assert taken == FRAMES - 1


async def test_a_journal_sees_every_frame_the_lane_passes() -> None:
    journal = JournalStore(capture=True)  # as `middlebox run` keeps it
    _, taken = await stream_through(journal)
    assert taken == FRAMES - 1
    (kept,) = journal.journals.values()
    assert len(kept.leg("client").events[Direction.DOWNSTREAM]) == FRAMES


async def test_a_lazy_read_timer_keeps_the_lane_shut_with_the_same_bytes() -> None:
    _, taken = await stream_through(scenario=LAZY_READ_TIMER)
    assert taken == 0
