"""Resource probes for the reliability tests: open fds, live trio tasks, resident memory.

Every hostile-peer test takes a baseline, does its worst, waits (bounded) for the proxy
to settle and then asserts the counts came back: a leak fails the test that caused it.
"""

from __future__ import annotations

import gc
import os
import socket
import sys
from collections.abc import Callable

import trio

from middlebox.tools.soak import fds_of as open_fds
from middlebox.tools.soak import rss_of as rss_bytes
from middlebox.tools.soak import tasks_now as task_count

__all__ = [
    "FULL",
    "MIDDLEBOX",
    "blackhole",
    "fds_back_to",
    "first_line",
    "journalled_proxy",
    "listening_port",
    "open_fds",
    "proxy_command",
    "rss_bytes",
    "settle",
    "task_count",
]

MIDDLEBOX = [sys.executable, "-c", "from middlebox.cli.main import main; main()"]

FULL = os.environ.get("MIDDLEBOX_HOSTILE_FULL") == "1"
"""`make hostile`: the sizes docs/reliability.md quotes instead of `make test`'s smaller ones."""


def proxy_command(upstream_port: int, *extra: str) -> list[str]:
    """`middlebox proxy` on an ephemeral loopback port in front of `upstream_port`."""
    return [
        *MIDDLEBOX,
        "proxy",
        "--listen",
        "127.0.0.1:0",
        "--upstream",
        f"http://127.0.0.1:{upstream_port}",
        *extra,
    ]


def journalled_proxy(upstream_port: int, journal: object, *extra: str) -> list[str]:
    """The same with a 1 s grace and a journal: the command every journal and shutdown
    test starts."""
    return proxy_command(upstream_port, "--grace", "1", "--journal", str(journal), *extra)


def listening_port(first: str) -> int:
    """The port in the proxy's first line ("... http://127.0.0.1:PORT ...")."""
    return int(first.split("http://127.0.0.1:", 1)[1].split()[0])


async def first_line(process: trio.Process) -> str:
    """The first line a child process prints (bounded wait)."""
    assert process.stdout is not None
    line = b""
    with trio.fail_after(20):
        while b"\n" not in line:
            data = await process.stdout.receive_some(4096)
            assert data, f"exited early: {line!r}"
            line += data
    return line.decode().splitlines()[0]


async def settle(done: Callable[[], bool], seconds: float = 3.0) -> bool:
    """Wait until `done()` holds (polling every 10 ms), at most `seconds`; return it."""
    with trio.move_on_after(seconds):
        while not done():
            await trio.sleep(0.01)
    return done()


def fd_baseline() -> int:
    """This process's fd count once what earlier tests left to the cyclic collector is
    freed (a socket held by a cycle: an exception's traceback, a TLS or HTTP/2 session),
    so the collector running during a test cannot take the count below its start."""
    gc.collect()
    return open_fds()


async def fds_back_to(baseline: int, seconds: float = 3.0) -> int:
    """Wait for this process's fd count to return to `baseline`; return the final count."""
    await settle(lambda: open_fds() <= baseline, seconds)
    return open_fds()


def blackhole() -> tuple[socket.socket, list[socket.socket]]:
    """A loopback port whose accept queue is full: further SYNs are dropped, so a
    connect hangs like one to a host that never answers (Linux, tcp_abort_on_overflow
    off). Returns the listener and the sockets filling its queue; close them after."""
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(0)
    fillers = []
    for _ in range(3):
        sock = socket.socket()
        sock.setblocking(False)
        try:
            sock.connect(listener.getsockname())
        except BlockingIOError:
            pass
        fillers.append(sock)
    return listener, fillers
