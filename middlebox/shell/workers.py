"""Multi-worker proxy: N trio processes share one port, supervised by a parent.

A trio process runs on one core, so one proxy process tops out at one core of relaying
(docs/performance.md). Like nginx's `worker_processes`, `--workers N` forks N copies of
the single-process proxy. The parent opens N listening sockets on the same address with
`SO_REUSEPORT` before forking, so the kernel spreads new connections over the workers by
a hash of the 4-tuple (no thundering herd on one accept queue, unlike a single shared
listener where the busiest worker tends to win every accept). The parent keeps its
copies of the listeners, so a worker that dies is replaced on the same socket without
losing the connections queued on it.

Connection ids stay unique and per connection across workers: worker `i` of `n` numbers
its k-th connection `(k - 1) * n + i + 1`. With one worker that is 1, 2, 3 ..., the same
ids (and so the same seeded fault rngs) as the single-process proxy; with two workers
worker 0 gets 1, 3, 5 and worker 1 gets 2, 4, 6, so journals written per worker can be
merged without clashes and `(id - 1) % n` names the worker.

The parent only supervises: it blocks SIGTERM, SIGINT and SIGCHLD and waits for them
with `sigwaitinfo`, forwards a stop as SIGTERM to each child by PID (a second stop
forwards a second SIGTERM, which makes the children reset their live connections at
once, as the single-process proxy does on a second signal), and kills a child that has
not drained within the grace period plus five seconds. Each child is the
single-process proxy (`run_proxy`) on its inherited listener, in its own process
group, so a Ctrl-C in the terminal (sent to the foreground group) reaches it once,
through the parent. A worker dies with its supervisor: a SIGKILL of the parent sends
each worker SIGTERM (Linux's parent-death signal, `lifetime.die_with_parent`), which drains it
as a stop does. Per-worker counters live in a small shared memory block the parent
reads; a worker writes its accept count there on every accept.

The scenario's cross-connection fault state (`FaultContext.shared`) is one for all workers:
a second shared memory block under a lock (`middlebox.shell.state.MemoryBackend`), unless
the caller passes a store of its own (`--state redis://...`). The workers run trio on
CLOCK_MONOTONIC (`HostClock`), so the times kept there agree between them.

With `--control`, each worker counts what it relays (`observe.metrics.Metrics`) and writes
its exposition to a shared `MetricsBoard` every tick; the supervisor answers `GET /metrics`
with the sum (`WorkersControl`), so every connection is counted once, whichever worker took
it. The other control routes change one process's pipelines and stay single-process.
"""

from __future__ import annotations

import hmac
import json
import logging
import mmap
import os
import select
import signal
import socket
import struct
import time
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from functools import partial

import trio

from middlebox.observe.metrics import CONTENT_TYPE as METRICS_CONTENT_TYPE
from middlebox.observe.metrics import Metrics, sum_expositions
from middlebox.shell.lifetime import die_with_parent
from middlebox.shell.server import (
    Address,
    ProxyConfig,
    ProxyServer,
    listening_as,
    run_proxy,
)
from middlebox.shell.state import HostClock, MemoryBackend, scoped

log = logging.getLogger("middlebox.shell.workers")

# accepted, failed, refused, active (signed 64-bit each), one slot per worker.
_STATS = struct.Struct("4q")
# A worker that keeps dying is not restarted forever: at most this many restarts ...
MAX_RESTARTS = 5
# ... within this many seconds, after which the whole proxy stops with an error.
RESTART_WINDOW = 10.0
_STOP_SIGNALS = {signal.SIGTERM, signal.SIGINT}


@dataclass
class WorkerServer(ProxyServer):
    """A `ProxyServer` that numbers its connections so ids are unique over all workers."""

    worker_index: int = 0
    worker_count: int = 1
    # Called on every accept, so a replacement worker continues the numbering exactly.
    publish: Callable[[ProxyServer], None] | None = None
    # This worker's live counters (with --control), published to the supervisor's board.
    metrics: Metrics | None = None

    async def handle(self, client: socket.socket, connection_id: int) -> None:
        if self.publish is not None:
            self.publish(self)
        await super().handle(client, self.global_id(connection_id))

    def global_id(self, local_id: int) -> int:
        return (local_id - 1) * self.worker_count + self.worker_index + 1


def worker_server(
    config: ProxyConfig,
    index: int,
    count: int,
    board: MetricsBoard | None = None,
    publish: Callable[[ProxyServer], None] | None = None,
) -> WorkerServer:
    """Worker `index` of `count`, serving `config`. With a `board` (--control) it also counts
    its bytes and fault reports and writes its exposition there on every tick (run_proxy
    ticks every TICK_INTERVAL; the caller ticks once more when it has set the counters)."""
    if board is None:
        return WorkerServer(config, worker_index=index, worker_count=count, publish=publish)
    metrics = Metrics()
    observer, sink, tick = config.observer_factory, config.report_sink_factory, config.tick

    def ticked() -> None:
        if tick is not None:
            tick()
        board.publish(index, metrics.render(server, None))

    counted = replace(
        config,
        observer_factory=lambda cid, scenario: metrics.observe(
            observer(cid, scenario) if observer is not None else None
        ),
        report_sink_factory=lambda cid: metrics.sink(cid, sink(cid) if sink is not None else None),
        tick=ticked,
    )
    server = WorkerServer(  # named: its tick renders its counters
        counted, worker_index=index, worker_count=count, publish=publish, metrics=metrics
    )
    return server


@dataclass(frozen=True)
class WorkerStats:
    worker: int
    pid: int
    accepted: int
    failed: int
    refused: int
    active: int


@dataclass
class WorkersResult:
    """What the supervisor saw: each worker's counters, and how many were restarted."""

    port: int
    workers: list[WorkerStats] = field(default_factory=list)
    restarts: int = 0
    killed: int = 0

    @property
    def accepted(self) -> int:
        return sum(worker.accepted for worker in self.workers)

    def summary(self) -> str:
        per_worker = ", ".join(
            f"worker {w.worker} (pid {w.pid}): {w.accepted}" for w in self.workers
        )
        restarted = f"; {self.restarts} workers restarted" if self.restarts else ""
        return f"connections accepted: {self.accepted} [{per_worker}]{restarted}"


class MetricsBoard:
    """Each worker's latest `/metrics` text in shared memory, one slot per worker, which the
    supervisor sums (`sum_expositions`) when asked; a worker rewrites its slot every
    `TICK_INTERVAL` and once more after draining. A slot is written length last, so a
    reader sees the old text or the new one (the supervisor reads between its waits)."""

    SLOT = 256 * 1024

    def __init__(self, workers: int) -> None:
        self.block = mmap.mmap(-1, self.SLOT * workers)
        self.workers = workers

    def publish(self, index: int, text: str) -> None:
        data = text.encode()[: self.SLOT - 8]
        start = index * self.SLOT
        self.block[start : start + 8] = (0).to_bytes(8, "little")
        self.block[start + 8 : start + 8 + len(data)] = data
        self.block[start : start + 8] = len(data).to_bytes(8, "little")

    def texts(self) -> list[str]:
        out = []
        for index in range(self.workers):
            start = index * self.SLOT
            length = int.from_bytes(self.block[start : start + 8], "little")
            out.append(self.block[start + 8 : start + 8 + length].decode(errors="replace"))
        return out

    def render(self) -> str:
        return sum_expositions(self.texts())


@dataclass
class WorkersControl:
    """`--control` with `--workers`: the supervisor answers `GET /metrics` with the sum over
    workers on this listener, between its signal waits. Changing the scenario or the faults
    is per process (each worker holds its own pipelines), so those routes answer 501."""

    listener: socket.socket
    token: str | None = None
    board: MetricsBoard | None = None

    def answer(self, conn: socket.socket) -> None:
        conn.settimeout(CONTROL_READ_TIMEOUT)
        head = b""
        while b"\r\n\r\n" not in head and len(head) < 64 * 1024:
            data = conn.recv(4096)
            if not data:
                return
            head += data
        lines = head.split(b"\r\n\r\n", 1)[0].decode("latin-1").split("\r\n")
        method, _, rest = lines[0].partition(" ")
        path = rest.partition(" ")[0].split("?", 1)[0]
        headers = {
            name.strip().lower(): value.strip()
            for name, _, value in (line.partition(":") for line in lines[1:])
        }
        if self.token is not None and not hmac.compare_digest(
            headers.get("authorization", "").encode(), f"Bearer {self.token}".encode()
        ):
            self._send(conn, 401, b'{"error": "unauthorised"}\n', "application/json")
        elif method == "GET" and path == "/metrics" and self.board is not None:
            self._send(conn, 200, self.board.render().encode(), METRICS_CONTENT_TYPE)
        else:
            why = (
                "with --workers the control API serves GET /metrics (summed over the "
                "workers); scenario, fault and journal routes need one process"
            )
            body = json.dumps({"error": why, "routes": ["GET /metrics"]}).encode() + b"\n"
            self._send(conn, 501, body, "application/json")

    @staticmethod
    def _send(conn: socket.socket, status: int, body: bytes, content_type: str) -> None:
        reason = {200: "OK", 401: "Unauthorized", 501: "Not Implemented"}[status]
        head = (
            f"HTTP/1.1 {status} {reason}\r\nContent-Type: {content_type}\r\n"
            f"Content-Length: {len(body)}\r\nConnection: close\r\n\r\n"
        )
        conn.sendall(head.encode() + body)

    def serve_for(self, seconds: float) -> None:
        """Answer the requests that arrive within `seconds` (one at a time: it is a
        scrape endpoint), then return so the supervisor can look at its signals."""
        readable, _, _ = select.select([self.listener], [], [], seconds)
        if not readable:
            return
        try:
            conn, _ = self.listener.accept()
        except (BlockingIOError, InterruptedError):
            return
        with conn:
            try:
                self.answer(conn)
            except (OSError, UnicodeError, ValueError) as error:  # one scraper's problem
                log.info("control request failed: %s", error)


# How long the supervisor waits for a scraper's request head; it answers signals after.
CONTROL_READ_TIMEOUT = 2.0


def reuseport_listeners(address: Address, count: int, backlog: int = 1024) -> list[socket.socket]:
    """`count` listening sockets on one address with SO_REUSEPORT; port 0 picks one port."""
    family = socket.AF_INET6 if ":" in address.host else socket.AF_INET
    listeners: list[socket.socket] = []
    port = address.port
    try:
        for _ in range(count):
            sock = socket.socket(family, socket.SOCK_STREAM)
            listeners.append(sock)
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
            with listening_as("listen", address):
                sock.bind((address.host, port))
            port = sock.getsockname()[1]
            sock.listen(backlog)
            sock.setblocking(False)
    except OSError:
        for sock in listeners:
            sock.close()
        raise
    return listeners


class _Supervisor:
    def __init__(
        self,
        address: Address,
        listeners: list[socket.socket],
        config: ProxyConfig,
        grace: float,
        finish: Callable[[int, ProxyServer], None] | None,
        control: WorkersControl | None = None,
    ) -> None:
        self.control = control
        self.address = address
        self.listeners = listeners
        self.config = config
        self.grace = grace
        self.finish = finish
        self.stats = mmap.mmap(-1, _STATS.size * len(listeners))
        self.pids: dict[int, int] = {}  # pid -> worker index
        self.last_pid = [0] * len(listeners)
        self.restart_times: list[float] = []
        self.result = WorkersResult(port=listeners[0].getsockname()[1])

    def spawn(self, index: int) -> None:
        supervisor = os.getpid()
        pid = os.fork()
        if pid == 0:  # the child: never returns
            code = 0
            try:
                die_with_parent(supervisor)  # a SIGKILL of the supervisor stops it too
                # Out of the terminal's process group: a Ctrl-C reaches the workers once,
                # as the parent's SIGTERM, and not also directly (a second stop resets).
                os.setpgid(0, 0)
                signal.pthread_sigmask(signal.SIG_UNBLOCK, _STOP_SIGNALS | {signal.SIGCHLD})
                for other, sock in enumerate(self.listeners):
                    if other != index:
                        sock.close()
                if self.control is not None:
                    self.control.listener.close()  # the supervisor's, not a worker's
                board = self.control.board if self.control is not None else None
                publish = self._publisher(index)
                server = worker_server(self.config, index, len(self.listeners), board, publish)
                # A replacement continues its predecessor's counters and connection ids.
                accepted, failed, refused, _ = _STATS.unpack_from(self.stats, index * _STATS.size)
                server.connections_accepted = accepted
                server.connections_failed = failed
                server.connections_refused = refused
                if board is not None and server.config.tick is not None:
                    server.config.tick()  # a worker just (re)started shows at once
                trio.run(
                    partial(
                        run_proxy,
                        self.address,
                        server,
                        grace=self.grace,
                        listener=self.listeners[index],
                    ),
                    clock=HostClock(),  # times in the shared state agree across workers
                )
                publish(server)
                if server.config.tick is not None:
                    server.config.tick()  # the final counters (and journal flush) after draining
                if self.finish is not None:
                    self.finish(index, server)
            except BaseException:
                log.exception("worker %d failed", index)
                code = 1
            finally:
                os._exit(code)
        self.pids[pid] = index
        self.last_pid[index] = pid

    def _publisher(self, index: int) -> Callable[[ProxyServer], None]:
        def publish(server: ProxyServer) -> None:
            refused = server.connections_refused
            _STATS.pack_into(
                self.stats,
                index * _STATS.size,
                server.connections_accepted,
                server.connections_failed,
                refused,
                server.active,
            )

        return publish

    def reap(self, *, restart: bool) -> None:
        while self.pids:
            try:
                pid, status = os.waitpid(-1, os.WNOHANG)
            except ChildProcessError:
                self.pids.clear()
                return
            if pid == 0:
                return
            index = self.pids.pop(pid, None)
            if index is None or not restart:
                continue
            log.warning("worker %d (pid %d) exited with status %d; restarting", index, pid, status)
            now = time.monotonic()
            self.restart_times = [t for t in self.restart_times if now - t < RESTART_WINDOW]
            if len(self.restart_times) >= MAX_RESTARTS:
                raise RuntimeError(f"workers died {MAX_RESTARTS} times in {RESTART_WINDOW:.0f}s")
            self.restart_times.append(now)
            self.result.restarts += 1
            self.spawn(index)

    def signal_all(self, signum: int) -> None:
        for pid in list(self.pids):
            try:
                os.kill(pid, signum)
            except ProcessLookupError:
                pass

    def stop(self, waited: set[signal.Signals]) -> None:
        """Forward the stop, wait for the drain, kill what is left; all by PID."""
        self.signal_all(signal.SIGTERM)
        deadline = time.monotonic() + self.grace + 5.0
        while self.pids:
            left = deadline - time.monotonic()
            if left <= 0:
                self.result.killed += len(self.pids)
                self.signal_all(signal.SIGKILL)
                deadline = time.monotonic() + 5.0
                while self.pids and time.monotonic() < deadline:
                    signal.sigtimedwait({signal.SIGCHLD}, 0.1)
                    self.reap(restart=False)
                return
            info = signal.sigtimedwait(waited, min(left, 0.5))
            if info is not None and info.si_signo in _STOP_SIGNALS:
                self.signal_all(signal.SIGTERM)  # a second stop: reset at once
            self.reap(restart=False)

    def collect(self) -> WorkersResult:
        for index in range(len(self.listeners)):
            accepted, failed, refused, active = _STATS.unpack_from(self.stats, index * _STATS.size)
            self.result.workers.append(
                WorkerStats(index, self.last_pid[index], accepted, failed, refused, active)
            )
        return self.result


def run_workers(
    listen_address: Address,
    config: ProxyConfig,
    workers: int,
    *,
    ready: Callable[[int, list[int]], None] | None = None,
    grace: float = 10.0,
    backlog: int = 1024,
    finish: Callable[[int, ProxyServer], None] | None = None,
    control: WorkersControl | None = None,
) -> WorkersResult:
    """Fork `workers` proxy processes on one port, each serving `config`, and supervise them
    until SIGTERM/SIGINT.

    `ready(port, pids)` is called once every worker is forked (the listeners already
    queue connections). `finish(index, server)` runs in each worker after it drained, to
    write what it recorded (a journal per worker). Must be called from the main thread of
    a process without a running event loop (it forks)."""
    if workers < 1:
        raise ValueError("workers must be at least 1")

    # One scenario state for all workers ("first: 3" is three in all): memory shared by
    # the forks unless the config brings a store (a Redis shared by several proxies).
    memory = None
    if config.shared_state is None:
        memory = MemoryBackend()
        config = replace(config, shared_state=scoped(memory))

    listeners = reuseport_listeners(listen_address, workers, backlog)
    waited = _STOP_SIGNALS | {signal.SIGCHLD}
    previous = signal.pthread_sigmask(signal.SIG_BLOCK, waited)
    if control is not None and control.board is None:
        control.board = MetricsBoard(workers)
    supervisor = _Supervisor(listen_address, listeners, config, grace, finish, control)
    try:
        for index in range(workers):
            supervisor.spawn(index)
        if ready is not None:
            ready(supervisor.result.port, list(supervisor.last_pid))
        while True:
            if control is None:
                info = signal.sigwaitinfo(waited)
            else:
                # Signals stay blocked (pending) while the supervisor answers a scrape.
                control.serve_for(0.1)
                found = signal.sigtimedwait(waited, 0)
                if found is None:
                    continue
                info = found
            if info.si_signo in _STOP_SIGNALS:
                break
            supervisor.reap(restart=True)
    finally:
        supervisor.stop(waited)
        signal.pthread_sigmask(signal.SIG_SETMASK, previous)
        for sock in listeners:
            sock.close()
        if memory is not None:
            memory.close()
    return supervisor.collect()
