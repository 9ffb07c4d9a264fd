"""`middlebox proxy --workers N`: one port, N supervised processes, ids unique across them."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
from functools import partial
from pathlib import Path

import pytest
import trio

from middlebox.observe.journal import read_ndjson
from middlebox.scenario.model import Scenario
from middlebox.shell.server import Address, ProxyConfig
from middlebox.shell.workers import WorkerServer, reuseport_listeners
from tests.harness import read_all

ROOT = Path(__file__).resolve().parents[2]


async def start_proxy(*args: str) -> tuple[trio.Process, int, bytes]:
    """`middlebox proxy --listen 127.0.0.1:0 ARGS`, once it has printed its port and its
    workers' pids: the process, the port and what it printed so far."""
    argv = [sys.executable, "-c", "from middlebox.cli.main import main; main()", "proxy",
            "--listen", "127.0.0.1:0", *args]  # fmt: skip
    proxy = await trio.lowlevel.open_process(
        argv, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT
    )
    assert proxy.stdout is not None
    output = b""
    try:
        with trio.fail_after(30):
            while b"workers:" not in output or not output.endswith(b"\n"):
                output += await proxy.stdout.receive_some(4096)
    except BaseException:
        proxy.kill()
        raise
    port = int(re.search(rb"listening on http://127.0.0.1:(\d+)", output)[1])  # type: ignore[index]
    return proxy, port, output


def test_worker_connection_ids_interleave_so_no_two_workers_share_one() -> None:
    upstream, scenario = Address("127.0.0.1", 1), Scenario(name="ids")
    config = ProxyConfig(upstream, scenario)
    first = WorkerServer(config, worker_index=0, worker_count=2)
    second = WorkerServer(config, worker_index=1, worker_count=2)
    alone = WorkerServer(config)
    assert [first.global_id(k) for k in (1, 2, 3)] == [1, 3, 5]
    assert [second.global_id(k) for k in (1, 2, 3)] == [2, 4, 6]
    # One worker numbers exactly as the single-process proxy, so seeds replay the same.
    assert [alone.global_id(k) for k in (1, 2, 3)] == [1, 2, 3]


def test_reuseport_listeners_on_port_zero_all_bind_the_one_port_picked() -> None:
    listeners = reuseport_listeners(Address("127.0.0.1", 0), 3)
    try:
        ports = {sock.getsockname()[1] for sock in listeners}
        assert len(ports) == 1 and ports != {0}
    finally:
        for sock in listeners:
            sock.close()


def _gone(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    # A zombie still answers kill(0); its state letter says it has exited.
    stat = Path(f"/proc/{pid}/stat").read_text()
    return stat[stat.rfind(")") + 2] == "Z"


@pytest.mark.e2e
async def test_two_workers_share_connections_survive_a_death_and_leave_no_child(
    tmp_path: Path,
) -> None:
    async def upstream(stream: trio.SocketStream) -> None:
        request, _ = await read_all(stream)
        await stream.send_all(b"pong " + request)
        await stream.send_eof()

    async with trio.open_nursery() as nursery:
        listeners = await nursery.start(partial(trio.serve_tcp, upstream, 0, host="127.0.0.1"))
        upstream_port = listeners[0].socket.getsockname()[1]
        proxy, port, output = await start_proxy(
            "--upstream", f"127.0.0.1:{upstream_port}", "--workers", "2", "--grace", "1",
            "--journal", str(tmp_path / "journal.ndjson"),
        )  # fmt: skip
        assert proxy.stdout is not None
        try:
            with trio.fail_after(30):
                pids = [int(p) for p in re.search(rb"workers: ([\d ]+)", output)[1].split()]  # type: ignore[index]
                assert len(pids) == 2
                for number in range(40):
                    if number == 20:
                        # A worker that dies is replaced on the same listening socket.
                        os.kill(pids[0], signal.SIGKILL)
                    client = await trio.open_tcp_stream("127.0.0.1", port)
                    payload = f"ping {number} ".encode() * (number * 50 + 1)
                    await client.send_all(payload)
                    await client.send_eof()
                    received, end = await read_all(client)
                    await client.aclose()
                    assert (received, end) == (b"pong " + payload, "fin")
                proxy.send_signal(signal.SIGTERM)
                while True:
                    data = await proxy.stdout.receive_some(4096)
                    if not data:
                        break
                    output += data
                assert await proxy.wait() == 0
        finally:
            if proxy.returncode is None:
                proxy.kill()
            nursery.cancel_scope.cancel()
    counts = [int(n) for n in re.findall(rb"worker \d \(pid \d+\): (\d+)", output)]
    assert sum(counts) == 40, output
    # The kernel's SO_REUSEPORT hash spreads 40 connections over both workers.
    assert all(count > 0 for count in counts), output
    assert b"1 workers restarted" in output
    # Each worker journals its own connections; the interleaved ids never clash, and the
    # worker that was never killed journaled every connection it accepted.
    ids = [
        {view.connection for view in read_ndjson(tmp_path / f"journal.ndjson.w{index}")}
        for index in (0, 1)
    ]
    assert all(cid % 2 == 1 for cid in ids[0]) and all(cid % 2 == 0 for cid in ids[1])
    assert len(ids[1]) == counts[1]
    assert ids[0] and max(ids[0] | ids[1]) <= 2 * max(counts)
    assert all(_gone(pid) for pid in pids)


async def test_every_worker_answers_an_unreachable_upstream_with_nginxs_502_as_one_process_does(
    tmp_path: Path,
) -> None:
    # The proxy's own stages (faults/_proxy: unreachable upstream, header timeout, fail
    # closed) were not passed to the workers: a client got a bare close, not the 502 page
    with trio.socket.socket() as probe:  # a loopback port nothing listens on
        await probe.bind(("127.0.0.1", 0))
        dead = probe.getsockname()[1]
    proxy, port, _ = await start_proxy(
        "--upstream", f"127.0.0.1:{dead}", "--workers", "2", "--grace", "0"
    )
    try:
        with trio.fail_after(30):
            for _ in range(6):  # enough connections for both workers (SO_REUSEPORT hash)
                client = await trio.open_tcp_stream("127.0.0.1", port)
                await client.send_all(b"GET /v1/models HTTP/1.1\r\nHost: x\r\n\r\n")
                received, _ = await read_all(client)
                await client.aclose()
                assert received.startswith(b"HTTP/1.1 502 Bad Gateway\r\n"), received
    finally:
        proxy.send_signal(signal.SIGTERM)
        with trio.move_on_after(10):
            await proxy.wait()
        if proxy.returncode is None:
            proxy.kill()
