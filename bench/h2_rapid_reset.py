"""`python -m bench.h2_rapid_reset`: HTTP/2 rapid reset (CVE-2023-44487) against a real
`middlebox proxy --tls` process, on 127.0.0.1 only; part of `make bench`.

An attacker (python-hyper's h2 as the encoder) opens 10,000 streams on one TLS connection
and resets each at once (HEADERS then RST_STREAM CANCEL, all in one write); meanwhile a
normal stream on a connection of its own asks for an answer of ten chunks 20 ms apart.
Measured per round: the upstream connections the proxy dialled (accepts counted at a
loopback upstream run here), the proxy's GOAWAY (its code, and how many streams it took
before it: its last stream id), the proxy's CPU for the round (schedstat over its process
tree), and the normal stream's time against the same run's baseline (median of the rounds).
It exits 1 unless every attack ends in GOAWAY ENHANCE_YOUR_CALM, the dials stay within
the session's upstream slots, and the normal stream keeps its time within 2x.

The attacker's pieces (`rapid_reset`, `attack`, ...) are also what
tests/shell/test_h2_hostile.py sends at an in-process proxy.
"""

from __future__ import annotations

import argparse
import json
import ssl
import statistics
import sys
import tempfile
import time
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path

import h2.config
import h2.connection
import h2.errors
import h2.events
import trio

from bench.procs import Proc, cpu_ns

ENHANCE_YOUR_CALM = 0xB
GOAWAY = 0x7
NORMAL_PIECES = 10  # the normal stream's answer: ten chunks 20 ms apart
NORMAL_BODY = b"data: x\n\n" * NORMAL_PIECES
MAX_RATIO = 2.0
# How long an attack waits for the GOAWAY (a proxy without the protection sends none).
ATTACK_WAIT_S = 15.0


def client_connection() -> h2.connection.H2Connection:
    conn = h2.connection.H2Connection(
        h2.config.H2Configuration(client_side=True, header_encoding=None)
    )
    conn.initiate_connection()
    return conn


def h2_preface() -> bytes:
    """A client's first bytes: the connection preface and its SETTINGS."""
    return client_connection().data_to_send()


def rapid_reset(streams: int) -> bytes:
    """The attack after the preface, encoded by h2 as a client would: `streams` times
    HEADERS for a POST and at once RST_STREAM CANCEL on it."""
    conn = client_connection()
    conn.data_to_send()
    out = bytearray()
    headers = [(":method", "POST"), (":path", "/attack"), (":scheme", "https"), (":authority", "t")]
    for _ in range(streams):
        stream_id = conn.get_next_available_stream_id()
        conn.send_headers(stream_id, headers)
        conn.reset_stream(stream_id, h2.errors.ErrorCodes.CANCEL)
        out += conn.data_to_send()
    return bytes(out)


@dataclass
class Goaway:
    last_stream_id: int
    error_code: int
    seconds: float  # from the attack's first byte to the GOAWAY

    @property
    def streams(self) -> int:
        """Client streams (odd ids) up to the last one the proxy took."""
        return (self.last_stream_id + 1) // 2


def goaway_in(received: bytes) -> tuple[int, int] | None:
    """The first GOAWAY among the server's frames: (last stream id, error code)."""
    at = 0
    while at + 9 <= len(received):
        length = int.from_bytes(received[at : at + 3], "big")
        payload = received[at + 9 : at + 9 + length]
        if len(payload) < length:
            return None
        if received[at + 3] == GOAWAY:
            return int.from_bytes(payload[:4], "big") & 0x7FFFFFFF, int.from_bytes(
                payload[4:8], "big"
            )
        at += 9 + length
    return None


def tls_context(cafile: Path) -> ssl.SSLContext:
    context = ssl.create_default_context(cafile=str(cafile))
    context.set_alpn_protocols(["h2"])
    return context


async def open_h2(port: int, cafile: Path) -> trio.SSLStream[trio.SocketStream]:
    stream = await trio.open_ssl_over_tcp_stream(
        "127.0.0.1", port, ssl_context=tls_context(cafile), https_compatible=True
    )
    await stream.do_handshake()
    if stream.selected_alpn_protocol() != "h2":
        raise RuntimeError("the proxy did not pick h2")
    return stream


async def attack(port: int, cafile: Path, payload: bytes) -> Goaway | None:
    """The preface and `payload` over a fresh h2 connection, reading meanwhile, until the
    proxy's GOAWAY (None: the connection ended, or ATTACK_WAIT_S passed, without one)."""
    stream = await open_h2(port, cafile)
    received = bytearray()
    found: list[Goaway] = []
    started = time.perf_counter()

    async def blast() -> None:
        try:
            await stream.send_all(h2_preface() + payload)
        except (trio.BrokenResourceError, trio.ClosedResourceError):
            pass

    async with trio.open_nursery() as nursery:
        nursery.start_soon(blast)
        nursery.cancel_scope.deadline = trio.current_time() + ATTACK_WAIT_S
        while not found:
            try:
                data = await stream.receive_some(65536)
            except (trio.BrokenResourceError, trio.ClosedResourceError):
                break
            if not data:
                break
            received += data
            seen = goaway_in(bytes(received))
            if seen is not None:
                found.append(Goaway(*seen, time.perf_counter() - started))
        nursery.cancel_scope.cancel()
    await trio.aclose_forcefully(stream)
    return found[0] if found else None


async def normal_stream(port: int, cafile: Path) -> float:
    """One POST /normal on a connection of its own: its whole time (connect to the last
    byte); raises unless the whole answer arrived."""
    started = time.perf_counter()
    stream = await open_h2(port, cafile)
    conn = client_connection()
    conn.send_headers(
        1, [(":method", "POST"), (":path", "/normal"), (":scheme", "https"), (":authority", "t")]
    )
    conn.send_data(1, b"{}", end_stream=True)
    body = b""
    ended = False
    while not ended:
        await stream.send_all(conn.data_to_send())
        data = await stream.receive_some(65536)
        if not data:
            break
        for event in conn.receive_data(data):
            if isinstance(event, h2.events.DataReceived) and event.stream_id == 1:
                body += event.data
                conn.acknowledge_received_data(event.flow_controlled_length, 1)
            elif isinstance(event, h2.events.StreamEnded | h2.events.StreamReset):
                ended = True
    await trio.aclose_forcefully(stream)
    if body != NORMAL_BODY:
        raise RuntimeError(f"the normal stream got {body[:80]!r}")
    return time.perf_counter() - started


def chunked_response(body: bytes, pieces: int = 4) -> list[bytes]:
    """An SSE response head and `body` in `pieces` chunks, then the last chunk."""
    head = (
        b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nTransfer-Encoding: chunked\r\n"
        b"Connection: close\r\n\r\n"
    )
    size = max(1, len(body) // pieces)
    parts = [body[i : i + size] for i in range(0, len(body), size)]
    return [head, *(b"%x\r\n%s\r\n" % (len(p), p) for p in parts), b"0\r\n\r\n"]


@dataclass
class Upstream:
    """A loopback upstream that counts every connection the proxy dials to it; /normal
    gets NORMAL_PIECES chunks 20 ms apart, anything else is read until the proxy ends it."""

    accepts: int = 0
    normal: int = 0
    requests: list[bytes] = field(default_factory=list)

    async def handler(self, stream: trio.SocketStream) -> None:
        self.accepts += 1
        received = b""
        try:
            while b"\r\n\r\n" not in received:
                data = await stream.receive_some(65536)
                if not data:
                    return
                received += data
            if not received.startswith(b"POST /normal "):
                while await stream.receive_some(65536):
                    pass
                return
            self.normal += 1
            for piece in chunked_response(NORMAL_BODY, NORMAL_PIECES):
                await stream.send_all(piece)
                await trio.sleep(0.02)
            await stream.aclose()
        except trio.BrokenResourceError:
            pass


def wait_ready(ready: Path, deadline_s: float = 30.0) -> str:
    """The proxy's `listening on https://HOST:PORT ...` line, once it wrote it."""
    end = time.monotonic() + deadline_s
    while not (ready.exists() and ready.read_text().strip()):
        if time.monotonic() > end:
            raise RuntimeError("the proxy never said it was listening")
        time.sleep(0.05)
    return ready.read_text().strip()


async def measure(streams: int, rounds: int, slots: int) -> dict[str, object]:
    payload = rapid_reset(streams)
    upstream = Upstream()
    with tempfile.TemporaryDirectory() as tmp:
        async with trio.open_nursery() as nursery:
            listeners = await nursery.start(
                partial(trio.serve_tcp, upstream.handler, 0, host="127.0.0.1")
            )
            up_port = listeners[0].socket.getsockname()[1]
            ready = Path(tmp) / "ready"
            argv = [sys.executable, "-m", "middlebox", "proxy", "--tls", "--grace", "0"]
            argv += ["--listen", "127.0.0.1:0", "--upstream", f"http://127.0.0.1:{up_port}"]
            argv += ["--ca-dir", tmp, "--ready-file", str(ready)]
            proxy = Proc(argv)
            try:
                line = await trio.to_thread.run_sync(wait_ready, ready)
                port = int(line.split()[2].rsplit(":", 1)[1])
                cafile = Path(tmp) / "ca.pem"
                with trio.fail_after(120):
                    results = await rounds_against(port, cafile, payload, rounds, proxy, upstream)
            finally:
                proxy.stop()
                nursery.cancel_scope.cancel()
    goaways: list[Goaway | None] = results.pop("goaways")  # type: ignore[assignment]
    baseline: list[float] = results.pop("baseline")  # type: ignore[assignment]
    during: list[float] = results.pop("during")  # type: ignore[assignment]
    ratio = statistics.median(during) / statistics.median(baseline)
    dials = upstream.accepts - upstream.normal
    calm = all(g is not None and g.error_code == ENHANCE_YOUR_CALM for g in goaways)
    return {
        "streams_per_attack": streams,
        "rounds": rounds,
        "upstream_dials": dials,
        "goaway_codes": [None if g is None else g.error_code for g in goaways],
        "streams_before_goaway": [None if g is None else g.streams for g in goaways],
        "seconds_to_goaway": [None if g is None else round(g.seconds, 3) for g in goaways],
        "proxy_cpu_s_per_attack": results["cpu"],
        "normal_ms_baseline": [round(t * 1000) for t in baseline],
        "normal_ms_during": [round(t * 1000) for t in during],
        "ratio": round(ratio, 2),
        "ok": calm and dials <= slots and ratio <= MAX_RATIO,
    }


async def rounds_against(
    port: int, cafile: Path, payload: bytes, rounds: int, proxy: Proc, upstream: Upstream
) -> dict[str, object]:
    await normal_stream(port, cafile)  # the CA, the imports and the first handshake: warm
    baseline = [await normal_stream(port, cafile) for _ in range(rounds)]
    goaways: list[Goaway | None] = []
    during: list[float] = []
    cpu: list[float] = []
    for _ in range(rounds):
        before = cpu_ns(proxy.tree())

        async def one_attack() -> None:
            goaways.append(await attack(port, cafile, payload))

        async def one_normal() -> None:
            during.append(await normal_stream(port, cafile))

        async with trio.open_nursery() as nursery:
            nursery.start_soon(one_attack)
            nursery.start_soon(one_normal)
        cpu.append(round((cpu_ns(proxy.tree()) - before) / 1e9, 3))
    return {"baseline": baseline, "during": during, "goaways": goaways, "cpu": cpu}


def main() -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.h2_rapid_reset", description=__doc__)
    parser.add_argument("--streams", type=int, default=10_000, help="streams per attack")
    parser.add_argument("--rounds", type=int, default=5, help="attacks, and baseline streams")
    parser.add_argument("--json", type=Path, help="write the results here too")
    args = parser.parse_args()
    from middlebox.shell.h2_streams import UPSTREAM_SLOTS

    results = trio.run(measure, args.streams, args.rounds, UPSTREAM_SLOTS)
    print(json.dumps(results, indent=2))
    if args.json is not None:
        args.json.write_text(json.dumps(results, indent=2) + "\n")
    print(
        f"{'met ' if results['ok'] else 'MISS'} h2 rapid reset: GOAWAY ENHANCE_YOUR_CALM, "
        f"{results['upstream_dials']} dials (at most {UPSTREAM_SLOTS}), normal stream "
        f"x{results['ratio']} (at most x{MAX_RATIO})"
    )
    return 0 if results["ok"] else 1


if __name__ == "__main__":
    sys.exit(main())
