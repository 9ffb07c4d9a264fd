"""One long stream through a real `middlebox proxy` process: its memory must stay flat.

A fault holds per-connection state for the life of the connection, and a stream to an
LLM client can last a day (an agent's session kept open, a long generation relayed byte
by byte). This starts `middlebox proxy` as its own process with a scenario whose path
decides per item (`coalescer` by default: one flush, and one report, per 1,448 bytes),
an upstream here that answers one request with `total` bytes (Content-Length, 64 KiB
writes), and a client here that reads them all; every `total / samples` bytes it reads
the proxy's resident memory from `/proc/PID/status` (VmRSS).

Flat means: from the sample at a tenth of the bytes (past the warm-up: buffers, the
allocator's arenas) to the end, the proxy's RSS rises by no more than `allowed` (16 MiB
by default); with `journal` (the proxy writes `--journal`) from a fifth, since the journal
first fills its per-connection bounds (docs/observability.md). A fault that kept a
report per flush would rise ~290 bytes per 1,448: 70 MiB over 360 MB, 630 MiB over
3.24 GB. `make soak` runs 3.6 GB, both ways; the test suite 400 MB.

    python -m middlebox.tools.long_stream --bytes 3.6e9
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path

import trio

COALESCER = "name: long-stream\npath:\n  - coalescer\n"
BLOCK = 64 * 1024
MIB = 1024 * 1024
ALLOWED_GROWTH = 16 * MIB
MIDDLEBOX = [sys.executable, "-c", "from middlebox.cli.main import main; main()"]


@dataclass
class LongStreamReport:
    total: int
    scenario: str
    received: int = 0
    samples: list[tuple[int, int]] = field(default_factory=list)  # (bytes read, proxy RSS)
    allowed: int = ALLOWED_GROWTH
    seconds: float = 0.0
    warm_at: float = 0.1  # the share of the bytes past which the RSS must stay flat

    @property
    def warm(self) -> int:
        """The proxy's RSS once `warm_at` of the bytes have passed."""
        return next((rss for done, rss in self.samples if done >= self.total * self.warm_at), 0)

    @property
    def growth(self) -> int:
        """How far the RSS rose past `warm`, at its highest afterwards."""
        later = [rss for done, rss in self.samples if done >= self.total * self.warm_at]
        return max(later, default=0) - self.warm

    @property
    def flat(self) -> bool:
        enough = self.received == self.total and len(self.samples) >= 4
        return enough and self.growth <= self.allowed

    def summary(self) -> str:
        first = self.samples[0][1] if self.samples else 0
        last = self.samples[-1][1] if self.samples else 0
        return (
            f"long stream: {self.received / 1e6:,.0f} of {self.total / 1e6:,.0f} MB through "
            f"{self.scenario} in {self.seconds:.0f}s; proxy RSS MiB: {first / MIB:.1f} at the "
            f"first sample, {self.warm / MIB:.1f} at {self.warm_at:.0%} of the bytes, "
            f"{last / MIB:.1f} at the end, highest rise past that {self.growth / MIB:+.1f} "
            f"(allowed {self.allowed / MIB:.0f})"
            f"; flat: {'yes' if self.flat else 'no'}"
        )


def vm_rss(pid: int) -> int:
    """A process's resident memory in bytes, from `/proc/PID/status` (0 once it is gone)."""
    try:
        with open(f"/proc/{pid}/status", encoding="ascii") as status:
            for line in status:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    return 0


async def read_head(stream: trio.SocketStream) -> bytes:
    """The bytes up to and past a head's blank line; b"" when the peer ends before it."""
    head = b""
    while b"\r\n\r\n" not in head:
        data = await stream.receive_some(4096)
        if not data:
            return b""
        head += data
    return head


async def _upstream(stream: trio.SocketStream, total: int) -> None:
    """Read one request head, answer it with `total` bytes."""
    if not await read_head(stream):
        return
    await stream.send_all(
        b"HTTP/1.1 200 OK\r\nContent-Type: application/octet-stream\r\n"
        b"Content-Length: %d\r\nConnection: close\r\n\r\n" % total
    )
    block = bytes(range(256)) * (BLOCK // 256)
    left = total
    with trio.CancelScope() as scope:
        while left > 0:
            size = min(left, BLOCK)
            try:
                await stream.send_all(block if size == BLOCK else block[:size])
            except (trio.BrokenResourceError, trio.ClosedResourceError):
                scope.cancel()
            left -= size
    await stream.aclose()


async def _wait_ready(ready: Path, process: trio.Process, seconds: float = 30.0) -> int:
    with trio.fail_after(seconds):
        while True:
            if await trio.Path(ready).exists():
                text = await trio.Path(ready).read_text()
                if "http://127.0.0.1:" in text:
                    return int(text.split("http://127.0.0.1:", 1)[1].split()[0].rstrip("/"))
            if process.returncode is not None:
                raise RuntimeError(f"middlebox proxy exited with {process.returncode}")
            await trio.sleep(0.05)


async def long_stream(
    total: int,
    *,
    scenario: str = COALESCER,
    samples: int = 40,
    journal: bool = False,
) -> LongStreamReport:
    """Stream `total` bytes through a fresh `middlebox proxy` process; sample its RSS.
    `journal`: the proxy writes its journal (`--journal`, to a scratch file)."""
    name = scenario.split("\n", 1)[0].removeprefix("name:").strip()
    report = LongStreamReport(total, name)
    step = max(total // samples, 1)
    with tempfile.TemporaryDirectory(prefix="middlebox-long-stream-") as scratch:
        scenario_file = Path(scratch) / "scenario.yaml"
        scenario_file.write_text(scenario)
        ready = Path(scratch) / "ready"
        async with trio.open_nursery() as nursery:
            listeners = await nursery.start(
                partial(trio.serve_tcp, lambda s: _upstream(s, total), 0, host="127.0.0.1")
            )
            upstream_port = listeners[0].socket.getsockname()[1]
            command = [
                *MIDDLEBOX,
                "proxy",
                "--listen",
                "127.0.0.1:0",
                "--upstream",
                f"http://127.0.0.1:{upstream_port}",
                "--scenario",
                str(scenario_file),
                "--grace",
                "1",
                "--ready-file",
                str(ready),
            ]
            if journal:
                command += ["--journal", str(Path(scratch) / "journal.ndjson")]
                report.scenario += " + journal"
                # The journal fills its per-connection bounds first (200,000 chunk records,
                # 8 MiB captured per leg and direction: ~80 MiB, in the first ~350 MB of a
                # coalesced stream), then holds: flat is judged past a fifth.
                report.warm_at = 0.2
            process = await trio.lowlevel.open_process(command)
            try:
                port = await _wait_ready(ready, process)
                started = trio.current_time()
                with trio.fail_after(3600):  # 3.6 GB take about a minute on loopback
                    stream = await trio.open_tcp_stream("127.0.0.1", port)
                    await stream.send_all(
                        b"GET /long HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n"
                    )
                    head = b""
                    while b"\r\n\r\n" not in head:
                        data = await stream.receive_some(65536)
                        if not data:
                            raise RuntimeError(f"the proxy closed before a head: {head!r}")
                        head += data
                    report.received = len(head.split(b"\r\n\r\n", 1)[1])
                    report.samples.append((report.received, vm_rss(process.pid)))
                    mark = step
                    while report.received < total:
                        data = await stream.receive_some(256 * 1024)
                        if not data:
                            break
                        report.received += len(data)
                        if report.received >= mark:
                            report.samples.append((report.received, vm_rss(process.pid)))
                            mark += step
                    await stream.aclose()
                report.seconds = trio.current_time() - started
            finally:
                process.terminate()  # the process started here, by its handle
                with trio.move_on_after(10):
                    await process.wait()
                if process.returncode is None:
                    process.kill()
                    await process.wait()
                nursery.cancel_scope.cancel()
    return report


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m middlebox.tools.long_stream", description=__doc__
    )
    parser.add_argument("--bytes", type=float, default=3.6e9, help="Bytes to stream (3.6e9).")
    parser.add_argument("--scenario", help="A scenario YAML file (default: coalescer).")
    parser.add_argument("--journal", action="store_true", help="The proxy writes a journal.")
    args = parser.parse_args(argv)
    scenario = Path(args.scenario).read_text() if args.scenario else COALESCER
    report = trio.run(lambda: long_stream(int(args.bytes), scenario=scenario, journal=args.journal))
    print(report.summary())
    return 0 if report.flat else 1


if __name__ == "__main__":
    sys.exit(main())
