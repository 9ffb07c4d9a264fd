"""`make soak`: a bounded, mixed load through the proxy; memory, fds and tasks stay flat.

It starts the vLLM emulator (its own process) and, in this process, one proxy per
scenario of a small mix (pass-through, latency + slicer, coalescer, the SSE-aware faults:
a journalled `cut` that resets streams mid-response and a journalled latency + `sse_ids`
that numbers every event, each journal bounded), then runs streaming chat requests
through them from `concurrency` loopback clients for `seconds`; some clients abandon
their stream with an RST halfway. Beside them one long-lived stream runs through a
`coalescer` proxy for the whole load (an upstream here trickling 16 KiB every 20 ms, read
by one more client). Every `interval` it samples this process's resident memory (RSS),
open fds and live trio tasks (and the emulator's RSS, reported only: its request ledger
grows by design). Then (`long_stream_bytes`, the command line only) 3.6 GB go through a
`middlebox proxy` process with `coalescer`, without and with `--journal`, its RSS read
from /proc (`middlebox.tools.long_stream`).

Flat means: after a warm-up (the first fifth), the second half's median RSS is within
`max(8 MiB, 5%)` of the first half's, and its highest fd and task counts exceed the first
half's by no more than `concurrency` requests in flight hold (3 fds, 10 tasks each); and
once the load stops and connections close, fds and tasks are back to what they were
before the load. docs/reliability.md has figures.

    python -m middlebox.tools.soak --seconds 600          # `make soak` (SOAK_SECONDS=...)
"""

from __future__ import annotations

import argparse
import json
import os
import random
import socket
import statistics
import struct
import sys
import tempfile
from dataclasses import asdict, dataclass, field
from functools import partial
from pathlib import Path
from typing import Any

import trio

from middlebox.compose import registry, scenario_sections
from middlebox.observe.journal import JournalStore
from middlebox.run.processes import start_emulator, stop_upstream
from middlebox.run.serve import proxy_config
from middlebox.scenario.load import load_scenario_text
from middlebox.scenario.model import Scenario
from middlebox.shell.server import Address, ProxyServer, listen
from middlebox.tools.long_stream import long_stream, read_head

MODEL = "middlebox/tools/soak-7b"
EMULATOR = {
    "model": MODEL,
    "prefill_overhead": 0.005,
    "prefill_per_token": 0.0,
    "itl": 0.004,
    "itl_jitter": 0.2,
    "max_num_seqs": 1024,
    "natural_length_min": 200,
    "natural_length_max": 400,
}
MIX = {
    "pass-through": "name: pass-through\n",
    "latency-slicer": "name: latency-slicer\npath:\n  - latency: {delay: 2ms}\n  - slicer\n",
    "coalescer": "name: coalescer\npath:\n  - coalescer\n",
    "cut": "name: cut\npath:\n  - cut: {after: events, count: 8, end: rst}\n",
    "journalled": (
        "name: journalled\npath:\n  - latency: {delay: 1ms}\n  - sse_ids: {mode: add}\n"
    ),
    "long-coalescer": "name: long-coalescer\npath:\n  - coalescer\n",
}
JOURNALLED = ("cut", "journalled")  # each with its own journal, bounded to 100 connections
LONG = "long-coalescer"  # the long-lived stream's proxy, in front of the trickle upstream
TRICKLE = (16 * 1024, 0.02)  # the long stream: this many bytes every this many seconds
REQUEST_TIMEOUT = 15.0
_LINGER_ABORT = struct.pack("ii", 1, 0)
MIB = 1024 * 1024


@dataclass
class Sample:
    time: float
    rss: int
    fds: int
    tasks: int
    active: int
    emulator_rss: int


@dataclass
class SoakReport:
    seconds: float
    concurrency: int
    requests: int = 0
    complete: int = 0
    cut: int = 0
    abandoned: int = 0
    errors: dict[str, int] = field(default_factory=dict)
    bytes_received: int = 0
    long_stream_bytes: int = 0  # what the long-lived stream through `coalescer` carried
    long_stream_end: str = ""  # how it ended: "held" (open until the load stopped) or why not
    long_streams: list[str] = field(default_factory=list)  # the real-process runs' summaries
    baseline: dict[str, int] = field(default_factory=dict)
    after: dict[str, int] = field(default_factory=dict)
    halves: dict[str, dict[str, float]] = field(default_factory=dict)
    problems: list[str] = field(default_factory=list)
    samples: list[Sample] = field(default_factory=list)

    @property
    def flat(self) -> bool:
        return not self.problems

    def summary(self) -> str:
        first, second = self.halves.get("first", {}), self.halves.get("second", {})
        lines = [
            f"soak: {self.seconds:.0f}s, {self.concurrency} clients, {self.requests} requests "
            f"({self.complete} complete, {self.cut} cut by the fault, {self.abandoned} abandoned, "
            f"{sum(self.errors.values())} errors {self.errors or ''}), "
            f"{self.bytes_received / MIB:.1f} MiB received; the long-lived stream through "
            f"coalescer: {self.long_stream_bytes / MIB:.1f} MiB, {self.long_stream_end}",
            f"  rss median MiB: first half {first.get('rss', 0) / MIB:.1f}, "
            f"second half {second.get('rss', 0) / MIB:.1f}",
            f"  fds max: first {first.get('fds', 0):.0f}, second {second.get('fds', 0):.0f}; "
            f"before {self.baseline.get('fds')} after {self.after.get('fds')}",
            f"  tasks max: first {first.get('tasks', 0):.0f}, second {second.get('tasks', 0):.0f}; "
            f"before {self.baseline.get('tasks')} after {self.after.get('tasks')}",
            f"  emulator rss MiB: first {first.get('emulator_rss', 0) / MIB:.1f}, "
            f"second {second.get('emulator_rss', 0) / MIB:.1f} (not checked: its ledger grows)",
        ]
        lines += [f"  {line}" for line in self.long_streams]
        lines += [f"  NOT FLAT: {problem}" for problem in self.problems]
        lines.append("  flat: yes" if self.flat else "  flat: no")
        return "\n".join(lines)


def rss_of(pid: int | str = "self") -> int:
    try:
        with open(f"/proc/{pid}/statm", encoding="ascii") as statm:
            return int(statm.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError, IndexError):
        return 0


def fds_of(pid: int | str = "self") -> int:
    return len(os.listdir(f"/proc/{pid}/fd"))


def tasks_now() -> int:
    root = trio.lowlevel.current_root_task()
    stack = [root] if root is not None else []
    count = 0
    while stack:
        task = stack.pop()
        count += 1
        for nursery in task.child_nurseries:
            stack.extend(nursery.child_tasks)
    return count


def mix() -> dict[str, Scenario]:
    return {
        name: load_scenario_text(text, registry(), file=name, sections=scenario_sections())
        for name, text in MIX.items()
    }


def request_bytes(index: int, max_tokens: int) -> bytes:
    body = json.dumps(
        {
            "model": MODEL,
            "messages": [{"role": "user", "content": f"soak request {index}"}],
            "max_tokens": max_tokens,
            "stream": True,
        }
    ).encode()
    head = (
        "POST /v1/chat/completions HTTP/1.1\r\nHost: 127.0.0.1\r\n"
        "Content-Type: application/json\r\nAuthorization: Bearer sk-soak\r\n"
        f"Content-Length: {len(body)}\r\nConnection: close\r\n\r\n"
    )
    return head.encode() + body


async def one_request(
    report: SoakReport, port: int, scenario: str, index: int, max_tokens: int, abandon: bool
) -> None:
    """One streaming request; classify how it ended."""
    report.requests += 1
    outcome = "hang"
    received = bytearray()
    stream: trio.SocketStream | None = None
    with trio.move_on_after(REQUEST_TIMEOUT):
        try:
            stream = await trio.open_tcp_stream("127.0.0.1", port)
            await stream.send_all(request_bytes(index, max_tokens))
            while True:
                data = await stream.receive_some(65536)
                if not data:
                    break
                received += data
                if abandon and len(received) > 1500:
                    # leave mid-stream with an RST, as a killed client does
                    stream.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, _LINGER_ABORT)
                    await stream.aclose()
                    outcome = "abandoned"
                    break
            if outcome != "abandoned":
                outcome = (
                    "complete"
                    if received.startswith(b"HTTP/1.1 200")
                    and b"data: [DONE]" in received
                    and received.endswith(b"0\r\n\r\n")
                    else f"incomplete:{scenario}"
                )
        except (OSError, trio.BrokenResourceError) as error:
            outcome = f"reset:{scenario}" if received else f"{type(error).__name__}:{scenario}"
        except trio.ClosedResourceError:
            outcome = "abandoned"
    if stream is not None and outcome != "abandoned":
        await stream.aclose()
    report.bytes_received += len(received)
    if outcome == "complete":
        report.complete += 1
    elif outcome == "abandoned":
        report.abandoned += 1
    elif scenario == "cut" and received.startswith(b"HTTP/1.1 200"):
        report.cut += 1  # the fault reset it mid-stream, as configured
    else:
        report.errors[outcome] = report.errors.get(outcome, 0) + 1


def check(report: SoakReport) -> None:
    samples = report.samples
    usable = samples[len(samples) // 5 :]
    if len(usable) < 4:
        report.problems.append(f"too few samples ({len(samples)}) to compare halves")
        return
    middle = len(usable) // 2
    halves = {"first": usable[:middle], "second": usable[middle:]}
    for name, part in halves.items():
        report.halves[name] = {
            "rss": statistics.median(s.rss for s in part),
            "fds": max(s.fds for s in part),
            "tasks": max(s.tasks for s in part),
            "emulator_rss": statistics.median(s.emulator_rss for s in part),
        }
    first, second = report.halves["first"], report.halves["second"]
    allowed_rss = max(8 * MIB, 0.05 * first["rss"])
    if second["rss"] - first["rss"] > allowed_rss:
        report.problems.append(
            f"RSS grew {(second['rss'] - first['rss']) / MIB:.1f} MiB between halves "
            f"(allowed {allowed_rss / MIB:.1f})"
        )
    # A request in flight holds 3 fds here (client, proxy client side, proxy upstream
    # side) and about ten tasks, so peaks may differ by that much per client; a leak
    # grows without bound and also shows in the after-the-load counts below.
    for what, per_request in (("fds", 3), ("tasks", 10)):
        slack = per_request * report.concurrency
        if second[what] > first[what] + slack:
            report.problems.append(
                f"{what} peaked at {second[what]:.0f} in the second half against "
                f"{first[what]:.0f} in the first (allowed +{slack})"
            )
        if report.after.get(what, 0) > report.baseline.get(what, 0):
            report.problems.append(
                f"{what} after the load: {report.after[what]} > {report.baseline[what]} before"
            )
    if report.errors:
        report.problems.append(f"unexpected request outcomes: {report.errors}")
    if report.long_stream_end != "held":
        report.problems.append(f"the long-lived stream did not last: {report.long_stream_end}")
    if report.complete == 0:
        report.problems.append("no request completed")


async def _trickle(stream: trio.SocketStream) -> None:
    """The long-lived stream's upstream: one chunked response, `TRICKLE` at a time, until
    the proxy passes on the client's end (a FIN or an RST), as vLLM aborts a request whose
    client has gone."""
    if not await read_head(stream):
        return
    size, every = TRICKLE
    chunk = b"%x\r\n" % size + bytes(range(256)) * (size // 256) + b"\r\n"

    async def send(cancel: trio.CancelScope) -> None:
        await stream.send_all(
            b"HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\nTransfer-Encoding: chunked\r\n\r\n"
        )
        while True:
            await stream.send_all(chunk)
            await trio.sleep(every)

    async def until_eof(cancel: trio.CancelScope) -> None:
        while await stream.receive_some(4096):
            pass
        cancel.cancel()

    try:
        async with trio.open_nursery() as nursery:
            nursery.start_soon(send, nursery.cancel_scope)
            nursery.start_soon(until_eof, nursery.cancel_scope)
    except* (trio.BrokenResourceError, trio.ClosedResourceError, OSError):
        pass
    finally:
        await stream.aclose()


async def long_client(report: SoakReport, port: int, deadline: float) -> None:
    """Hold one stream through the `coalescer` proxy until `deadline`; say how it ended."""
    stream: trio.SocketStream | None = None
    report.long_stream_end = "not opened"
    try:
        stream = await trio.open_tcp_stream("127.0.0.1", port)
        await stream.send_all(b"GET /long HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n")
        with trio.move_on_at(deadline) as scope:
            while True:
                data = await stream.receive_some(65536)
                if not data:
                    report.long_stream_end = "closed by the proxy before the load stopped"
                    break
                report.long_stream_bytes += len(data)
        if scope.cancelled_caught:
            report.long_stream_end = "held"
    except (OSError, trio.BrokenResourceError) as error:
        report.long_stream_end = f"{type(error).__name__}: {error}"
    finally:
        if stream is not None:
            await stream.aclose()


async def soak(
    seconds: float, concurrency: int = 8, interval: float = 1.0, seed: int = 1
) -> SoakReport:
    """Run the soak for `seconds` and return its report (`report.flat` is the verdict)."""
    report = SoakReport(seconds, concurrency)
    rng = random.Random(seed)
    with tempfile.TemporaryDirectory(prefix="middlebox-soak-") as scratch:
        emulator = await start_emulator(EMULATOR, Path(scratch))
        upstream = Address.parse(emulator.url)
        try:
            async with trio.open_nursery() as nursery:
                trickle = await nursery.start(
                    partial(trio.serve_tcp, _trickle, 0, host="127.0.0.1")
                )
                trickle_at = Address("127.0.0.1", trickle[0].socket.getsockname()[1])
                servers: dict[str, ProxyServer] = {}
                ports: dict[str, int] = {}
                listeners = []
                for name, scenario in mix().items():
                    journal = (
                        JournalStore(capture=True, max_connections=100)
                        if name in JOURNALLED
                        else None
                    )
                    config = proxy_config(
                        trickle_at if name == LONG else upstream,
                        scenario,
                        journal=journal,
                        stages=None,  # a bare relay: the soak watches the shell's own fds and tasks
                    )
                    server = ProxyServer(config)
                    listener = listen(Address("127.0.0.1", 0))
                    listeners.append(listener)
                    ports[name] = await nursery.start(server.serve, listener)
                    servers[name] = server
                names = sorted(name for name in ports if name != LONG)
                await trio.sleep(0.2)
                report.baseline = {"fds": fds_of(), "tasks": tasks_now()}
                started = trio.current_time()
                deadline = started + seconds
                counter = [0]

                async def client() -> None:
                    while trio.current_time() < deadline:
                        counter[0] += 1
                        index = counter[0]
                        name = names[index % len(names)]
                        await one_request(
                            report,
                            ports[name],
                            name,
                            index,
                            rng.randint(4, 48),
                            abandon=rng.random() < 0.15,
                        )

                async def sampler() -> None:
                    while True:
                        report.samples.append(
                            Sample(
                                round(trio.current_time() - started, 3),
                                rss_of(),
                                fds_of(),
                                tasks_now(),
                                sum(s.active for s in servers.values()),
                                rss_of(emulator.pid),
                            )
                        )
                        await trio.sleep(interval)

                async with trio.open_nursery() as load:
                    load.start_soon(sampler)
                    async with trio.open_nursery() as clients:
                        clients.start_soon(long_client, report, ports[LONG], deadline)
                        for _ in range(concurrency):
                            clients.start_soon(client)
                    load.cancel_scope.cancel()
                with trio.move_on_after(10):
                    for server in servers.values():
                        await server.wait_idle()
                await trio.sleep(0.1)
                report.after = {"fds": fds_of(), "tasks": tasks_now()}
                nursery.cancel_scope.cancel()
            for listener in listeners:
                listener.close()
        finally:
            await stop_upstream(emulator)  # the process we started, by its handle
    check(report)
    return report


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m middlebox.tools.soak", description=__doc__)
    parser.add_argument("--seconds", type=float, default=float(os.environ.get("SOAK_SECONDS", 600)))
    parser.add_argument("--concurrency", type=int, default=8)
    parser.add_argument("--interval", type=float, default=5.0)
    parser.add_argument("--json", dest="json_path", help="Write the report (samples too) here.")
    parser.add_argument(
        "--long-stream-bytes",
        type=float,
        default=float(os.environ.get("SOAK_LONG_BYTES", 3.6e9)),
        help="Then this many bytes through a `middlebox proxy` process with coalescer, "
        "without and with --journal, its RSS flat (0: skip).",
    )
    args = parser.parse_args(argv)
    report = trio.run(soak, args.seconds, args.concurrency, args.interval)
    if args.long_stream_bytes > 0:
        for journal in (False, True):
            run = trio.run(partial(long_stream, int(args.long_stream_bytes), journal=journal))
            report.long_streams.append(run.summary())
            if not run.flat:
                report.problems.append(f"the proxy's RSS was not flat: {run.summary()}")
    print(report.summary())
    if args.json_path:
        data: dict[str, Any] = asdict(report)
        data["flat"] = report.flat
        Path(args.json_path).parent.mkdir(parents=True, exist_ok=True)
        Path(args.json_path).write_text(json.dumps(data, indent=1))
    return 0 if report.flat else 1


if __name__ == "__main__":
    sys.exit(main())
