"""The LLM-server fingerprint's requests against a small OpenAI-compatible server on loopback
that is not vLLM: it lists its own model, refuses vLLM's `ignore_eos` with a 400 (the
fingerprint asks again without it), streams 20 token events 5 ms apart and has no /metrics
(cancellation is then named as not measured, with the status it got). Bounded: the
server's streams are 0.1 s, the budget 12 s, every socket has a timeout."""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from middlebox.tools import fingerprint_llm

EVENTS = 20


class Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    bodies: list[dict[str, object]] = []

    def log_message(self, *args: object) -> None:
        pass  # quiet: pytest shows what fails

    def _json(self, status: int, value: object) -> None:
        data = json.dumps(value).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def do_GET(self) -> None:
        if self.path == "/v1/models":
            self._json(200, {"object": "list", "data": [{"id": "tiny", "object": "model"}]})
        else:
            self._json(404, {"error": "not found"})

    def do_POST(self) -> None:
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        Handler.bodies.append(body)
        if "ignore_eos" in body:
            self._json(400, {"error": {"message": "unknown field ignore_eos"}})
            return
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream")
        self.send_header("Transfer-Encoding", "chunked")
        self.end_headers()
        events = [{"choices": [{"index": 0, "delta": {"content": f" {i}"}}]} for i in range(EVENTS)]
        for event in events:
            data = b"data: " + json.dumps(event).encode() + b"\n\n"
            self.wfile.write(f"{len(data):x}\r\n".encode() + data + b"\r\n")
            self.wfile.flush()
            time.sleep(0.005)  # a token server's pace
        done = b"data: [DONE]\n\n"
        self.wfile.write(f"{len(done):x}\r\n".encode() + done + b"\r\n0\r\n\r\n")


@pytest.fixture
def server() -> Iterator[str]:
    Handler.bodies = []
    httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{httpd.server_address[1]}/v1"
    finally:
        httpd.shutdown()
        httpd.server_close()
        thread.join(5)


def test_a_server_without_ignore_eos_or_metrics_is_measured_and_says_what_it_missed(
    server: str,
) -> None:
    model = fingerprint_llm.served_model(server, None)
    assert model == "tiny"
    found = fingerprint_llm.fingerprint(server, model=model, budget=12)
    stream = found["measures"]["stream"]
    assert [run["events"] for run in stream["runs"]] == [EVENTS] * 3
    assert stream["burst_events"]["value"] == 1
    # asked once with ignore_eos, refused, and never again
    assert [("ignore_eos" in body) for body in Handler.bodies[:2]] == [True, False]
    assert not any("ignore_eos" in body for body in Handler.bodies[1:])
    assert "cancel" not in found["measures"]
    said = "\n".join(found["summary"])
    metrics = server.removesuffix("/v1") + "/metrics"
    assert (
        f"Not measured: cancellation (no vllm:num_requests_running at {metrics}, got 404: give "
        f"the server's /metrics with --metrics-url URL)." in said
    ), said
    assert "noticed by the server" not in said and "generates for nobody" not in said


def test_metrics_default_to_the_direct_origin_then_the_front_door() -> None:
    given = fingerprint_llm.metrics_url("https://a/v1", "http://b:8000/v1", "http://c/m")
    assert given == "http://c/m"
    assert fingerprint_llm.metrics_url("https://a/v1", "http://b:8000/v1", None) == (
        "http://b:8000/metrics"
    )
    assert fingerprint_llm.metrics_url("https://a:8443/x/v1", None, None) == (
        "https://a:8443/metrics"
    )
