"""An upstream whose SSE line or event never ends, through an SSE-aware fault, in a real
`middlebox proxy` process: its resident memory stays within a stated bound while
256 MiB flow (the default `proxy.sse_max_line`/`sse_max_event` of 1 MiB: the faults
step aside for that response), every byte reaches the client unchanged, and the
step-aside is in /metrics and in the journal.

Real loopback sockets and a real child process; the amount is fixed and the run is
bounded in time. The RSS is the proxy's own (`/proc/PID/statm`), sampled while the
bytes flow; a run that passes the bound is stopped there and fails."""

from __future__ import annotations

import hashlib
import json
import re
import signal
import subprocess
from functools import partial
from pathlib import Path

import pytest
import trio

from middlebox.observe.prometheus import parse_text
from middlebox.tools.soak import rss_of
from tests.reliability.support import FULL, MIDDLEBOX, first_line
from tests.shell.support import http, read_head

MiB = 1024 * 1024
TOTAL = (2048 if FULL else 256) * MiB  # response body bytes per run
# What the proxy may grow by while they flow: the framing holds at most 1 MiB of a line
# or an event and the fault as much again; the rest is the relay's buffers and the
# allocator's slack. Unbounded, it grows by about the bytes sent (over 256 MiB).
RSS_BOUND = 32 * MiB
BLOCK = 64 * 1024
FAULTS = {
    "sse_ids": "sse_ids: {mode: add}",
    "cut": "cut: {after: events, count: 5}",
}
SHAPES = {
    # one `data:` line that never ends
    "line": (b"data: ", b"x" * BLOCK),
    # 1 KiB data lines and never the blank line that would end their event
    "event": (b"", (b"data: " + b"y" * 1017 + b"\n") * 64),
}


def chunk(data: bytes) -> bytes:
    return b"%x\r\n%s\r\n" % (len(data), data)


@pytest.mark.parametrize("shape", SHAPES)
@pytest.mark.parametrize("fault", FAULTS)
async def test_an_sse_line_or_event_that_never_ends_keeps_the_proxy_s_memory_bounded(
    tmp_path: Path, fault: str, shape: str
) -> None:
    scenario = tmp_path / "scenario.yaml"
    scenario.write_text(f"name: endless-{shape}\npath:\n  - {FAULTS[fault]}\n")
    journal = tmp_path / "journal.ndjson"
    first, block = SHAPES[shape]
    sent = hashlib.sha256()

    async def upstream(stream: trio.SocketStream) -> None:
        try:
            await answer(stream)
        except trio.BrokenResourceError:
            pass  # a proxy stopped early (a failing run): its assertion says why

    async def answer(stream: trio.SocketStream) -> None:
        if not await read_head(stream):
            return  # the proxy's start-up probe
        head = b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\n"
        await stream.send_all(head + b"transfer-encoding: chunked\r\n\r\n")
        body = first
        while True:
            body += block
            await stream.send_all(chunk(body))
            sent.update(body)
            upstream_bytes[0] += len(body)
            if upstream_bytes[0] >= TOTAL:
                break
            body = b""
        await stream.send_all(b"0\r\n\r\n")
        await stream.aclose()

    upstream_bytes = [0]
    received = hashlib.sha256()
    with trio.fail_after(120):
        async with trio.open_nursery() as nursery:
            listeners = await nursery.start(partial(trio.serve_tcp, upstream, 0, host="127.0.0.1"))
            upstream_port = listeners[0].socket.getsockname()[1]
            process = await trio.lowlevel.open_process(
                [*MIDDLEBOX, "proxy", "--listen", "127.0.0.1:0", "--control", "127.0.0.1:0",
                 "--upstream", f"http://127.0.0.1:{upstream_port}", "--grace", "0",
                 "--scenario", str(scenario), "--journal", str(journal)],
                stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
            )  # fmt: skip
            try:
                ports = re.findall(r"http://127\.0\.0\.1:(\d+)", await first_line(process))
                proxy_port, control_port = int(ports[0]), int(ports[1])
                baseline = rss_of(process.pid)
                peak = baseline
                client = await trio.open_tcp_stream("127.0.0.1", proxy_port)
                await client.send_all(
                    b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Length: 2\r\n\r\n{}"
                )
                response = b""
                while b"\r\n\r\n" not in response:
                    response += await client.receive_some(65536)
                _, _, wire = response.partition(b"\r\n\r\n")
                with trio.move_on_after(60) as unfinished:
                    async with trio.open_nursery() as flow:

                        async def sample() -> None:
                            nonlocal peak
                            while True:
                                peak = max(peak, rss_of(process.pid))
                                if peak - baseline > RSS_BOUND:
                                    flow.cancel_scope.cancel()  # the bound is passed: stop
                                await trio.sleep(0.02)

                        flow.start_soon(sample)
                        body_bytes = 0
                        ended = False
                        while not ended:
                            data = await client.receive_some(1 << 20)
                            assert data, "the proxy closed before the last chunk"
                            wire += data
                            # de-chunk as it comes (the chunk sizes are the upstream's)
                            at = 0
                            while (size_end := wire.find(b"\r\n", at)) >= 0:
                                size = int(wire[at:size_end], 16)
                                if size == 0:
                                    ended = wire.endswith(b"0\r\n\r\n")
                                    break
                                if len(wire) < size_end + 2 + size + 2:
                                    break
                                received.update(wire[size_end + 2 : size_end + 2 + size])
                                body_bytes += size
                                at = size_end + 2 + size + 2
                            wire = wire[at:]
                        flow.cancel_scope.cancel()
                growth = peak - baseline
                assert growth <= RSS_BOUND, (
                    f"RSS grew {growth / MiB:.1f} MiB after {upstream_bytes[0] / MiB:.0f} MiB"
                )
                assert not unfinished.cancelled_caught, f"{body_bytes} bytes in 60 s"
                assert body_bytes == upstream_bytes[0] >= TOTAL
                assert received.hexdigest() == sent.hexdigest()  # byte-exact
                await client.aclose()
                await trio.sleep(0.2)
                _, text, _ = await http(control_port, "GET", "/metrics")
                samples = parse_text(text.decode())
                key = f'middlebox_faults_fired_total{{fault="{fault}",action="stepped_aside"}}'
                assert samples.get(key) == 1, text.decode()
            finally:
                if process.returncode is None:
                    process.send_signal(signal.SIGINT)
                    with trio.move_on_after(10):
                        await process.wait()
                    if process.returncode is None:
                        process.kill()  # the process we started, by its handle
                        await process.wait()
            nursery.cancel_scope.cancel()
    faults = [
        line
        for line in map(json.loads, journal.read_text().splitlines())
        if line["type"] == "fault" and line["action"] == "stepped_aside"
    ]
    assert [line["fault"] for line in faults] == [fault]
    print(f"{fault}/{shape}: RSS {baseline / MiB:.1f} MiB + {growth / MiB:.1f} MiB")
