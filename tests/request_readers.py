"""Reading requests in the tests' own small HTTP upstreams: on a blocking socket up to a
marker, or request after request on a keep-alive trio stream; `threaded_upstream` runs such
an upstream on 127.0.0.1 in a thread, one connection at a time."""

from __future__ import annotations

import socket
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager

import trio


def recv_until(sock: socket.socket, marker: bytes) -> bytes:
    """What the peer sent up to and including `marker`, or all it sent before it closed
    (the caller tells the two apart by looking for `marker`)."""
    received = b""
    while marker not in received:
        data = sock.recv(65536)
        if not data:
            break
        received += data
    return received


@contextmanager
def threaded_upstream(answer: Callable[[socket.socket], None]) -> Iterator[int]:
    """Accept on a loopback port (yielded) and call `answer` with each connection (a 10 s
    timeout set), in a thread, until the block ends; each connection is closed after."""
    listener = socket.create_server(("127.0.0.1", 0))
    listener.settimeout(0.2)
    stop = threading.Event()

    def serve() -> None:
        while not stop.is_set():
            try:
                conn, _ = listener.accept()
            except TimeoutError:
                continue
            with conn:
                conn.settimeout(10)
                answer(conn)

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    try:
        yield int(listener.getsockname()[1])
    finally:
        stop.set()
        thread.join(5)
        listener.close()


def content_length(head: bytes) -> int:
    """A request head's Content-Length (0 without one)."""
    for line in head.split(b"\r\n"):
        if line.lower().startswith(b"content-length:"):
            return int(line.split(b":", 1)[1])
    return 0


class KeepAliveRequests:
    """The requests one keep-alive connection brings, one head at a time, each body (by its
    Content-Length) read past, so the next request starts where it should."""

    def __init__(self, stream: trio.SocketStream) -> None:
        self.stream = stream
        self.buffer = b""

    async def next_head(self) -> bytes | None:
        """The next request's head (without its blank line); None once the peer closed."""
        while b"\r\n\r\n" not in self.buffer:
            if not await self._more():
                return None
        head, _, self.buffer = self.buffer.partition(b"\r\n\r\n")
        length = content_length(head)
        while len(self.buffer) < length:
            if not await self._more():
                return None
        self.buffer = self.buffer[length:]
        return head

    async def _more(self) -> bool:
        """Read once more; False when the peer closed."""
        data = await self.stream.receive_some(65536)
        self.buffer += data
        return bool(data)
