"""Two request-direction head rewriters in one `path`, through a real `middlebox proxy`
process: `GET /v1/models` is answered 200, and the upstream gets the request with both
rewrites applied (set_header's field added, strip_header's removed), in either order."""

from __future__ import annotations

import re
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.request_readers import recv_until, threaded_upstream

SET = '  - set_header: {direction: request, headers: {X-A: "1"}}\n'
STRIP = "  - strip_header: {direction: request, headers: [Cache-Control]}\n"
REQUEST = (
    b"GET /v1/models HTTP/1.1\r\nHost: proxy\r\nCache-Control: no-cache\r\n"
    b"Connection: close\r\n\r\n"
)
BODY = b'{"object":"list","data":[]}'
ANSWER = (
    b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: %d\r\n" % len(BODY)
    + b"Connection: close\r\n\r\n"
    + BODY
)


@pytest.fixture
def upstream() -> Iterator[tuple[int, list[bytes]]]:
    """Answers each connection's request head with a 200 and closes; keeps the heads."""
    heads: list[bytes] = []

    def answer(conn: socket.socket) -> None:
        head = recv_until(conn, b"\r\n\r\n")
        heads.append(head)
        if head:
            conn.sendall(ANSWER)

    with threaded_upstream(answer) as port:
        yield port, heads


@pytest.mark.parametrize("path", [SET + STRIP, STRIP + SET], ids=["set-strip", "strip-set"])
def test_two_request_rewriters_answer_200_with_both_rewrites(
    tmp_path: Path, upstream: tuple[int, list[bytes]], path: str
) -> None:
    port, heads = upstream
    scenario = tmp_path / "two.yaml"
    scenario.write_text("name: two-request-rewriters\npath:\n" + path)
    ready = tmp_path / "ready"
    process = subprocess.Popen(
        [sys.executable, "-m", "middlebox", "proxy", "--listen", "127.0.0.1:0",
         "--upstream", f"http://127.0.0.1:{port}", "--scenario", str(scenario),
         "--grace", "1", "--ready-file", str(ready)],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
    )  # fmt: skip
    try:
        deadline = time.monotonic() + 60  # a bound for a loaded machine, not a measurement
        while not ready.exists() and process.poll() is None and time.monotonic() < deadline:
            time.sleep(0.05)  # another process's start-up, polled
        found = re.search(r"listening on http://127\.0\.0\.1:(\d+)", ready.read_text())
        assert found is not None
        with socket.create_connection(("127.0.0.1", int(found[1])), timeout=10) as client:
            client.sendall(REQUEST)
            answer = b""
            while data := client.recv(65536):  # a hang is a socket.timeout here
                answer += data
    finally:
        process.send_signal(signal.SIGTERM)
        try:
            process.communicate(timeout=30)
        except subprocess.TimeoutExpired:
            process.kill()
            process.communicate(timeout=10)
    assert answer == ANSWER
    # (the empty one is the proxy's reachability probe at start-up)
    assert [head for head in heads if head] == [
        b"GET /v1/models HTTP/1.1\r\nHost: proxy\r\nConnection: close\r\nX-A: 1\r\n\r\n"
    ]
