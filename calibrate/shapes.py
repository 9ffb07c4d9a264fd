"""The stream shapes the presets are calibrated over, and the upstream that plays them.

One stream shape (the emulator at 20 ms, ~250-byte frames) hides what a preset gets wrong
on others (issue 15): a 4 KiB `proxy_buffering` slab fills after 136 frames of 30 bytes
but after 4 of 1 KiB; a cork that holds one segment splits 1 KiB frames where it merges
30-byte ones; a pause before the head is a prefill, one after it an idle stream that a
proxy may or may not hold; a client cancels with a FIN (drained first) or an RST.

`GRID` is those shapes. `FixedUpstream` is a plain upstream that writes exactly the
shape's frames on its schedule (stdlib sockets, one thread per connection), so frame size
and period are what the shape says and nothing else: not the emulator's tokenizer, not
its jitter. It answers an HTTP/1.0 request (nginx's default `proxy_http_version 1.0`)
close-delimited and an HTTP/1.1 one chunked, as uvicorn does, and keeps, per request, a
ledger entry in the emulator's shape (`received_at`, `token_times`, `disconnected_at`) so
the abandon measures read it the same way: it stops writing as soon as it learns the client left
(EOF on its read side, or a failed write), as vLLM aborts on disconnect.

The shape travels in the request's `prompt`: `shape=NAME;tag=TAG`.
"""

from __future__ import annotations

import json
import random
import select
import socket
import string
import threading
import time
from dataclasses import dataclass
from typing import Any

DONE = b"data: [DONE]\n\n"
HEARTBEAT = b": keep-alive\n\n"
TEXT_ALPHABET = string.ascii_letters + string.digits + " "
FRAME_OVERHEAD = len(b'data: {"text":""}\n\n')  # the smallest frame: an empty text


@dataclass(frozen=True)
class Shape:
    """One stream: `frames` SSE events of exactly `frame_bytes` bytes, one every
    `period` seconds; optionally a pause before the head (prefill) or after frame
    `pause_after` (with `heartbeat` comments every so many seconds while it lasts); and a
    client that cancels after `cancel_after` token events by `cancel` ("fin" or "rst")."""

    name: str
    frame_bytes: int
    period: float
    frames: int
    pause_before_head: float = 0.0
    pause_after: int | None = None
    pause: float = 0.0
    heartbeat: float | None = None
    cancel: str | None = None
    cancel_after: int | None = None

    def __post_init__(self) -> None:
        if self.frame_bytes < FRAME_OVERHEAD:
            raise ValueError(f"{self.name}: a frame is at least {FRAME_OVERHEAD} bytes")
        if (self.cancel is None) != (self.cancel_after is None):
            raise ValueError(f"{self.name}: cancel and cancel_after go together")
        if self.cancel not in (None, "fin", "rst"):
            raise ValueError(f"{self.name}: cancel is 'fin' or 'rst', not {self.cancel!r}")

    def frame(self, index: int) -> bytes:
        """Frame `index`: a `data:` event of exactly `frame_bytes` bytes whose JSON text
        is seeded letters and digits (seed: the frame's number), so frames differ, sizes
        stay exact and a gzip hop compresses them about as much as model text (a
        repeated pad would shrink 100-fold and hide when a compressed buffer fills)."""
        room = self.frame_bytes - FRAME_OVERHEAD
        text = "".join(random.Random(index).choices(TEXT_ALPHABET, k=room))
        data = b'data: {"text":"' + text.encode() + b'"}\n\n'
        assert len(data) == self.frame_bytes
        return data

    @property
    def duration(self) -> float:
        """How long the upstream takes to write the whole stream (seconds)."""
        return self.pause_before_head + self.frames * self.period + self.pause


GRID: tuple[Shape, ...] = (
    # frame sizes from a single-character completions stream to a re-framing gateway
    Shape("30B-10ms", frame_bytes=30, period=0.010, frames=150),
    Shape("60B-20ms", frame_bytes=60, period=0.020, frames=100),
    Shape("250B-20ms", frame_bytes=250, period=0.020, frames=60),
    Shape("1KB-10ms", frame_bytes=1024, period=0.010, frames=150),
    Shape("1KB-100ms", frame_bytes=1024, period=0.100, frames=20),
    # Every other shape's frames sit on a 200 ms grid from the head (periods 10, 20, 100
    # ms; the 10th frame before a pause or a cancel at 200 ms), on the edge of HAProxy's
    # cork (one RTO, 204 ms on loopback: docs/calibration.md), where a few ms of scheduling
    # decide which burst a frame joins. At 170 ms each cork takes two frames, 34 ms inside
    # its edge, the next frame 136 ms past it: the cork judged without the coin.
    Shape("250B-170ms", frame_bytes=250, period=0.170, frames=12),
    # a prefill before the head, an idle pause after it, the same pause kept alive
    Shape("prefill-800ms", frame_bytes=250, period=0.020, frames=40, pause_before_head=0.8),
    Shape("pause-600ms", frame_bytes=250, period=0.020, frames=40, pause_after=10, pause=0.6),
    Shape("pause-600ms-comments", 250, 0.020, 40, pause_after=10, pause=0.6, heartbeat=0.1),
    # cancellation by FIN (the client drains first) and by RST, after 10 frames
    Shape("cancel-fin", frame_bytes=250, period=0.020, frames=200, cancel="fin", cancel_after=10),
    Shape("cancel-rst", frame_bytes=250, period=0.020, frames=200, cancel="rst", cancel_after=10),
)
# Played with the read timeout the preset's idle_reaper stands for set to 1 s on both
# sides (calibrate/grid.py): a timeout before the head (nginx and HAProxy 504, Apache 502
# AH01102) and after it (a close without the terminal chunk; Caddy's `read_timeout` a
# clean terminal chunk without [DONE], the idle_reaper's `after_headers: finish`).
TIMEOUT_SHAPES: tuple[Shape, ...] = (
    Shape("timeout-before-head", frame_bytes=250, period=0.020, frames=10, pause_before_head=2.5),
    Shape("timeout-after-head", 250, 0.020, frames=20, pause_after=10, pause=2.5),
)
SHAPES = {shape.name: shape for shape in (*GRID, *TIMEOUT_SHAPES)}


def prompt_for(shape: Shape, tag: str) -> str:
    return f"shape={shape.name};tag={tag}"


def parse_prompt(prompt: str) -> tuple[str, str]:
    """`shape=NAME;tag=TAG` -> (NAME, TAG)."""
    fields = dict(part.split("=", 1) for part in prompt.split(";") if "=" in part)
    return fields.get("shape", ""), fields.get("tag", "")


def response_head(http10: bool) -> bytes:
    head = b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream; charset=utf-8\r\n"
    if http10:
        return head + b"connection: close\r\n\r\n"  # close-delimited, as uvicorn answers 1.0
    return head + b"transfer-encoding: chunked\r\n\r\n"


def framed(data: bytes, http10: bool) -> bytes:
    """Body bytes as the wire carries them: raw for HTTP/1.0, one chunk each for 1.1."""
    return data if http10 else b"%x\r\n%s\r\n" % (len(data), data)


class FixedUpstream:
    """A loopback upstream that plays `SHAPES` (see the module docstring). `port` once
    started; `ledger(tag)` is the entry of the request with that tag, or {}."""

    def __init__(self) -> None:
        self._listener = socket.create_server(("127.0.0.1", 0))
        self.port: int = self._listener.getsockname()[1]
        self._entries: dict[str, dict[str, Any]] = {}
        self._lock = threading.Lock()
        self._closing = threading.Event()
        self._accepting = threading.Thread(target=self._accept, daemon=True)

    def __enter__(self) -> FixedUpstream:
        self._accepting.start()
        return self

    def __exit__(self, *_: object) -> None:
        self._closing.set()
        self._listener.close()
        self._accepting.join(timeout=5)

    def ledger(self, tag: str) -> dict[str, Any]:
        """A copy of the entry (its lists too: the writer goes on appending)."""
        with self._lock:
            entry = self._entries.get(tag, {})
            return {k: list(v) if isinstance(v, list) else v for k, v in entry.items()}

    def _accept(self) -> None:
        while not self._closing.is_set():
            try:
                connection, _ = self._listener.accept()
            except OSError:
                return
            threading.Thread(target=self._serve, args=(connection,), daemon=True).start()

    def _serve(self, connection: socket.socket) -> None:
        with connection:
            connection.settimeout(10)
            try:
                request = _read_request(connection)
            except (OSError, ValueError):
                return
            if request is None:
                return
            received_at = time.time()
            http10, body = request
            name, tag = parse_prompt(str(json.loads(body or b"{}").get("prompt", "")))
            shape = SHAPES.get(name)
            if shape is None:
                connection.sendall(b"HTTP/1.1 404 Not Found\r\ncontent-length: 0\r\n\r\n")
                return
            entry: dict[str, Any] = {
                "prompt": tag, "received_at": received_at, "token_times": [], "lateness": [],
                "finished_at": None,
            }  # fmt: skip
            with self._lock:
                self._entries[tag] = entry
            _play(connection, shape, http10, entry)


def _read_request(connection: socket.socket) -> tuple[bool, bytes] | None:
    """(HTTP/1.0?, body) of one request with a Content-Length body."""
    data = b""
    while b"\r\n\r\n" not in data:
        more = connection.recv(65536)
        if not more:
            return None
        data += more
    head, _, body = data.partition(b"\r\n\r\n")
    lines = head.split(b"\r\n")
    http10 = lines[0].rstrip().endswith(b"HTTP/1.0")
    length = 0
    for line in lines[1:]:
        name, _, value = line.partition(b":")
        if name.strip().lower() == b"content-length":
            length = int(value.strip())
    while len(body) < length:
        more = connection.recv(65536)
        if not more:
            return None
        body += more
    return http10, body[:length]


def _client_left(connection: socket.socket) -> bool:
    """The proxy closed its side (EOF) or reset: readable with nothing to read."""
    readable, _, _ = select.select([connection], [], [], 0)
    if not readable:
        return False
    try:
        return connection.recv(4096, socket.MSG_PEEK) == b""
    except OSError:
        return True


def _play(connection: socket.socket, shape: Shape, http10: bool, entry: dict[str, Any]) -> None:
    """Write `shape` on its schedule. Every write's lateness (seconds after it was due, once
    the bytes left `sendall`) goes to the entry's `lateness`: how much the machine
    disturbed this take, measured where nothing a proxy holds can show (calibrate/grid.py
    `disturbance`). The schedule is absolute, so one late wake-up does not shift the rest."""
    lateness: list[float] = entry.setdefault("lateness", [])

    def send(data: bytes, due: float) -> bool:
        if _client_left(connection):
            entry["disconnected_at"] = time.time()
            return False
        try:
            connection.sendall(data)
        except OSError:
            entry["disconnected_at"] = time.time()
            return False
        lateness.append(max(time.monotonic() - due, 0.0))
        return True

    def wait(start: float, seconds: float) -> bool:
        """Until `start + seconds`, with heartbeats on their own schedule if the shape has
        them; False if the client left."""
        end = start + seconds
        beat = 1
        while shape.heartbeat and (due := start + beat * shape.heartbeat) < end - 0.001:
            time.sleep(max(due - time.monotonic(), 0.0))
            if not send(framed(HEARTBEAT, http10), due):
                return False
            beat += 1
        time.sleep(max(end - time.monotonic(), 0.0))
        return True

    next_at = time.monotonic() + shape.pause_before_head
    time.sleep(max(next_at - time.monotonic(), 0.0))
    if not send(response_head(http10), next_at):
        return
    for index in range(shape.frames):
        next_at += shape.period
        time.sleep(max(next_at - time.monotonic(), 0.0))
        if not send(framed(shape.frame(index), http10), next_at):
            return
        entry["token_times"].append(time.time())
        if shape.pause_after is not None and index + 1 == shape.pause_after:
            if not wait(next_at, shape.pause):
                return
            next_at += shape.pause
    done_at = time.monotonic()
    if send(framed(DONE, http10), done_at) and (http10 or send(b"0\r\n\r\n", done_at)):
        entry["finished_at"] = time.time()
    if http10:
        try:
            connection.shutdown(socket.SHUT_WR)
        except OSError:
            pass
