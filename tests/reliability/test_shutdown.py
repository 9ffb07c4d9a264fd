"""Graceful shutdown, as real processes: SIGTERM to `middlebox proxy` drains live streams
for --grace seconds, resets the rest and writes the journal; SIGINT to `middlebox run`
stops every process it started, leaving none behind."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
from functools import partial
from pathlib import Path

import pytest
import trio

from tests.harness import read_all
from tests.reliability.support import (
    MIDDLEBOX,
    first_line,
    journalled_proxy,
    listening_port,
    settle,
)

ROOT = Path(__file__).resolve().parents[2]


async def streaming_upstream(stream: trio.SocketStream) -> None:
    """`GET /finite` streams five pieces over ~0.3 s then ends; `GET /endless` never ends."""
    try:
        request = await stream.receive_some(65536)
        if not request:
            return  # a probe that connected and left
        await stream.send_all(b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\n\r\n")
        pieces = 5 if request.startswith(b"GET /finite") else 10_000
        for index in range(pieces):
            await stream.send_all(b"data: %d\n\n" % index)
            await trio.sleep(0.06)
        await stream.send_eof()
        await read_all(stream)
    except trio.BrokenResourceError:
        return


async def test_sigterm_drains_live_streams_within_grace_then_resets_and_writes_the_journal(
    tmp_path: Path,
) -> None:
    journal = tmp_path / "journal.ndjson"
    async with trio.open_nursery() as nursery:
        listeners = await nursery.start(
            partial(trio.serve_tcp, streaming_upstream, 0, host="127.0.0.1")
        )
        upstream_port = listeners[0].socket.getsockname()[1]
        process = await trio.lowlevel.open_process(
            journalled_proxy(upstream_port, journal, "--backlog", "7"),
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            cwd=ROOT,
        )
        try:
            line = await first_line(process)
            port = listening_port(line)
            listening = subprocess.run(
                ["ss", "-Hltn", f"sport = :{port}"], capture_output=True, text=True, timeout=5
            ).stdout.split()
            assert listening[2] == "7", listening  # --backlog reached listen(2)
            with trio.fail_after(15):
                finite = await trio.open_tcp_stream("127.0.0.1", port)
                endless = await trio.open_tcp_stream("127.0.0.1", port)
                await finite.send_all(
                    b"GET /finite HTTP/1.1\r\nAuthorization: Bearer sk-s3cret\r\n\r\n"
                )
                await endless.send_all(b"GET /endless HTTP/1.1\r\n\r\n")
                assert await finite.receive_some(10)
                assert await endless.receive_some(10)
                signalled_at = trio.current_time()
                process.send_signal(signal.SIGTERM)

                async def refused() -> bool:
                    try:
                        stream = await trio.open_tcp_stream("127.0.0.1", port)
                    except OSError:
                        return True
                    await stream.aclose()
                    return False

                stopped_accepting = False
                with trio.move_on_after(2):
                    while not (stopped_accepting := await refused()):
                        await trio.sleep(0.02)
                finite_rest, finite_end = await read_all(finite)
                await finite.aclose()  # done: the connection ends within the grace period
                _, endless_end = await read_all(endless)
                reset_after = trio.current_time() - signalled_at
                code = await process.wait()
            assert process.stdout is not None
            output = (line + "\n" + (await process.stdout.receive_some(65536)).decode()).strip()
        finally:
            if process.returncode is None:
                process.kill()  # the process we started, by its handle
                await process.wait()
        nursery.cancel_scope.cancel()
    assert stopped_accepting, "new connections were still accepted after SIGTERM"
    assert finite_end == "fin" and finite_rest.endswith(b"data: 4\n\n")
    assert endless_end == "rst" and 1.0 <= reset_after < 6.0
    assert code == 0
    # probes that raced the signal may add accepted connections; they end on their own
    stopped = re.search(r"stopped: (\d+) connections, 0 refused, 1 reset at shutdown$", output)
    assert stopped, output
    lines = [json.loads(text) for text in journal.read_text().splitlines()]
    opened = sum(1 for entry in lines if entry["type"] == "open")
    assert opened == int(stopped.group(1)) >= 2  # one journal per connection
    assert "sk-s3cret" not in journal.read_text()  # redacted by default


def descendants(pid: int) -> dict[int, str]:
    """Every live descendant of `pid` with its start time (to tell a recycled pid apart)."""
    found: dict[int, str] = {}
    stack = [pid]
    while stack:
        parent = stack.pop()
        try:
            tasks = os.listdir(f"/proc/{parent}/task")
        except FileNotFoundError:
            continue
        for task in tasks:
            try:
                children = Path(f"/proc/{parent}/task/{task}/children").read_text().split()
            except FileNotFoundError:
                continue
            for child in map(int, children):
                if child not in found:
                    started = start_time(child)
                    if started is not None:
                        found[child] = started
                        stack.append(child)
    return found


def start_time(pid: int) -> str | None:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except FileNotFoundError:
        return None
    return stat.rsplit(")", 1)[1].split()[19]


def alive(pid: int, started: str) -> bool:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except FileNotFoundError:
        return False
    fields = stat.rsplit(")", 1)[1].split()
    return fields[19] == started and fields[0] != "Z"


@pytest.mark.parametrize("signum", [signal.SIGINT, signal.SIGTERM])
async def test_sigint_or_sigterm_during_middlebox_run_leaves_no_process_behind(
    tmp_path: Path, signum: signal.Signals
) -> None:
    scenario = tmp_path / "long.yaml"
    scenario.write_text(
        "name: long-streams\n"
        "upstream: {itl: 50ms}\n"
        "workload: {requests: 2, concurrency: 2, max_tokens: 400, timeout: 60s}\n"
        "path:\n  - latency: {delay: 5ms}\n"
    )
    process = await trio.lowlevel.open_process(
        [*MIDDLEBOX, "run", str(scenario), "--client", "raw", "--client", "resilient"],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        cwd=ROOT,
    )
    children: dict[int, str] = {}
    try:
        with trio.fail_after(30):
            # the emulator and both clients are running (and the clients mid-stream)
            while len(children := descendants(process.pid)) < 3:
                await trio.sleep(0.05)
            await trio.sleep(0.5)
            children = descendants(process.pid)
            process.send_signal(signum)
            code = await process.wait()
        assert process.stdout is not None
        output = (await process.stdout.receive_some(65536)).decode()
    finally:
        if process.returncode is None:
            process.kill()  # the process we started, by its handle
            await process.wait()
    assert code == 128 + signum, output  # 130 for SIGINT, 143 for SIGTERM, as shells report
    assert f"interrupted by {signum.name}: every process the run started (3) is stopped" in output
    assert await settle(lambda: not any(alive(pid, t) for pid, t in children.items()), 5)
    assert len(children) >= 3
