"""The probe upstream (middlebox/tools/probe_upstream.py) on real loopback sockets: each knob
gives exactly the bytes its plan says, on a schedule no earlier than planned (times are
asserted as order and lower bounds, never as wall-clock thresholds); the record says what
arrived and when and how the client left (a FIN, an RST, during a pause, and how many
frames went out after it); HTTP/1.0 gets a close-delimited body; a bad knob is a 400 with
one line; records stay bounded. Every socket has a timeout, every wait a bound."""

from __future__ import annotations

import json
import os
import re
import signal
import socket
import struct
import subprocess
import sys
import time
from collections.abc import Iterator
from typing import Any

import pytest

from middlebox.scenario.probe_shape import PROMPT_MARK, ProbeShape, parse_knobs, plan
from middlebox.tools.probe_upstream import ProbeUpstream
from tests.proxy_process import exchange, stop

WAIT = 10.0  # seconds: the bound on any one wait in these tests (a loaded machine's margin)


@pytest.fixture
def probe() -> Iterator[ProbeUpstream]:
    with ProbeUpstream("127.0.0.1", 0, keep=8) as server:
        yield server


def request(
    knobs: str | None = None,
    *,
    version: str = "1.1",
    path: str = "/v1/chat/completions",
    body: dict[str, Any] | list[int] | None = None,
    close: bool = True,
    extra: str = "",
) -> bytes:
    payload = json.dumps(body if body is not None else {"model": "m", "stream": True}).encode()
    head = f"POST {path} HTTP/{version}\r\nHost: probe\r\n"
    if knobs is not None:
        head += f"X-Middlebox-Probe: {knobs}\r\n"
    if close and version == "1.1":
        head += "Connection: close\r\n"
    head += f"{extra}Content-Type: application/json\r\nContent-Length: {len(payload)}\r\n\r\n"
    return head.encode() + payload


def expected(knobs: str, *, http10: bool = False, keep_alive: bool = False) -> bytes:
    shape = parse_knobs(knobs)
    played = plan(shape, http10=http10, ident=shape.id or "", model="m", keep_alive=keep_alive)
    return b"".join(write.data for write in played.writes)


def settled(server: ProbeUpstream, ident: str) -> dict[str, Any]:
    """The record once the response ended (bounded by WAIT)."""
    deadline = time.monotonic() + WAIT
    while time.monotonic() < deadline:
        record = server.record(ident)
        if record is not None and record["ended"] != "in-progress":
            return record
        time.sleep(0.01)  # another thread's progress, polled
    raise AssertionError(f"record {ident} did not settle: {server.record(ident)}")


def test_a_chunked_stream_is_exactly_its_plans_bytes_and_no_write_comes_early(
    probe: ProbeUpstream,
) -> None:
    knobs = "frames=6;size=200;period=20ms;head_delay=100ms;id=c1"
    received = exchange(probe.port, request(knobs))
    assert received == expected(knobs)
    record = settled(probe, "c1")
    assert (record["ended"], record["framing"], record["frames_written"]) == ("done", "chunked", 6)
    due = [0.1 + 0.02 * k for k in range(1, 7)]
    frames = record["writes"]["frames"]
    assert record["writes"]["head"] >= 0.1
    assert frames == sorted(frames) and all(t >= d - 1e-6 for t, d in zip(frames, due, strict=True))
    assert len(record["lateness"]) == 1 + 6 + 2 and min(record["lateness"]) >= 0.0
    assert record["spec_source"] == "header" and parse_knobs(record["spec"]).frames == 6


def test_an_http10_request_gets_a_close_delimited_body_ended_by_the_servers_fin(
    probe: ProbeUpstream,
) -> None:
    knobs = "frames=3;size=64;period=5ms;format=text;id=old"
    received = exchange(probe.port, request(knobs, version="1.0"))
    assert received == expected(knobs, http10=True)
    head, _, body = received.partition(b"\r\n\r\n")
    assert b"connection: close" in head and b"transfer-encoding" not in head
    assert body.endswith(b"data: [DONE]\n\n")
    record = settled(probe, "old")
    assert (record["request"]["version"], record["framing"], record["ended"]) == (
        "HTTP/1.0", "close", "done")  # fmt: skip


def test_a_pause_is_filled_with_exactly_the_planned_comments(probe: ProbeUpstream) -> None:
    knobs = "frames=4;size=60;period=5ms;pause_after=2;pause=300ms;heartbeat=50ms;format=text;id=hb"
    received = exchange(probe.port, request(knobs))
    assert received == expected(knobs)
    assert received.count(b": keep-alive\n\n") == 5
    record = settled(probe, "hb")
    assert record["heartbeats_written"] == 5
    # the comments come after the 2nd frame and before the 3rd
    frames, beats = record["writes"]["frames"], record["writes"]["heartbeats"]
    assert frames[1] <= beats[0] and beats[-1] <= frames[2]
    assert frames[2] - frames[1] >= 0.3 - 0.001


@pytest.mark.parametrize("end", ["fin", "rst"])
def test_a_cut_end_closes_without_the_last_chunk(probe: ProbeUpstream, end: str) -> None:
    knobs = f"frames=3;size=60;period=5ms;format=text;end={end};id=cut-{end}"
    with socket.create_connection(("127.0.0.1", probe.port), timeout=WAIT) as sock:
        sock.sendall(request(knobs))
        received, how = b"", "eof"
        try:
            while chunk := sock.recv(65536):
                received += chunk
        except ConnectionResetError:
            how = "rst"
    assert how == ("rst" if end == "rst" else "eof")
    if end == "fin":
        assert received == expected(knobs)
        assert not received.endswith(b"0\r\n\r\n") and b"[DONE]" not in received
    assert settled(probe, f"cut-{end}")["ended"] == end


def test_length_framing_declares_the_body_and_keeps_the_connection_for_the_next_request(
    probe: ProbeUpstream,
) -> None:
    first = "frames=2;size=50;period=5ms;format=text;framing=length;id=k1"
    second = "frames=1;size=40;period=5ms;format=text;id=k2"
    with socket.create_connection(("127.0.0.1", probe.port), timeout=WAIT) as sock:
        sock.sendall(request(first, close=False))
        want = expected(first, keep_alive=True)
        received = b""
        while len(received) < len(want):
            received += sock.recv(65536)
        assert received == want and b"content-length: 114\r\n" in received
        sock.sendall(request(second, close=False))
        want = expected(second, keep_alive=True)
        received = b""
        while not received.endswith(b"0\r\n\r\n"):
            received += sock.recv(65536)
        assert received == want
    first_peer, second_peer = settled(probe, "k1")["peer"], settled(probe, "k2")["peer"]
    assert first_peer == second_peer  # one connection for both


def read_frames(sock: socket.socket, count: int) -> bytes:
    """Read until `count` frames arrived (at least)."""
    received = b""
    while received.count(b"data: {") < count:
        chunk = sock.recv(65536)
        assert chunk, "the stream ended early"
        received += chunk
    return received


LINGER_RESET = struct.pack("ii", 1, 0)


@pytest.mark.parametrize("how", ["fin", "rst"])
def test_the_record_says_when_and_how_the_client_left_and_the_stream_stops(
    probe: ProbeUpstream, how: str
) -> None:
    knobs = f"frames=2000;size=100;period=5ms;format=text;id=leave-{how}"
    with socket.create_connection(("127.0.0.1", probe.port), timeout=WAIT) as sock:
        sock.sendall(request(knobs))
        read_frames(sock, 5)
        if how == "rst":
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, LINGER_RESET)
        else:
            sock.shutdown(socket.SHUT_WR)  # a FIN; the frames already here stay unread
    record = settled(probe, f"leave-{how}")
    left = record["client_left"]
    assert left["how"] == how and record["ended"] == "client-left"
    assert 5 <= left["frames_written"] == record["frames_written"] < 2000
    assert record["frames_after_leave"] == 0  # on_leave=stop: vLLM aborts
    assert left["at"] >= record["writes"]["frames"][4]


def test_a_leave_during_a_pause_is_learned_in_the_pause_not_at_the_next_write(
    probe: ProbeUpstream,
) -> None:
    knobs = "frames=4;size=60;period=5ms;pause_after=2;pause=60s;format=text;id=paused"
    with socket.create_connection(("127.0.0.1", probe.port), timeout=WAIT) as sock:
        sock.sendall(request(knobs))
        read_frames(sock, 2)
        closed_at = time.monotonic()
    record = settled(probe, "paused")  # bounded by WAIT, far inside the 60 s pause
    assert time.monotonic() - closed_at < 60
    assert record["client_left"]["how"] == "fin"
    assert record["client_left"]["frames_written"] == 2 and record["frames_written"] == 2


def test_an_upstream_that_ignores_the_leave_counts_the_frames_it_wrote_after_it(
    probe: ProbeUpstream,
) -> None:
    knobs = "frames=40;size=60;period=5ms;format=text;on_leave=ignore;id=ignore"
    with socket.create_connection(("127.0.0.1", probe.port), timeout=WAIT) as sock:
        sock.sendall(request(knobs))
        read_frames(sock, 3)
        sock.shutdown(socket.SHUT_WR)  # a half-close: this client still reads
        received = b""
        while chunk := sock.recv(65536):
            received += chunk
    record = settled(probe, "ignore")
    left = record["client_left"]
    assert left["how"] == "fin" and record["ended"] == "done"
    assert record["frames_written"] == 40
    assert record["frames_after_leave"] == 40 - left["frames_written"] > 0


BAD_JSON = (
    b"POST /v1/chat/completions HTTP/1.1\r\nContent-Length: 3\r\nConnection: close\r\n\r\n{x}"
)


@pytest.mark.parametrize(
    ("data", "message"),
    [
        (request("frames=x"), "probe knob frames=x: expected a whole number"),
        (
            request(body={"stream": True, "middlebox_probe": "period=20"}),
            "probe knob period=20: a duration needs a unit",
        ),
        (
            request(
                body={"stream": True, "prompt": f"{PROMPT_MARK} end=later"}, path="/v1/completions"
            ),
            "probe knob end=later: expected one of done, clean, fin, rst",
        ),
        (request(body={"stream": False}), 'the probe upstream only streams: send "stream": true'),
        (request("framing=chunked", version="1.0"), "framing=chunked: this request is HTTP/1.0"),
        (BAD_JSON, "Expecting property name"),
        (request(body=[1]), "the request body is not a JSON object"),
    ],
)
def test_a_bad_knob_is_a_400_with_one_line(probe: ProbeUpstream, data: bytes, message: str) -> None:
    received = exchange(probe.port, data)
    head, _, body = received.partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 400 Bad Request")
    said = json.loads(body)["error"]["message"]
    assert message in said and "\n" not in said
    assert probe.records() == []


def get(port: int, path: str) -> tuple[int, Any]:
    answer = exchange(port, f"GET {path} HTTP/1.1\r\nHost: p\r\nConnection: close\r\n\r\n".encode())
    head, _, body = answer.partition(b"\r\n\r\n")
    return int(head.split()[1]), json.loads(body) if body else None


def test_models_health_and_records_answer_under_any_route_prefix(probe: ProbeUpstream) -> None:
    knobs = "frames=1;size=40;format=text;id=routed"
    exchange(probe.port, request(knobs, path="/team-a/llm/v1/chat/completions"))
    settled(probe, "routed")
    assert get(probe.port, "/health") == (200, None)
    status, models = get(probe.port, "/team-a/llm/v1/models")
    assert status == 200 and models["data"][0]["id"] == "middlebox-probe"
    status, record = get(probe.port, "/team-a/llm/probe/requests/routed")
    assert status == 200 and record["request"]["target"] == "/team-a/llm/v1/chat/completions"
    assert get(probe.port, "/probe/requests") == (200, {"ids": ["routed"]})
    status, missing = get(probe.port, "/probe/requests/nope")
    assert status == 404 and missing["error"]["message"] == "no record of request 'nope'"
    assert get(probe.port, "/v2/other")[0] == 404


def test_records_tell_a_caching_hop_not_to_keep_them_and_the_rest_does_not(
    probe: ProbeUpstream,
) -> None:
    exchange(probe.port, request("frames=1;size=40;format=text;id=cached"))
    settled(probe, "cached")

    def head_of(path: str) -> bytes:
        answer = exchange(
            probe.port, f"GET {path} HTTP/1.1\r\nHost: p\r\nConnection: close\r\n\r\n".encode()
        )
        return answer.partition(b"\r\n\r\n")[0].lower()

    for path in ("/probe/requests/cached", "/probe/requests", "/probe/requests/nope"):
        assert b"\r\ncache-control: no-store" in head_of(path), path
    for path in ("/v1/models", "/health"):
        assert b"cache-control" not in head_of(path), path


def test_a_request_without_knobs_gets_the_default_stream_and_an_id(probe: ProbeUpstream) -> None:
    received = exchange(probe.port, request())
    body = received.partition(b"\r\n\r\n")[2]
    assert body.count(b'"object":"chat.completion.chunk"') == ProbeShape().frames
    (ident,) = probe.records()
    record = settled(probe, ident)
    assert record["spec_source"] == "default" and record["frames_written"] == 20
    assert b'"id":"chatcmpl-%s"' % ident.encode() in body


def test_only_the_newest_records_are_kept() -> None:
    with ProbeUpstream("127.0.0.1", 0, keep=3) as server:
        for n in range(5):
            exchange(server.port, request(f"frames=1;size=40;format=text;id=n{n}"))
        assert server.records() == ["n2", "n3", "n4"]
        assert server.record("n0") is None


def test_the_record_keeps_the_request_as_it_arrived(probe: ProbeUpstream) -> None:
    asking = f"hi\n{PROMPT_MARK} frames=1;id=asked"
    body = {"model": "m", "stream": True, "messages": [{"role": "user", "content": asking}]}
    exchange(probe.port, request(body=body, extra="X-Forwarded-For: 10.1.2.3\r\n"))
    record = settled(probe, "asked")
    seen = record["request"]
    assert (seen["method"], seen["target"], seen["version"]) == (
        "POST", "/v1/chat/completions", "HTTP/1.1")  # fmt: skip
    assert ["X-Forwarded-For", "10.1.2.3"] in seen["headers"]
    assert json.loads(seen["body"]) == body and seen["body_bytes"] == len(json.dumps(body))
    assert record["spec_source"] == "prompt" and record["peer"].startswith("127.0.0.1:")


def test_a_record_blanks_credentials_and_keeps_their_names(probe: ProbeUpstream) -> None:
    body = {"model": "m", "stream": True, "api_key": "sk-body", "messages": []}
    secret = "Authorization: Bearer sk-head\r\nX-Api-Key: sk-x\r\n"
    exchange(probe.port, request("frames=1;id=creds", body=body, path="/v1/chat/completions?key=k",
                                 extra=secret))  # fmt: skip
    record = settled(probe, "creds")
    seen = record["request"]
    assert ["Authorization", "[redacted]"] in seen["headers"]
    assert ["X-Api-Key", "[redacted]"] in seen["headers"]
    assert json.loads(seen["body"])["api_key"] == "[redacted]"
    assert seen["target"] == "/v1/chat/completions?key=[redacted]"
    assert "sk-" not in json.dumps(record)


def test_the_command_prints_its_port_first_serves_and_says_a_busy_port_in_one_line() -> None:
    # and a SIGTERM (a container's stop) ends it with status 0
    process = subprocess.Popen(
        [sys.executable, "-m", "middlebox", "probe-upstream", "--port", "0", "--keep", "4"],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
    )  # fmt: skip
    try:
        assert process.stdout is not None
        banner = process.stdout.readline()  # bounded: the process exits on any error
        found = re.fullmatch(r"listening on http://127\.0\.0\.1:(\d+)\n", banner)
        assert found is not None, banner
        port = int(found[1])
        exchange(port, request("frames=2;size=40;format=text;id=cli"))
        status, record = get(port, "/probe/requests/cli")
        assert status == 200 and record["frames_written"] == 2
        with socket.socket() as taken:
            taken.bind(("127.0.0.1", 0))
            taken.listen()
            busy_port = taken.getsockname()[1]
            busy = subprocess.run(
                [sys.executable, "-m", "middlebox", "probe-upstream", "--port", str(busy_port)],
                capture_output=True, text=True, timeout=60,
            )  # fmt: skip
        assert busy.returncode == 1 and "Traceback" not in busy.stderr
        assert busy.stderr.strip().splitlines() == [
            f"Error: cannot listen on 127.0.0.1:{busy_port} (--port): address already in use "
            "(another proxy or server has it: stop it, or pick another port; port 0 picks a "
            "free one)"
        ]
    finally:
        stop(process, signal.SIGTERM)
    assert process.returncode == 0


def test_a_connection_past_the_limit_gets_a_503_and_the_first_stream_goes_on() -> None:
    with ProbeUpstream("127.0.0.1", 0, max_connections=1) as server:
        knobs = "frames=50;size=40;period=10ms;format=text;id=first"
        with socket.create_connection(("127.0.0.1", server.port), timeout=WAIT) as first:
            first.sendall(request(knobs))
            read_frames(first, 1)
            refused = exchange(server.port, request("frames=1;id=second"))
            received = b""
            while chunk := first.recv(65536):
                received += chunk
        assert refused.startswith(b"HTTP/1.1 503 Service Unavailable")
        assert b"too many connections to the probe upstream" in refused
        assert received.endswith(b"0\r\n\r\n") and settled(server, "first")["ended"] == "done"
        assert server.records() == ["first"]


def test_an_ipv6_loopback_probe_records_the_peer_in_brackets() -> None:
    if not socket.has_ipv6 and not os.environ.get("CI"):
        pytest.skip("no IPv6 on this machine")  # never skipped in CI
    with ProbeUpstream("::1", 0) as server:
        with socket.create_connection(("::1", server.port), timeout=WAIT) as sock:
            sock.sendall(request("frames=1;size=40;format=text;id=v6"))
            while sock.recv(65536):
                pass
        assert settled(server, "v6")["peer"].startswith("[::1]:")


def test_a_client_that_sends_megabytes_while_it_reads_is_closed_after_its_answer(
    probe: ProbeUpstream,
) -> None:
    knobs = "frames=20;size=40;period=5ms;format=text;id=flood"
    with socket.create_connection(("127.0.0.1", probe.port), timeout=WAIT) as sock:
        sock.sendall(request(knobs, close=False))
        read_frames(sock, 1)
        sock.sendall(b"x" * (3 * 1024 * 1024))  # past what the probe keeps ahead of answers
        received = b""
        while chunk := sock.recv(65536):  # the probe closes: a hang is a timeout here
            received += chunk
    record = settled(probe, "flood")
    assert record["ended"] == "done" and record["frames_written"] == 20
    assert received.endswith(b"0\r\n\r\n")


def test_a_clean_end_closes_the_chunked_body_without_done(probe: ProbeUpstream) -> None:
    knobs = "frames=2;size=40;period=5ms;format=text;end=clean;id=clean"
    received = exchange(probe.port, request(knobs))
    assert received == expected(knobs)
    assert received.endswith(b"\r\n0\r\n\r\n") and b"[DONE]" not in received
    assert settled(probe, "clean")["ended"] == "clean"
