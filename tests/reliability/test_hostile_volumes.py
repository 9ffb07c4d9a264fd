"""Volumes a hostile peer can send, against a real `middlebox proxy` process: a huge chunked
response, a request head of 100,000 lines and a head that never ends. Each keeps the proxy's
resident memory within a stated bound and gets a defined answer.

`make test` runs them at a size that stays short on a loaded CI machine;
`MIDDLEBOX_HOSTILE_FULL=1` runs the sizes of docs/reliability.md (`make hostile`)."""

from __future__ import annotations

import os
import subprocess
from functools import partial
from pathlib import Path

import pytest
import trio

from middlebox.core.http1 import MAX_HEAD_BYTES
from tests.reliability.support import MIDDLEBOX, first_line, listening_port, rss_bytes

ROOT = Path(__file__).resolve().parents[2]
FULL = os.environ.get("MIDDLEBOX_HOSTILE_FULL") == "1"
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
        request = b""
        while b"\r\n\r\n" not in request:
            data = await stream.receive_some(65536)
            if not data:
                return
            request += data
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


async def proxy_in_front_of(
    nursery: trio.Nursery, handler: object, tmp_path: Path, scenario: str | None
) -> tuple[trio.Process, int]:
    listeners = await nursery.start(partial(trio.serve_tcp, handler, 0, host="127.0.0.1"))
    upstream_port = listeners[0].socket.getsockname()[1]
    command = [
        *MIDDLEBOX,
        "proxy",
        "--listen",
        "127.0.0.1:0",
        "--upstream",
        f"http://127.0.0.1:{upstream_port}",
        "--grace",
        "0",
    ]
    if scenario is not None:
        path = tmp_path / "scenario.yaml"
        path.write_text(scenario)
        command += ["--scenario", str(path)]
    process = await trio.lowlevel.open_process(
        command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, cwd=ROOT
    )
    return process, listening_port(await first_line(process))


async def stop(process: trio.Process) -> None:
    if process.returncode is None:
        process.kill()  # the process this test started, by its handle
        await process.wait()


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
    async with trio.open_nursery() as nursery:
        process, port = await proxy_in_front_of(
            nursery, partial(chunked_upstream, RESPONSE_BYTES), tmp_path, scenario
        )
        try:
            stream = await trio.open_tcp_stream("127.0.0.1", port)
            await stream.send_all(b"GET /stream HTTP/1.1\r\nHost: x\r\n\r\n")
            received, tail, peak = 0, b"", 0
            baseline = 0
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
        finally:
            await stop(process)
        nursery.cancel_scope.cancel()
    # the body and its chunk framing arrived whole (a re-chunking hop would differ)
    assert received >= RESPONSE_BYTES
    assert baseline and peak, "RSS was never sampled"
    print(f"RSS {baseline / MiB:.1f} MiB warm, peak {peak / MiB:.1f} MiB")
    assert peak - baseline < RSS_BOUND, f"RSS grew {(peak - baseline) / MiB:.1f} MiB"


async def send_until_closed(stream: trio.SocketStream, pieces: object) -> int:
    """Send pieces until the peer stops reading or closes; return the bytes sent."""
    sent = 0
    try:
        for piece in pieces:  # type: ignore[attr-defined]
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


@pytest.mark.parametrize("head", [many_lines, endless_head], ids=["100000-lines", "endless"])
async def test_a_head_that_never_fits_gets_400_on_a_framed_path_and_reaches_no_upstream(
    tmp_path: Path, head: object
) -> None:
    received: list[int] = []
    async with trio.open_nursery() as nursery:
        process, port = await proxy_in_front_of(
            nursery, partial(counting_upstream, received), tmp_path, FRAMED
        )
        try:
            before = rss_bytes(process.pid)
            stream = await trio.open_tcp_stream("127.0.0.1", port)
            with trio.fail_after(100):
                async with trio.open_nursery() as inner:
                    inner.start_soon(send_until_closed, stream, head())  # type: ignore[operator]
                    answer = await answer_of(stream)
                    inner.cancel_scope.cancel()
            grown = rss_bytes(process.pid) - before
            await stream.aclose()
        finally:
            await stop(process)
        nursery.cancel_scope.cancel()
    print(f"RSS grew {grown / MiB:.1f} MiB")
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
    received: list[int] = []
    async with trio.open_nursery() as nursery:
        process, port = await proxy_in_front_of(
            nursery, partial(counting_upstream, received), tmp_path, None
        )
        try:
            before = rss_bytes(process.pid)
            stream = await trio.open_tcp_stream("127.0.0.1", port)
            with trio.fail_after(100):
                sent = await send_until_closed(stream, endless_head())
                while sum(received) < sent:
                    await trio.sleep(0.01)
            grown = rss_bytes(process.pid) - before
            await stream.aclose()
        finally:
            await stop(process)
        nursery.cancel_scope.cancel()
    assert sum(received) == sent
    assert grown < RSS_BOUND, f"RSS grew {grown / MiB:.1f} MiB"
