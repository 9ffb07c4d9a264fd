"""The shared conformance vectors through the framers (issue 14).

Every HTTP vector (llhttp, http-parser, h11, smuggling) at every two-way split: the
pieces give the input back byte for byte and coalesce to the same list, with the same
refusal. Where a vector's source says whether a strict parser refuses it, the framer
agrees, except for the deliberate deviations in docs/conformance.md (each below with
its reason) and the vectors not yet triaged (listed, so a change in either shows).
Every SSE vector (WPT eventsource, WHATWG examples) dispatches the same events at every
split, and the last event ID held at EOF is the expected one.
"""

from __future__ import annotations

import pytest

from middlebox.core.http1 import Http1Framer, Piece, coalesce
from middlebox.core.sse import SseFramer
from tests.conformance.vectors import HttpVector, http_vectors, load

HTTP = http_vectors()

# Deliberate deviations (docs/conformance.md), by the framer's reason for refusing.
DEVIATION_REASONS = {
    "CONNECT method": "nginx answers CONNECT 405; a reverse proxy opens no tunnel",
    "Transfer-Encoding repeated": "RFC 9112 §7 (chunked at most once); nginx refuses",
    "folded Transfer-Encoding": "a folded framing field would be forwarded folded",
    "Content-Length and Transfer-Encoding": "RFC 9112 §6.1; nginx 400 (request) / 502",
    "not HTTP/1.x": "RTSP, ICE, HTTP/0.9: not HTTP/1.x, passed through opaque",
    "not an HTTP/1.x status line": "RTSP, ICE, HTTP/0.9: not HTTP/1.x, passed through",
    "malformed request line 'GET /'": "HTTP/0.9 request line: passed through opaque",
    "control byte in field line": "strict as llhttp: h11 accepts \\x01 in a value",
}

# A strict parser refuses these and the framer frames them: not yet triaged (issue 14).
UNTRIAGED = {
    "nodejs/llhttp@01e105a30fd0:test/request/connection.md:545",
    "nodejs/llhttp@01e105a30fd0:test/request/connection.md:682",
    "nodejs/llhttp@01e105a30fd0:test/request/connection.md:716",
    "nodejs/llhttp@01e105a30fd0:test/request/connection.md:756",
    "nodejs/llhttp@01e105a30fd0:test/request/connection.md:815",
    "nodejs/llhttp@01e105a30fd0:test/request/content-length.md:78",
    "nodejs/llhttp@01e105a30fd0:test/request/content-length.md:103",
    "nodejs/llhttp@01e105a30fd0:test/request/content-length.md:496",
    "nodejs/llhttp@01e105a30fd0:test/request/invalid.md:69",
    "nodejs/llhttp@01e105a30fd0:test/request/invalid.md:116",
    "nodejs/llhttp@01e105a30fd0:test/request/invalid.md:150",
    "nodejs/llhttp@01e105a30fd0:test/request/invalid.md:257",
    "nodejs/llhttp@01e105a30fd0:test/request/invalid.md:359",
    "nodejs/llhttp@01e105a30fd0:test/request/invalid.md:493",
    "nodejs/llhttp@01e105a30fd0:test/request/invalid.md:512",
    "nodejs/llhttp@01e105a30fd0:test/request/transfer-encoding.md:331",
    "nodejs/llhttp@01e105a30fd0:test/request/transfer-encoding.md:427",
    "nodejs/llhttp@01e105a30fd0:test/request/transfer-encoding.md:1187",
    "nodejs/llhttp@01e105a30fd0:test/request/uri.md:151",
    "nodejs/llhttp@01e105a30fd0:test/response/connection.md:296",
    "nodejs/llhttp@01e105a30fd0:test/response/connection.md:334",
    "nodejs/llhttp@01e105a30fd0:test/response/invalid.md:215",
    "nodejs/llhttp@01e105a30fd0:test/response/invalid.md:290",
    "nodejs/llhttp@01e105a30fd0:test/response/invalid.md:330",
    "nodejs/llhttp@01e105a30fd0:test/response/sample.md:333",
    "nodejs/llhttp@01e105a30fd0:test/response/transfer-encoding.md:7",
    "nodejs/llhttp@01e105a30fd0:test/response/transfer-encoding.md:251",
    "nodejs/llhttp@01e105a30fd0:test/response/transfer-encoding.md:348",
    "python-hyper/h11@62c5068c9715:h11/tests/test_io.py:550",
}


def frame(vector: HttpVector, parts: list[bytes]) -> tuple[list[Piece], Http1Framer]:
    framer = Http1Framer(vector.role)
    pieces: list[Piece] = []
    for part in parts:
        pieces += framer.feed(part)
    return pieces + framer.feed_eof(), framer


def cuts(size: int) -> range:
    return range(1, size) if size <= 600 else range(1, size, max(1, size // 300))


@pytest.mark.parametrize("vector", HTTP, ids=[f"{i}:{v.ident}" for i, v in enumerate(HTTP)])
def test_every_split_is_byte_exact_and_frames_alike(vector: HttpVector) -> None:
    whole, framer = frame(vector, [vector.data])
    assert b"".join(p.data for p in whole) == vector.data
    expected = [(p.kind, p.data, p.message, p.end_of_message) for p in coalesce(whole)]
    for cut in cuts(len(vector.data)):
        pieces, split = frame(vector, [vector.data[:cut], vector.data[cut:]])
        assert b"".join(p.data for p in pieces) == vector.data, cut
        got = [(p.kind, p.data, p.message, p.end_of_message) for p in coalesce(pieces)]
        assert got == expected, cut
        assert split.refusal == framer.refusal, cut


def test_verdicts_agree_with_the_sources_but_for_the_listed_deviations() -> None:
    deviations: dict[str, str] = {}
    disagreeing: set[str] = set()
    for vector in HTTP:
        if vector.error is None:
            continue
        _, framer = frame(vector, [vector.data])
        refused = framer.refusal is not None
        if refused == vector.error:
            continue
        reason = framer.refusal.reason if framer.refusal is not None else ""
        known = [why for key, why in DEVIATION_REASONS.items() if reason.startswith(key)]
        if known:
            deviations[vector.ident] = known[0]
        else:
            disagreeing.add(vector.ident)
    assert disagreeing == UNTRIAGED
    assert set(deviations.values()) <= set(DEVIATION_REASONS.values())


SSE = load("sse.json")


@pytest.mark.parametrize("vector", SSE, ids=[v["source"] for v in SSE])
def test_sse_vectors_dispatch_the_same_events_at_every_split(vector: dict[str, object]) -> None:
    stream = str(vector["stream"]).encode("utf-8")
    expected = [(e["type"], e["data"], e["lastEventId"]) for e in vector["events"]]  # type: ignore[attr-defined]
    for cut in range(len(stream) + 1):
        framer = SseFramer()
        pieces = framer.feed(stream[:cut]) + framer.feed(stream[cut:]) + framer.feed_eof()
        assert b"".join(p.data for p in pieces) == stream, cut
        events = [(p.event.event, p.event.data, p.event.last_event_id) for p in pieces if p.event]
        assert events == expected, cut
        if "final_last_event_id" in vector:
            assert framer.last_event_id == vector["final_last_event_id"], cut
