"""A real emulator on 127.0.0.1 (port 0) in a thread, and a raw HTTP/1.1 client.

The server runs its own asyncio loop in a daemon thread, so sync tests (pytest's
trio mode only touches async tests) can talk to it with sockets, http.client or
the openai client. Every wait is bounded.
"""

from __future__ import annotations

import asyncio
import http.client
import json
import re
import socket
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

import pytest

from vllm_emulator.config import EmulatorConfig, config_from_mapping
from vllm_emulator.serve import serve

FAST = {
    "prefill_overhead": 0.01,
    "prefill_per_token": 0.0,
    "itl": 0.004,
    "itl_jitter": 0.0,
    "model": "middlebox/emulated-7b",
}


@dataclass
class RawResult:
    """What a raw client saw: head, the body's HTTP chunks and when each arrived."""

    head: bytes = b""
    chunks: list[bytes] = field(default_factory=list)
    times: list[float] = field(default_factory=list)
    complete: bool = False  # the 0-size terminating chunk arrived
    closed_at: float = 0.0  # when this client closed its socket

    @property
    def body(self) -> bytes:
        return b"".join(self.chunks)

    @property
    def status(self) -> int:
        return int(self.head.split(b" ", 2)[1]) if self.head else 0

    def data_frames(self) -> list[str]:
        return [
            line[6:] for line in self.body.decode("utf-8").split("\n") if line.startswith("data: ")
        ]


class Emulator:
    def __init__(self, config: EmulatorConfig) -> None:
        self.config = config
        self.port = 0
        self._ready = threading.Event()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._stop: asyncio.Event | None = None
        self._thread = threading.Thread(target=lambda: asyncio.run(self._main()), daemon=True)
        self._thread.start()
        assert self._ready.wait(10), "emulator did not start"

    async def _main(self) -> None:
        self._loop = asyncio.get_running_loop()
        self._stop = asyncio.Event()

        def ready(port: int) -> None:
            self.port = port
            self._ready.set()

        await serve(self.config, "127.0.0.1", 0, ready, self._stop)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def close(self) -> None:
        if self._loop is not None and self._stop is not None:
            self._loop.call_soon_threadsafe(self._stop.set)
        self._thread.join(10)

    def request(
        self, method: str, path: str, body: Any = None, headers: dict[str, str] | None = None
    ) -> tuple[int, dict[str, str], bytes]:
        conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=20)
        data = body if isinstance(body, bytes) or body is None else json.dumps(body).encode()
        all_headers = {"Content-Type": "application/json", **(headers or {})}
        conn.request(method, path, body=data, headers=all_headers)
        response = conn.getresponse()
        payload = response.read()
        conn.close()
        return response.status, {k.lower(): v for k, v in response.getheaders()}, payload

    @staticmethod
    def wait_until(predicate: Callable[[], bool], timeout: float = 10.0) -> None:
        deadline = time.monotonic() + timeout
        while not predicate():
            assert time.monotonic() < deadline, "condition not reached in time"
            time.sleep(0.01)

    def ledger(self) -> list[dict[str, Any]]:
        requests: list[dict[str, Any]] = json.loads(self.request("GET", "/emulator/requests")[2])[
            "requests"
        ]
        return requests

    def metric(self, name: str, **labels: str) -> float:
        """A sample's value from /metrics (labels must match those given)."""
        text = self.request("GET", "/metrics")[2].decode()
        for line in text.splitlines():
            match = re.match(r"^([^{ ]+)(?:\{(.*)\})? (\S+)$", line)
            if not match or match.group(1) != name:
                continue
            found = dict(re.findall(r'(\w+)="([^"]*)"', match.group(2) or ""))
            if all(found.get(k) == v for k, v in labels.items()):
                return float(match.group(3))
        raise AssertionError(f"{name} {labels} not in /metrics")

    def raw(
        self,
        path: str,
        body: Any,
        headers: dict[str, str] | None = None,
        method: str = "POST",
        stop_after_frames: int | None = None,
        half_close: bool = False,
        timeout: float = 20.0,
    ) -> RawResult:
        """Send one request on a raw socket and parse the chunked response by hand.

        `stop_after_frames` closes the socket once that many `data:` frames came;
        `half_close` sends FIN right after the request (shutdown(SHUT_WR)).
        """
        data = json.dumps(body).encode() if body is not None else b""
        lines = [f"{method} {path} HTTP/1.1", "Host: 127.0.0.1", f"Content-Length: {len(data)}"]
        if body is not None:
            lines.append("Content-Type: application/json")
        lines += [f"{k}: {v}" for k, v in (headers or {}).items()]
        sock = socket.create_connection(("127.0.0.1", self.port), timeout=timeout)
        result = RawResult()
        try:
            sock.sendall(("\r\n".join(lines) + "\r\n\r\n").encode() + data)
            if half_close:
                sock.shutdown(socket.SHUT_WR)
            buffer = b""
            deadline = time.monotonic() + timeout
            while time.monotonic() < deadline:
                try:
                    got = sock.recv(65536)
                except OSError:
                    break
                if not got:
                    break
                buffer += got
                if not result.head:
                    if b"\r\n\r\n" not in buffer:
                        continue
                    result.head, buffer = buffer.split(b"\r\n\r\n", 1)
                while b"\r\n" in buffer:
                    size_line, rest = buffer.split(b"\r\n", 1)
                    size = int(size_line, 16)
                    if len(rest) < size + 2:
                        break
                    buffer = rest[size + 2 :]
                    if size == 0:
                        result.complete = True
                        return result
                    result.chunks.append(rest[:size])
                    result.times.append(time.time())
                if b"content-length" in result.head.lower() and not result.chunks:
                    length = int(re.search(rb"(?i)content-length: (\d+)", result.head).group(1))  # type: ignore[union-attr]
                    if len(buffer) >= length:
                        result.chunks.append(buffer[:length])
                        result.complete = True
                        return result
                frames = result.body.count(b"data: ")
                if stop_after_frames is not None and frames >= stop_after_frames:
                    return result
            return result
        finally:
            result.closed_at = time.time()
            sock.close()


@pytest.fixture
def emulator() -> Iterator[Callable[..., Emulator]]:
    """Start emulators with FAST timing plus overrides; all stopped at the end."""
    started: list[Emulator] = []

    def start(**overrides: Any) -> Emulator:
        server = Emulator(config_from_mapping({**FAST, **overrides}))
        started.append(server)
        return server

    yield start
    for server in started:
        server.close()
