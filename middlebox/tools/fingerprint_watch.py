"""`middlebox fingerprint URL --watch INTERVAL`: a canary on a real path, for a dashboard.

Every INTERVAL seconds a round plays the canary's small grid through the front door
(`middlebox.tools.fingerprint.canary`: one ~1 s hold shape and one client that leaves
after a few frames, the same requests and measures as the whole fingerprint) and reads
three numbers from it (middlebox/scenario/canary.py): the added TTFT, the bytes held
before the first release, and how long the probe upstream took to learn that the client
left. `/metrics` serves them as Prometheus gauges labelled with the front door, with the
rounds, the failures, whether the last round succeeded and when one last did, so a path
that starts buffering after a deploy, and a path that stops answering, both show.

A round is bounded (`ROUND_BUDGET`, each request within it by the grid runner's limits);
a round that fails is counted and printed and the next one runs; Ctrl-C (KeyboardInterrupt)
ends the watch; `count` bounds the rounds. The metrics listen on loopback unless told
otherwise: they are read-only numbers about the path, but a public scrape port is the
operator's choice, not a default.
"""

from __future__ import annotations

import socket
import threading
import time
import uuid
from collections.abc import Callable
from datetime import UTC, datetime
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from middlebox.observe.metrics import CONTENT_TYPE, label_text, number_text
from middlebox.scenario import canary as canary_reading
from middlebox.scenario.canary import Watch
from middlebox.shell.server import Address
from middlebox.tools.fingerprint import FingerprintError, Target, canary

# The round's budget: the hold shape (~1 s) and its record first; the leave only when 6 s
# are left (up to 1 s of reading, then the record watched for LEAVE_WAIT, 5 s). Each
# request and record read has the grid runner's own limits, so a path that stalls every
# one ends the round in under half a minute.
ROUND_BUDGET = 12.0
# OpenTelemetry's Prometheus exporter port: free on most hosts, and a scrape config that
# already names it needs no new firewall rule.
DEFAULT_METRICS = "127.0.0.1:9464"

FAMILIES = (
    ("middlebox_canary_up", "gauge", "1 when the last round measured the path, 0 when it failed."),
    ("middlebox_canary_added_ttft_seconds", "gauge",
     "The first frame's wait beyond the stream's transit: what the path adds to TTFT."),
    ("middlebox_canary_held_bytes", "gauge",
     "Bytes of the upstream's response held before the path's first release (0: none)."),
    ("middlebox_canary_cancel_propagation_seconds", "gauge",
     "Seconds until the upstream learned the client left (the wait, when it never did)."),
    ("middlebox_canary_cancel_learned", "gauge",
     "1 when the upstream learned the client left within the wait, 0 when it never did."),
    ("middlebox_canary_last_success_timestamp_seconds", "gauge",
     "Unix time of the last round that measured the path (0: none yet)."),
    ("middlebox_canary_round_duration_seconds", "gauge", "Seconds the last round took."),
    ("middlebox_canary_rounds_total", "counter", "Rounds run."),
    ("middlebox_canary_failures_total", "counter", "Rounds that failed (counted, not fatal)."),
)  # fmt: skip


def exposition(door: str, watch: Watch) -> str:
    """The watch as Prometheus text (0.0.4), each series labelled `front_door`; a number
    the rounds have not measured is left out, never written as 0."""
    found = watch.last
    values: dict[str, float | None] = {
        "middlebox_canary_up": float(watch.up),
        "middlebox_canary_added_ttft_seconds": None if found is None else found.added_ttft,
        "middlebox_canary_held_bytes": None if found is None else found.bytes_held,
        "middlebox_canary_cancel_propagation_seconds": None
        if found is None
        else found.cancel_seconds,
        "middlebox_canary_cancel_learned": None
        if found is None or found.cancel_learned is None
        else float(found.cancel_learned),
        "middlebox_canary_last_success_timestamp_seconds": watch.last_success or 0.0,
        "middlebox_canary_round_duration_seconds": watch.last_round_seconds,
        "middlebox_canary_rounds_total": watch.rounds,
        "middlebox_canary_failures_total": watch.failures,
    }
    labels = label_text(front_door=door)
    out: list[str] = []
    for name, kind, help_text in FAMILIES:
        value = values[name]
        if value is None:
            continue
        out += [f"# HELP {name} {help_text}", f"# TYPE {name} {kind}",
                f"{name}{labels} {number_text(value)}"]  # fmt: skip
    return "\n".join(out) + "\n"


class MetricsServer:
    """`GET /metrics` on its own thread: `render()` at each scrape; anything else 404."""

    def __init__(self, address: Address, render: Callable[[], str]) -> None:
        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:  # http.server's name for a GET
                found = self.path.split("?", 1)[0] == "/metrics"
                body = render().encode() if found else b"only GET /metrics here\n"
                self.send_response(200 if found else 404)
                self.send_header("Content-Type", CONTENT_TYPE if found else "text/plain")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *_: object) -> None:
                pass  # a scrape every few seconds is not news

        host = address.host.strip("[]")
        family = socket.AF_INET6 if ":" in host else socket.AF_INET
        server_class = type("Server", (ThreadingHTTPServer,), {"address_family": family})
        self.server: ThreadingHTTPServer = server_class((host, address.port), Handler)
        self.server.daemon_threads = True
        self.port = int(self.server.server_address[1])
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()
        self.thread.join(timeout=5)


def _stamp(at: float) -> str:
    return datetime.fromtimestamp(at, UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def watch(
    url: str,
    interval: float,
    *,
    metrics: str = DEFAULT_METRICS,
    count: int | None = None,
    say: Callable[[str], None] = lambda line: None,
) -> Watch:
    """Run rounds every `interval` seconds (at most `count`, forever without), one line
    each to `say`, serving `/metrics` at `metrics` (HOST:PORT; port 0 picks a free one)
    meanwhile. Returns the watch after the last round; Ctrl-C (KeyboardInterrupt) passes
    through after the metrics server stopped."""
    target = Target.parse(url)  # a bad URL is the caller's error, before any round
    try:
        address = Address.parse(metrics)
    except ValueError as error:
        raise FingerprintError(f"--metrics-listen {metrics}: {error}") from None
    state = Watch()
    lock = threading.Lock()

    def render() -> str:
        with lock:
            return exposition(url, state)

    try:
        server = MetricsServer(address, render)
    except OSError as error:
        raise FingerprintError(
            f"--metrics-listen {metrics}: cannot listen ({error.strerror or error})"
        ) from None
    bare = address.host.strip("[]")
    host = f"[{bare}]" if ":" in bare else bare
    say(f"watching {url} every {interval:g} s; metrics on http://{host}:{server.port}/metrics")
    run = f"canary{uuid.uuid4().hex[:8]}"
    try:
        number = 0
        while count is None or number < count:
            number += 1
            start = time.monotonic()
            try:
                found = canary(target, ROUND_BUDGET, lambda line: None, f"{run}-{number}")
                reading = canary_reading.reading(found["hold"], found["leave"])
            except Exception as error:  # a canary outlives any one round's failure
                took = time.monotonic() - start
                said = str(error) if isinstance(error, FingerprintError) else repr(error)
                with lock:
                    state.failed(said, took)
                say(f"{_stamp(time.time())} round {number} failed ({state.failures} "
                    f"failure{'' if state.failures == 1 else 's'}): {said}")  # fmt: skip
            else:
                took = time.monotonic() - start
                with lock:
                    state.succeeded(reading, time.time(), took)
                say(f"{_stamp(time.time())} round {number}: {reading.line()} ({took:.1f} s)")
            if count is not None and number >= count:
                break
            time.sleep(max(start + interval - time.monotonic(), 0.0))  # the next round's time
    finally:
        server.close()
    return state
