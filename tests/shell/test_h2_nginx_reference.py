"""middlebox's HTTP/2 faults against a real nginx `listen ... ssl http2` (Debian's nginx),
frame by frame, where they claim to model nginx (docs/calibration.md "TLS and HTTP/2: nginx ssl
http2"): the announced stream limit and the stream past it, a slow reader's window, a reload's
GOAWAY drain with worker_shutdown_timeout against `goaway`, a dead worker against
`rst_stream: {scope: connection}`.

Real processes on 127.0.0.1 (nginx, `middlebox proxy --tls`, a threaded SSE upstream), each
stopped by PID; every wait is bounded. Skips without nginx, never under CI=true (.ci/run
installs it).
"""

from __future__ import annotations

import os
import shutil
import signal
import socket
import ssl
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

import h2.config
import h2.connection
import h2.events
import h2.exceptions
import pytest

from middlebox.shell.tls import LocalCA
from tests.harness import free_port, needs
from tests.request_readers import recv_until
from tests.shell.test_h2_streams import RawFrames

NGINX = shutil.which("nginx") or ("/usr/sbin/nginx" if Path("/usr/sbin/nginx").exists() else None)
pytestmark = needs(NGINX, "nginx")

ROOT = Path(__file__).resolve().parents[2]
REFUSED_STREAM = 0x7
SETTINGS_MAX_CONCURRENT_STREAMS = 0x3


def wait_listening(port: int, process: subprocess.Popen[bytes]) -> None:
    deadline = time.monotonic() + 15
    while time.monotonic() < deadline:
        assert process.poll() is None, "the server exited at start-up"
        try:
            socket.create_connection(("127.0.0.1", port), 0.2).close()
            return
        except OSError:
            time.sleep(0.05)
    raise AssertionError(f"nothing listens on {port}")


def stop(process: subprocess.Popen[bytes]) -> None:
    if process.poll() is None:
        process.terminate()
        try:
            process.wait(10)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait(5)


@dataclass
class Upstream:
    """GET /COUNT/MS[/SIZE]: COUNT SSE events of SIZE bytes, MS apart, chunked, then the end."""

    port: int
    listener: socket.socket

    def serve_forever(self) -> None:
        while True:
            try:
                connection, _ = self.listener.accept()
            except OSError:
                return
            threading.Thread(target=self.answer, args=(connection,), daemon=True).start()

    @staticmethod
    def answer(connection: socket.socket) -> None:
        with connection:
            try:
                request = recv_until(connection, b"\r\n\r\n")
                if b"\r\n\r\n" not in request:
                    return
                count, ms, *size = request.split(b" ")[1].strip(b"/").split(b"/")
                connection.sendall(
                    b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\n"
                    b"Transfer-Encoding: chunked\r\n\r\n"
                )
                for n in range(int(count)):
                    event = b"data: " + (b"%d " % n).ljust(int(size[0]) if size else 20, b"x")
                    event += b"\n\n"
                    connection.sendall(b"%x\r\n%s\r\n" % (len(event), event))
                    time.sleep(float(ms) / 1000)
                connection.sendall(b"0\r\n\r\n")
            except OSError:
                pass


@pytest.fixture(scope="module")
def workdir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("nginx-h2")


@pytest.fixture(scope="module")
def ca(workdir: Path) -> LocalCA:
    return LocalCA.load_or_create(workdir / "ca")


@pytest.fixture(scope="module")
def upstream() -> Iterator[Upstream]:
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(512)
    served = Upstream(listener.getsockname()[1], listener)
    threading.Thread(target=served.serve_forever, daemon=True).start()
    yield served
    listener.close()


@pytest.fixture
def nginx(workdir: Path, ca: LocalCA, upstream: Upstream) -> Iterator[tuple[int, int]]:
    """nginx with `listen ... ssl http2`, worker_shutdown_timeout 1s: (port, master pid)."""
    chain, key = ca.issue(["127.0.0.1"])
    (workdir / "leaf.pem").write_bytes(chain)
    (workdir / "leaf.key").write_bytes(key)
    port = free_port()
    temp = " ".join(
        f"{kind}_temp_path {workdir}/{kind};" for kind in ("proxy", "fastcgi", "uwsgi", "scgi")
    )
    user = "user root;" if os.geteuid() == 0 else ""
    (workdir / "nginx.conf").write_text(
        f"""{user} worker_processes 1; daemon off; pid {workdir}/nginx.pid;
error_log {workdir}/error.log info; worker_shutdown_timeout 1s;
events {{ }}
http {{ access_log off; client_body_temp_path {workdir}/body; {temp}
  server {{ listen 127.0.0.1:{port} ssl http2;
    ssl_certificate {workdir}/leaf.pem; ssl_certificate_key {workdir}/leaf.key;
    location / {{ proxy_pass http://127.0.0.1:{upstream.port}; proxy_buffering off; }} }} }}
"""
    )
    assert NGINX is not None
    process = subprocess.Popen([NGINX, "-p", str(workdir), "-c", str(workdir / "nginx.conf")])
    try:
        wait_listening(port, process)
        yield port, process.pid
    finally:
        stop(process)


@pytest.fixture
def middlebox(workdir: Path, upstream: Upstream) -> Iterator[Callable[..., int]]:
    """Start `middlebox proxy --tls` with a scenario's `path:` lines; returns its port."""
    started: list[subprocess.Popen[bytes]] = []

    def start(path_yaml: str = "  []") -> int:
        scenario = workdir / f"scenario-{len(started)}.yaml"
        scenario.write_text(f"name: nginx-reference\npath:\n{path_yaml}\n")
        port = free_port()
        argv = [sys.executable, "-c", "from middlebox.cli.main import main; main()", "proxy"]
        argv += ["--tls", "--ca-dir", str(workdir / "ca"), "--listen", f"127.0.0.1:{port}"]
        argv += ["--upstream", f"http://127.0.0.1:{upstream.port}", "--scenario", str(scenario)]
        process = subprocess.Popen(argv, cwd=ROOT, stdout=subprocess.DEVNULL)
        started.append(process)
        wait_listening(port, process)
        return port

    yield start
    for process in started:
        stop(process)


@dataclass
class Probe:
    """A TLS h2 client that logs every frame (`RawFrames`), beside h2's state machine, which
    cannot follow a GOAWAY drain (it is CLOSED then): after h2 fails, only frames are read,
    and nothing more is sent (h2 would answer with a GOAWAY of its own)."""

    sock: ssl.SSLSocket
    conn: h2.connection.H2Connection
    frames: RawFrames = field(default_factory=RawFrames)
    settings: dict[int, int] = field(default_factory=dict)
    window_updates: list[tuple[int, int]] = field(default_factory=list)
    end: str | None = (
        None  # how the connection ended: "eof" (no close_notify), "close_notify", "rst"
    )
    h2_failed: bool = False
    acknowledge: bool = True

    @classmethod
    def connect(cls, port: int, ca: LocalCA) -> Probe:
        context = ssl.create_default_context(cafile=str(ca.cert_path))
        context.set_alpn_protocols(["h2"])
        raw = socket.create_connection(("127.0.0.1", port), 5)
        sock = context.wrap_socket(raw, server_hostname="127.0.0.1", suppress_ragged_eofs=False)
        assert sock.selected_alpn_protocol() == "h2"
        conn = h2.connection.H2Connection(
            h2.config.H2Configuration(client_side=True, header_encoding=None)
        )
        conn.initiate_connection()
        sock.sendall(conn.data_to_send())
        return cls(sock, conn)

    def get(self, path: str) -> int:
        stream_id = self.conn.get_next_available_stream_id()
        self.conn.send_headers(
            stream_id,
            [(":method", "GET"), (":path", path), (":scheme", "https"), (":authority", "t")],
            end_stream=True,
        )
        return stream_id

    def flush(self) -> None:
        if not self.h2_failed and (data := self.conn.data_to_send()):
            self.sock.sendall(data)

    def read(self, until: Callable[[], bool] = lambda: False, seconds: float = 5.0) -> None:
        deadline = time.monotonic() + seconds
        while self.end is None and not until() and time.monotonic() < deadline:
            self.sock.settimeout(max(0.01, deadline - time.monotonic()))
            try:
                data = self.sock.recv(65536)
            except TimeoutError:
                return
            except ssl.SSLEOFError:
                self.end = "eof"
                return
            except (ConnectionResetError, BrokenPipeError):
                self.end = "rst"
                return
            if not data:
                self.end = "close_notify"
                return
            self.frames.feed(data)
            if self.h2_failed:
                continue
            try:
                events = self.conn.receive_data(data)
            except h2.exceptions.ProtocolError:
                self.h2_failed = True
                continue
            for event in events:
                if isinstance(event, h2.events.RemoteSettingsChanged):
                    for code, changed in event.changed_settings.items():
                        self.settings[int(code)] = changed.new_value
                if isinstance(event, h2.events.WindowUpdated):
                    self.window_updates.append((event.stream_id, event.delta))
                if self.acknowledge and isinstance(event, h2.events.DataReceived):
                    self.conn.acknowledge_received_data(
                        event.flow_controlled_length, event.stream_id
                    )
            self.flush()

    def close(self) -> None:
        self.sock.close()


def over_the_limit(port: int, ca: LocalCA) -> Probe:
    """130 streams sent before the server's SETTINGS is read (so h2 lets them through)."""
    probe = Probe.connect(port, ca)
    for _ in range(130):
        probe.get("/3/100")
    probe.flush()
    probe.read(lambda: len(probe.frames.ended) + len(probe.frames.resets) >= 130, seconds=15)
    probe.close()
    return probe


def test_the_stream_past_the_announced_limit_is_refused_alone_like_nginx(
    nginx: tuple[int, int], middlebox: Callable[..., int], ca: LocalCA
) -> None:
    seen = {"nginx": over_the_limit(nginx[0], ca), "middlebox": over_the_limit(middlebox(), ca)}
    for name, probe in seen.items():
        assert probe.settings[SETTINGS_MAX_CONCURRENT_STREAMS] == 128, name
        # the 129th and 130th streams (ids 257, 259) are refused, the other 128 served
        assert probe.frames.resets == {257: REFUSED_STREAM, 259: REFUSED_STREAM}, name
        assert len(probe.frames.ended) == 128 and probe.frames.goaway is None, name


def slow_reader(port: int, ca: LocalCA) -> int:
    probe = Probe.connect(port, ca)
    probe.acknowledge = False  # never a WINDOW_UPDATE: the stream's window closes
    stream_id = probe.get("/400/1/1000")
    probe.flush()
    probe.read(seconds=2.0)
    probe.close()
    assert stream_id not in probe.frames.ended and not probe.frames.resets
    return len(probe.frames.data.get(stream_id, b""))


def test_a_slow_reader_gets_its_initial_window_and_then_nothing_like_nginx(
    nginx: tuple[int, int], middlebox: Callable[..., int], ca: LocalCA
) -> None:
    # 400 KB of events wait upstream; both send exactly the client's initial 65,535 bytes
    assert slow_reader(nginx[0], ca) == slow_reader(middlebox(), ca) == 65535


def drained(port: int, ca: LocalCA, trigger: Callable[[], None]) -> Probe:
    """Stream 1 (12 events, 0.6 s) and stream 3 (60 events, 3 s) in flight at the GOAWAY."""
    probe = Probe.connect(port, ca)
    short, long = probe.get("/12/50"), probe.get("/60/50")
    probe.flush()
    probe.read(lambda: bool(probe.frames.data), seconds=5)
    trigger()
    probe.read(lambda: probe.frames.goaway is not None, seconds=5)
    probe.read(seconds=5)
    probe.close()
    assert (short, long) == (1, 3)
    return probe


def test_a_goaway_drain_with_a_grace_is_nginx_s_reload_with_worker_shutdown_timeout(
    nginx: tuple[int, int], middlebox: Callable[..., int], ca: LocalCA
) -> None:
    reload = drained(nginx[0], ca, lambda: os.kill(nginx[1], signal.SIGHUP))
    port = middlebox("  - goaway: {after_streams: 2, grace: 1s}")
    fault = drained(port, ca, lambda: None)
    for name, probe in (("nginx reload", reload), ("goaway", fault)):
        assert probe.frames.goaway == (3, 0), name  # NO_ERROR, the highest stream served
        assert 1 in probe.frames.ended, name  # the short stream finishes
        assert 3 not in probe.frames.ended and not probe.frames.resets, name  # cut, no RST_STREAM
        assert probe.end == "eof", name  # a TCP close without close_notify


def dropped(port: int, ca: LocalCA, trigger: Callable[[], None]) -> Probe:
    probe = Probe.connect(port, ca)
    for _ in range(3):
        probe.get("/100/50")
    probe.flush()
    probe.read(lambda: all(len(probe.frames.data.get(s, b"")) for s in (1, 3, 5)), seconds=5)
    trigger()
    probe.read(seconds=5)
    probe.close()
    return probe


def kill_workers(master: int) -> None:
    found = subprocess.run(
        ["pgrep", "-P", str(master)], capture_output=True, text=True, check=False
    )
    for worker in found.stdout.split():
        os.kill(int(worker), signal.SIGKILL)


def test_a_dropped_connection_kills_every_stream_like_a_killed_nginx_worker(
    nginx: tuple[int, int], middlebox: Callable[..., int], ca: LocalCA
) -> None:
    killed = dropped(nginx[0], ca, lambda: kill_workers(nginx[1]))
    port = middlebox("  - rst_stream: {stream: 1, after_events: 2, scope: connection}")
    fault = dropped(port, ca, lambda: None)
    for name, probe in (("nginx worker killed", killed), ("rst_stream connection", fault)):
        assert probe.end in ("eof", "rst"), name  # no close_notify: a crash, not a close
        assert probe.frames.goaway is None and not probe.frames.resets, name
        assert not probe.frames.ended & {1, 3, 5}, name  # all three streams die at once
