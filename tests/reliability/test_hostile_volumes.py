"""Volumes a hostile peer can send, against a real `middlebox proxy` process: a huge chunked
response, a request head of 100,000 lines and a head that never ends. Each keeps the proxy's
resident memory within a stated bound and gets a defined answer.

`make test` runs them at a size that stays short on a loaded CI machine;
`MIDDLEBOX_HOSTILE_FULL=1` runs the sizes of docs/reliability.md (`make hostile`)."""

from __future__ import annotations

import subprocess
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from functools import partial
from pathlib import Path

import pytest
import trio

from middlebox.core.http1 import MAX_HEAD_BYTES
from tests.reliability.support import FULL, first_line, listening_port, proxy_command, rss_bytes
from tests.shell.support import read_head

ROOT = Path(__file__).resolve().parents[2]
MiB = 1024 * 1024
CHUNK = 64 * 1024
RESPONSE_BYTES = (10 * 1024 if FULL else 256) * MiB
# Kernel socket buffers, HIGH_WATER (256 KiB) per direction and Python's allocator settling:
# a leak of even 1 % of the bytes relayed would exceed this many times over.
RSS_BOUND = 24 * MiB
HEAD_LINES = 100_000
ENDLESS_HEAD_BYTES = (512 if FULL else 32) * MiB


async def chunked_upstream(total: int, stream: trio.SocketStream) -> None:
    """Reads a request head, answers `total` bytes in 64 KiB chunks, then the last chunk."""
    try:
        if not await read_head(stream):
            return
        await stream.send_all(
            b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\n"
            b"Transfer-Encoding: chunked\r\n\r\n"
        )
        frame = b"%x\r\n" % CHUNK + b"d" * CHUNK + b"\r\n"
        for _ in range(total // CHUNK):
            await stream.send_all(frame)
        await stream.send_all(b"0\r\n\r\n")
    except trio.BrokenResourceError:
        return


async def counting_upstream(received: list[int], stream: trio.SocketStream) -> None:
    """Counts what reaches the upstream and never answers (the proxy must judge a head);
    a -1 in `received` marks a complete head (a blank line) seen by the upstream."""
    tail = b""
    try:
        while data := await stream.receive_some(65536):
            received.append(len(data))
            if b"\r\n\r\n" in tail + data:
                received.append(-1)
            tail = data[-3:]
    except trio.BrokenResourceError:
        return


@asynccontextmanager
async def proxy_in_front_of(
    handler: Callable[[trio.SocketStream], Awaitable[None]], tmp_path: Path, scenario: str | None
) -> AsyncIterator[tuple[trio.Process, int]]:
    """A real `middlebox proxy` process before `handler`; killed (by its handle) after."""
    async with trio.open_nursery() as nursery:
        listeners = await nursery.start(partial(trio.serve_tcp, handler, 0, host="127.0.0.1"))
        extra = ["--grace", "0"]
        if scenario is not None:
            path = tmp_path / "scenario.yaml"
            path.write_text(scenario)
            extra += ["--scenario", str(path)]
        process = await trio.lowlevel.open_process(
            proxy_command(listeners[0].socket.getsockname()[1], *extra),
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            cwd=ROOT,
        )
        try:
            yield process, listening_port(await first_line(process))
        finally:
            if process.returncode is None:
                process.kill()
                await process.wait()
            nursery.cancel_scope.cancel()


# set_header frames every HTTP message it sees (an HTTP-aware fault): the framed path.
FRAMED = """\
name: framed
path:
  - set_header: {headers: {X-Seen: "1"}}
"""


@pytest.mark.parametrize("scenario", [None, FRAMED], ids=["pass-through", "framed"])
async def test_a_huge_chunked_response_passes_whole_with_flat_memory(
    tmp_path: Path, scenario: str | None
) -> None:
    upstream = partial(chunked_upstream, RESPONSE_BYTES)
    async with proxy_in_front_of(upstream, tmp_path, scenario) as (process, port):
        stream = await trio.open_tcp_stream("127.0.0.1", port)
        await stream.send_all(b"GET /stream HTTP/1.1\r\nHost: x\r\n\r\n")
        received, tail, peak, baseline = 0, b"", 0, 0
        with trio.fail_after(280 if FULL else 110):
            while not tail.endswith(b"\r\n0\r\n\r\n"):
                data = await stream.receive_some(256 * 1024)
                assert data, f"closed after {received} bytes"
                received += len(data)
                tail = (tail + data)[-16:]
                if not baseline and received > 8 * MiB:
                    baseline = rss_bytes(process.pid)  # warm: buffers at their size
                elif baseline and received % (16 * MiB) < len(data):
                    peak = max(peak, rss_bytes(process.pid))
        await stream.aclose()
    # the body and its chunk framing arrived whole (a re-chunking hop would differ)
    assert received >= RESPONSE_BYTES
    assert baseline and peak, "RSS was never sampled"
    print(f"RSS {baseline / MiB:.1f} MiB warm, peak {peak / MiB:.1f} MiB")
    assert peak - baseline < RSS_BOUND, f"RSS grew {(peak - baseline) / MiB:.1f} MiB"


async def send_until_closed(stream: trio.SocketStream, pieces: list[bytes]) -> int:
    """Send pieces until the peer stops reading or closes; return the bytes sent."""
    sent = 0
    try:
        for piece in pieces:
            await stream.send_all(piece)
            sent += len(piece)
    except (trio.BrokenResourceError, trio.ClosedResourceError):
        pass
    return sent


async def answer_of(stream: trio.SocketStream) -> bytes:
    answer = b""
    try:
        while data := await stream.receive_some(65536):
            answer += data
    except trio.BrokenResourceError:
        pass
    return answer


def many_lines() -> list[bytes]:
    lines = [b"GET / HTTP/1.1\r\nHost: x\r\n"]
    lines += [b"X-Filler-%d: v\r\n" % n for n in range(HEAD_LINES)]
    return [b"".join(lines[i : i + 1000]) for i in range(0, len(lines), 1000)]


def endless_head() -> list[bytes]:
    piece = b"X-Filler: " + b"v" * 1000 + b"\r\n"
    return [b"GET / HTTP/1.1\r\nHost: x\r\n"] + [piece * 64] * (
        ENDLESS_HEAD_BYTES // (len(piece) * 64)
    )


async def sent_through(
    tmp_path: Path, scenario: str | None, head: list[bytes]
) -> tuple[bytes, list[int], int, int]:
    """Send `head` through a proxy before `counting_upstream`: the client's answer, what
    the upstream received, the bytes sent and the proxy's RSS growth."""
    received: list[int] = []
    async with proxy_in_front_of(partial(counting_upstream, received), tmp_path, scenario) as (
        process,
        port,
    ):
        before = rss_bytes(process.pid)
        stream = await trio.open_tcp_stream("127.0.0.1", port)
        outcome: list[int] = []

        async def send() -> None:  # runs until the proxy stops reading or closes
            outcome.append(await send_until_closed(stream, head))

        with trio.fail_after(100):
            async with trio.open_nursery() as nursery:
                nursery.start_soon(send)
                if scenario is not None:
                    answer = await answer_of(stream)
                else:  # a pass-through proxy answers nothing: wait for every byte to arrive
                    answer = b""
                    while not outcome or sum(received) < outcome[0]:
                        await trio.sleep(0.01)
                nursery.cancel_scope.cancel()
        grown = rss_bytes(process.pid) - before
        await stream.aclose()
    print(f"RSS grew {grown / MiB:.1f} MiB")
    return answer, received, (outcome or [0])[0], grown


@pytest.mark.parametrize("head", [many_lines, endless_head], ids=["100000-lines", "endless"])
async def test_a_head_that_never_fits_gets_400_on_a_framed_path_and_reaches_no_upstream(
    tmp_path: Path, head: Callable[[], list[bytes]]
) -> None:
    answer, received, _, grown = await sent_through(tmp_path, FRAMED, head())
    # nginx's answer to a head over its buffers. The stage passes bytes the framer has not
    # refused yet, so the start of the head went on as it came; the upstream never saw a
    # complete head (nothing it could serve), and at most the framer's head limit.
    assert answer.startswith(b"HTTP/1.1 400 "), answer[:200]
    assert -1 not in received and sum(received) <= MAX_HEAD_BYTES
    assert grown < RSS_BOUND, f"RSS grew {grown / MiB:.1f} MiB"


async def test_an_endless_head_on_a_pass_through_path_is_relayed_with_flat_memory(
    tmp_path: Path,
) -> None:
    """Transparent by default: the upstream judges the head; the proxy holds none of it."""
    _, received, sent, grown = await sent_through(tmp_path, None, endless_head())
    assert sent and sum(received) == sent
    assert grown < RSS_BOUND, f"RSS grew {grown / MiB:.1f} MiB"
