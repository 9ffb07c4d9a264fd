"""A small HTTP server in a thread that stands in for vLLM where a test needs only a few
answers (its /metrics, ledger or one stream), and the `UpstreamClient` that reads it."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from middlebox.run.upstream import UpstreamClient


class QuietHandler(BaseHTTPRequestHandler):
    """A request handler that logs nothing (pytest's output stays the test's) and answers
    with one body."""

    def answer(self, body: bytes, content_type: str | None = None) -> None:
        """A 200 with a Content-Length (and a Content-Type when given), then the body."""
        self.send_response(200)
        if content_type is not None:
            self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args: object) -> None:
        pass


@contextmanager
def stub_upstream(handler: type[BaseHTTPRequestHandler]) -> Iterator[UpstreamClient]:
    """`handler` served on a loopback port until the block ends; an upstream client of it."""
    server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield UpstreamClient(f"http://127.0.0.1:{server.server_address[1]}")
    finally:
        server.shutdown()
        server.server_close()
