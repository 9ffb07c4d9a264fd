"""Two request-direction head rewriters in one `path`, through a real `middlebox proxy`
process: `GET /v1/models` is answered 200, and the upstream gets the request with both
rewrites applied (set_header's field added, strip_header's removed), in either order."""

from __future__ import annotations

import socket
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.proxy_process import exchange, middlebox_proxy
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
    with middlebox_proxy(tmp_path, port, path, "two-request-rewriters") as proxy_port:
        answer = exchange(proxy_port, REQUEST)
    assert answer == ANSWER
    # (the empty one is the proxy's reachability probe at start-up)
    assert [head for head in heads if head] == [
        b"GET /v1/models HTTP/1.1\r\nHost: proxy\r\nConnection: close\r\nX-A: 1\r\n\r\n"
    ]
