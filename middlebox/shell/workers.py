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
each worker SIGTERM (Linux's parent-death signal, `die_with_supervisor`), which drains it
as a stop does. Per-worker counters live in a small shared memory block the parent
reads; a worker writes its accept count there on every accept.
"""

from __future__ import annotations

import logging
import mmap
import os
import signal
import socket
import struct
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from functools import partial
from typing import Any

import trio

from middlebox.scenario.model import Scenario
from middlebox.shell.server import Address, ProxyServer, run_proxy

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

    async def handle(self, client: socket.socket, connection_id: int) -> None:
        if self.publish is not None:
            self.publish(self)
        await super().handle(client, self.global_id(connection_id))

    def global_id(self, local_id: int) -> int:
        return (local_id - 1) * self.worker_count + self.worker_index + 1


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


# prctl(2) option: the signal this process gets when its parent dies.
PR_SET_PDEATHSIG = 1


def die_with_supervisor(supervisor: int) -> None:
    """A worker whose supervisor is gone gets SIGTERM (and drains as on any stop):
    PR_SET_PDEATHSIG, Linux's parent-death signal, so a SIGKILL of the supervisor does not
    leave workers serving on the port. The supervisor may have died between the fork and
    the prctl: then the worker's parent is already someone else and it stops at once."""
    import ctypes

    try:
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(PR_SET_PDEATHSIG, int(signal.SIGTERM), 0, 0, 0)
    except (OSError, AttributeError):  # not Linux: the supervisor's stop is the only stop
        return
    if os.getppid() != supervisor:
        os.kill(os.getpid(), signal.SIGTERM)


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
        make_server: Callable[[int], ProxyServer],
        grace: float,
        finish: Callable[[int, ProxyServer], None] | None,
    ) -> None:
        self.address = address
        self.listeners = listeners
        self.make_server = make_server
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
                die_with_supervisor(supervisor)
                # Out of the terminal's process group: a Ctrl-C reaches the workers once,
                # as the parent's SIGTERM, and not also directly (a second stop resets).
                os.setpgid(0, 0)
                signal.pthread_sigmask(signal.SIG_UNBLOCK, _STOP_SIGNALS | {signal.SIGCHLD})
                for other, sock in enumerate(self.listeners):
                    if other != index:
                        sock.close()
                server = self.make_server(index)
                publish = self._publisher(index)
                # A replacement continues its predecessor's counters and connection ids.
                accepted, failed, refused, _ = _STATS.unpack_from(self.stats, index * _STATS.size)
                server.connections_accepted = accepted
                server.connections_failed = failed
                server.connections_refused = refused
                if isinstance(server, WorkerServer):
                    server.publish = publish
                trio.run(
                    partial(
                        run_proxy,
                        self.address,
                        server.upstream,
                        server.scenario,
                        server=server,
                        grace=self.grace,
                        listener=self.listeners[index],
                    )
                )
                publish(server)
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
            refused = getattr(server, "connections_refused", 0)
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
    upstream: Address,
    scenario: Scenario,
    workers: int,
    *,
    ready: Callable[[int, list[int]], None] | None = None,
    grace: float = 10.0,
    backlog: int = 1024,
    finish: Callable[[int, ProxyServer], None] | None = None,
    **server_options: Any,
) -> WorkersResult:
    """Fork `workers` proxy processes on one port and supervise them until SIGTERM/SIGINT.

    `ready(port, pids)` is called once every worker is forked (the listeners already
    queue connections). `server_options` go to each worker's `ProxyServer`
    (observer_factory, max_connections ...); `finish(index, server)` runs in each worker
    after it drained, to write what it recorded (a journal per worker). Must be called
    from the main thread of a process without a running event loop (it forks)."""
    if workers < 1:
        raise ValueError("workers must be at least 1")

    def make_server(index: int) -> ProxyServer:
        return WorkerServer(
            upstream,
            scenario,
            worker_index=index,
            worker_count=workers,
            **server_options,
        )

    listeners = reuseport_listeners(listen_address, workers, backlog)
    waited = _STOP_SIGNALS | {signal.SIGCHLD}
    previous = signal.pthread_sigmask(signal.SIG_BLOCK, waited)
    supervisor = _Supervisor(listen_address, listeners, make_server, grace, finish)
    try:
        for index in range(workers):
            supervisor.spawn(index)
        if ready is not None:
            ready(supervisor.result.port, list(supervisor.last_pid))
        while True:
            info = signal.sigwaitinfo(waited)
            if info.si_signo in _STOP_SIGNALS:
                break
            supervisor.reap(restart=True)
    finally:
        supervisor.stop(waited)
        signal.pthread_sigmask(signal.SIG_SETMASK, previous)
        for sock in listeners:
            sock.close()
    return supervisor.collect()
