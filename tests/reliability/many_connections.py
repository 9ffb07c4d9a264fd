"""The journal at scale, by hand: many short connections through `middlebox proxy
--journal FILE`, the proxy's RSS sampled as it goes, the journal read back at the end.

    python -m tests.reliability.many_connections --connections 100000
    python -m tests.reliability.many_connections --connections 20000 --kill-at 10000

Not collected by pytest (the suite's short version is test_journal_bounded.py). Run as
root, it runs the upstream, the proxy and the client driver inside a network namespace it
creates (`mb-100k-<pid>`) with that namespace's own `ip_local_port_range=1024 65535` and
`tcp_tw_reuse=1`: the by-hand run on the host's defaults stopped at 22,442 connections when
~28k loopback ports were held in TIME_WAIT (Linux keeps a closed port 60 s). The namespace
is deleted at the end, on failure too. Without netns the client spreads its connections
over source addresses 127.0.0.2..N instead (each address has its own port space).

`--kill-at K` SIGKILLs the proxy once K connections have finished at the client, with
`--concurrency` more in flight, and checks that every connection the client saw finish
before the kill is complete in the journal (ids, summary, the response bytes).
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from tests.reliability.support import MIDDLEBOX, journalled_proxy, listening_port

ROOT = Path(__file__).resolve().parents[2]
# each request names its number, so the journal's connections map back to the client's
GET = "GET /c/{} HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n"
ANSWER = b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\nConnection: close\r\n\r\nok"
NAMESPACE_SYSCTLS = ("net.ipv4.ip_local_port_range=1024 65535", "net.ipv4.tcp_tw_reuse=1")


def rss_mib(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    raise RuntimeError(f"no VmRSS for {pid}")


async def serve_upstream() -> None:
    """The upstream: reads one request head, answers two bytes and closes; prints its port."""

    async def answer(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            await reader.readuntil(b"\r\n\r\n")
            writer.write(ANSWER)
            await writer.drain()
        except (asyncio.IncompleteReadError, ConnectionError):
            pass
        finally:
            writer.close()

    server = await asyncio.start_server(answer, "127.0.0.1", 0, backlog=1024)
    print(server.sockets[0].getsockname()[1], flush=True)
    async with server:
        await server.serve_forever()


class Driver:
    """The client: `concurrency` workers, each one connection at a time, until `count`
    have been started or the deadline passes; RSS sampled every `sample_every`."""

    def __init__(self, args: argparse.Namespace, port: int, proxy_pid: int) -> None:
        self.args, self.port, self.proxy_pid = args, port, proxy_pid
        self.started = self.finished = self.failed = 0
        self.samples: list[tuple[int, float]] = []
        self.errors: list[str] = []
        self.deadline = time.monotonic() + args.max_seconds
        self.killed_after: int | None = None
        self.finished_at: dict[int, float] = {}  # request number: when the client had it all
        self.killed_at = 0.0

    async def one(self, number: int) -> None:
        local = (f"127.0.0.{2 + number % self.args.sources}", 0) if self.args.sources else None
        reader, writer = await asyncio.open_connection("127.0.0.1", self.port, local_addr=local)
        try:
            writer.write(GET.format(number).encode())
            data = await reader.read()
        finally:
            writer.close()
        if not data.endswith(b"\r\n\r\nok"):
            raise RuntimeError(f"short answer {data[-40:]!r}")

    async def worker(self) -> None:
        while self.killed_after is None and self.started < self.args.connections:
            if time.monotonic() > self.deadline:
                return
            self.started += 1
            number = self.started
            try:
                await self.one(number)
            except (OSError, RuntimeError) as error:
                if self.killed_after is not None:
                    return  # cut by our own SIGKILL: not a finished connection
                self.failed += 1
                if len(self.errors) < 10:
                    self.errors.append(f"{type(error).__name__}: {error}")
                continue
            if self.killed_after is not None:
                return
            self.finished += 1
            self.finished_at[number] = time.monotonic()
            if self.finished % self.args.sample_every == 0:
                self.samples.append((self.finished, rss_mib(self.proxy_pid)))
                print(
                    f"{self.finished} finished, proxy RSS {self.samples[-1][1]:.1f} MiB", flush=True
                )
            if self.args.kill_at and self.finished == self.args.kill_at:
                # the others are mid-exchange: those are the open connections' tail
                self.killed_after = self.finished
                self.killed_at = time.monotonic()
                os.kill(self.proxy_pid, signal.SIGKILL)  # the proxy we started, by PID

    async def run(self) -> None:
        await asyncio.gather(*(self.worker() for _ in range(self.args.concurrency)))


def check_journal(path: Path, finished_at: dict[int, float], killed_at: float) -> dict[str, Any]:
    """Streams the journal: which connections have a summary, whose client-side download
    ends in the answer's body, which request number each carried, the writer's totals.

    Without a kill, the ids are 1..N, each complete and carrying one of the N requests.
    With one (`killed_at`), every request the client had finished more than a second
    before it must be a complete connection. Those finished in the last second may be
    missing: the proxy passes the upstream's FIN on at once (faithful ends), so the
    client has its EOF while the proxy still waits for the client's FIN, and a
    connection is written whole when it ends at the proxy; the open ones' records are
    written by the writer's 1 s tick (observe.journal.JournalWriter)."""
    summaries: set[int] = set()
    answered: set[int] = set()
    number_of: dict[int, int] = {}
    opened: set[int] = set()
    totals: dict[str, Any] = {}
    cut_last_line = False
    with path.open(encoding="utf-8") as lines:
        for text in lines:
            try:
                line = json.loads(text)
            except json.JSONDecodeError:
                cut_last_line = True  # only a SIGKILL mid-write leaves one, as the last
                continue
            if "connection" not in line:
                totals = line
                continue
            cid = int(line["connection"])
            kind = line.get("type")
            if kind == "open":
                opened.add(cid)
            elif kind == "summary":
                summaries.add(cid)
            elif (
                kind == "bytes"
                and (line["leg"], line["direction"]) == ("client", "downstream")
                and base64.b64decode(line["base64"]).endswith(b"\r\n\r\nok")
            ):
                answered.add(cid)
            elif kind == "bytes" and (line["leg"], line["direction"]) == ("client", "upstream"):
                request = base64.b64decode(line["base64"])
                number_of[cid] = int(request.split(b" ", 2)[1].rsplit(b"/", 1)[1])
    complete = summaries & answered
    result: dict[str, Any] = {
        "journal_bytes": path.stat().st_size,
        "connections_opened": len(opened),
        "connections_complete": len(complete),
        "summaries_without_answer": len(summaries - answered),
        "open_without_summary": len(opened - summaries),
        "cut_last_line": cut_last_line,
        "totals": totals,
    }
    numbers_complete = {number_of[cid] for cid in complete if cid in number_of}
    missing = set(finished_at) - numbers_complete
    if killed_at:
        recent = {n for n in missing if killed_at - finished_at[n] <= 1.0}
        result["finished_in_the_last_second"] = sum(
            killed_at - at <= 1.0 for at in finished_at.values()
        )
        result["of_which_missing"] = len(recent)
        missing -= recent
    result["finished_at_client_missing"] = sorted(missing)[:20]
    result["missing_count"] = len(missing)
    if not killed_at:
        wanted = set(range(1, len(finished_at) + 1))
        result["ids_not_1_to_n"] = len(wanted ^ complete)
        result["missing_count"] += len(wanted ^ complete)
    return result


def pcap_sample(journal: Path, workdir: Path, first: int) -> dict[str, Any]:
    """The first `first` connections through `middlebox pcap`, read back by tshark."""
    head = workdir / "head.ndjson"
    with journal.open(encoding="utf-8") as lines, head.open("w", encoding="utf-8") as out:
        for text in lines:
            try:
                cid = int(json.loads(text).get("connection", 0))
            except json.JSONDecodeError:
                continue
            if 0 < cid <= first:
                out.write(text)
    pcap = workdir / "sample.pcapng"
    subprocess.run([*MIDDLEBOX, "pcap", str(head), "-o", str(pcap)], cwd=ROOT, check=True)
    result: dict[str, Any] = {"pcap_bytes": pcap.stat().st_size}
    if shutil.which("tshark"):
        streams = subprocess.run(
            ["tshark", "-r", str(pcap), "-T", "fields", "-e", "tcp.stream"],
            capture_output=True,
            text=True,
            check=True,
            timeout=300,
        ).stdout.split()
        result["tshark_packets"] = len(streams)
        result["tshark_tcp_streams"] = len(set(streams))  # two legs per connection
    return result


def inside(args: argparse.Namespace) -> dict[str, Any]:
    workdir = Path(args.workdir)
    journal = workdir / "journal.ndjson"
    upstream = subprocess.Popen(
        [sys.executable, "-m", __spec__.name, "--upstream"], stdout=subprocess.PIPE, cwd=ROOT
    )
    proxy: subprocess.Popen[bytes] | None = None
    try:
        assert upstream.stdout is not None
        upstream_port = int(upstream.stdout.readline())
        proxy = subprocess.Popen(
            journalled_proxy(upstream_port, journal),
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            cwd=ROOT,
        )
        assert proxy.stdout is not None
        port = listening_port(proxy.stdout.readline().decode())
        if args.proxy_nice is not None:
            # the proxy is the work being measured: on a shared machine its fair share
            # of the CPU, not the journal, sets the pace
            os.setpriority(os.PRIO_PROCESS, proxy.pid, args.proxy_nice)
        start_rss = rss_mib(proxy.pid)
        driver = Driver(args, port, proxy.pid)
        began = time.monotonic()
        asyncio.run(driver.run())
        elapsed = time.monotonic() - began
        end_rss = rss_mib(proxy.pid) if proxy.poll() is None else None
        if driver.killed_after is None:
            # every finished connection is flushed as it ends; SIGTERM writes the totals
            proxy.send_signal(signal.SIGTERM)
        proxy.wait(timeout=60)
    finally:
        for child in (proxy, upstream):
            if child is not None and child.poll() is None:
                child.kill()  # the processes we started, by their handles
                child.wait()
    report: dict[str, Any] = {
        "connections_asked": args.connections,
        "client_finished": driver.finished,
        "client_failed": driver.failed,
        "client_errors": driver.errors,
        "killed_after": driver.killed_after,
        "seconds": round(elapsed, 1),
        "per_second": round(driver.finished / elapsed, 1),
        "proxy_rss_mib": {"start": round(start_rss, 1), "end": end_rss and round(end_rss, 1)},
        "rss_samples": [(n, round(mib, 1)) for n, mib in driver.samples],
        "proxy_exit": proxy.returncode if proxy else None,
    }
    report["journal"] = check_journal(journal, driver.finished_at, driver.killed_at)
    report["pcap"] = pcap_sample(journal, workdir, args.pcap_sample)
    return report


def run_in_namespace(args: argparse.Namespace, workdir: Path) -> int:
    namespace = f"mb-100k-{os.getpid()}"
    inner = [
        sys.executable,
        "-m",
        __spec__.name,
        *sys.argv[1:],
        "--inside",
        "--workdir",
        str(workdir),
    ]
    try:
        subprocess.run(["ip", "netns", "add", namespace], check=True)
    except (OSError, subprocess.CalledProcessError) as error:
        print(
            f"no network namespace ({error}): spreading over {args.sources or 16} source "
            "addresses on the host's loopback instead",
            flush=True,
        )
        if not args.sources:
            inner += ["--sources", "16"]
        return subprocess.run(inner, cwd=ROOT).returncode
    try:
        run_ns = ["ip", "netns", "exec", namespace]
        subprocess.run([*run_ns, "ip", "link", "set", "lo", "up"], check=True)
        for setting in NAMESPACE_SYSCTLS:
            subprocess.run([*run_ns, "sysctl", "-q", "-w", setting], check=True)
        return subprocess.run([*run_ns, "nice", "-n", str(args.nice), *inner], cwd=ROOT).returncode
    finally:
        subprocess.run(["ip", "netns", "del", namespace], check=False)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--connections", type=int, default=100_000)
    parser.add_argument("--concurrency", type=int, default=8)
    parser.add_argument("--sample-every", type=int, default=5_000)
    parser.add_argument("--max-seconds", type=float, default=1_080)
    parser.add_argument("--kill-at", type=int, default=0, help="SIGKILL the proxy after K")
    parser.add_argument("--sources", type=int, default=0, help="client source addresses")
    parser.add_argument("--pcap-sample", type=int, default=200)
    parser.add_argument("--nice", type=int, default=5)
    parser.add_argument("--proxy-nice", type=int, help="the proxy's own nice value")
    parser.add_argument("--json", help="write the report here too")
    parser.add_argument("--keep", action="store_true", help="keep the journal's folder")
    parser.add_argument("--inside", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--workdir", help=argparse.SUPPRESS)
    parser.add_argument("--upstream", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.upstream:
        asyncio.run(serve_upstream())
        return 0
    if args.inside:
        report = inside(args)
        print(json.dumps(report, indent=1))
        if args.json:
            Path(args.json).write_text(json.dumps(report, indent=1) + "\n")
        journal = report["journal"]
        ok = journal["missing_count"] == 0 and report["client_failed"] == 0
        # a run cut by --max-seconds is not the run asked for
        ok = ok and (
            report["killed_after"] is not None or report["client_finished"] == args.connections
        )
        return 0 if ok else 1
    if args.json:
        args.json = str(Path(args.json).resolve())
        Path(args.json).parent.mkdir(parents=True, exist_ok=True)
    workdir = Path(tempfile.mkdtemp(prefix="mb-100k-"))
    try:
        return run_in_namespace(args, workdir)
    finally:
        if args.keep:
            print(f"journal kept in {workdir}")
        else:
            shutil.rmtree(workdir, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
