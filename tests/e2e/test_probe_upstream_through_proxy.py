"""The probe upstream behind a real `middlebox proxy` process whose path rewrites the request
(set_header adds a field, strip_header removes one, http10_upstream speaks HTTP/1.0 to the
upstream as nginx does by default): the probe's record of the request shows each change,
and the client still gets every frame, re-chunked by the hop. What a fingerprinter reads
at the upstream side of a path. Bounded: every wait and socket has a timeout."""

from __future__ import annotations

import json
from pathlib import Path

from middlebox.tools.probe_upstream import ProbeUpstream
from tests.proxy_process import exchange, middlebox_proxy
from tests.tools.test_probe_upstream import settled

PATH = (
    "  - set_header: {direction: request, headers: {X-Team: blue}}\n"
    "  - strip_header: {direction: request, headers: [X-Secret]}\n"
    "  - http10_upstream: {}\n"
)
KNOBS = "frames=5;size=64;period=10ms;format=text;id=via-proxy"


def test_the_record_shows_the_headers_and_version_the_path_changed(tmp_path: Path) -> None:
    body = json.dumps({"model": "m", "stream": True, "messages": []}).encode()
    request = (
        f"POST /v1/chat/completions HTTP/1.1\r\nHost: front\r\nX-Middlebox-Probe: {KNOBS}"
        f"\r\nX-Secret: s3\r\nContent-Type: application/json\r\nConnection: close\r\n"
        f"Content-Length: {len(body)}\r\n\r\n"
    ).encode() + body
    with ProbeUpstream("127.0.0.1", 0) as probe:
        with middlebox_proxy(tmp_path, probe.port, PATH, "rewrite-for-the-probe") as port:
            answer = exchange(port, request)
        record = settled(probe, "via-proxy")
    assert record is not None
    seen = record["request"]
    names = [name.lower() for name, _ in seen["headers"]]
    assert ["X-Team", "blue"] in seen["headers"] and "x-secret" not in names
    assert seen["version"] == "HTTP/1.0" and ["Connection", "close"] in seen["headers"]
    assert json.loads(seen["body"]) == {"model": "m", "stream": True, "messages": []}
    # the probe answered HTTP/1.0 close-delimited; the hop chunked it for the client
    assert (record["framing"], record["ended"], record["frames_written"]) == ("close", "done", 5)
    head, _, chunked = answer.partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 200") and b"transfer-encoding: chunked" in head.lower()
    assert chunked.count(b'data: {"text":"') == 5 and chunked.endswith(b"0\r\n\r\n")
