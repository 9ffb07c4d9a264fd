"""Head rewriters in a row: each reads the stream the one before it published (it knows
what it wrote, so no framer runs on that stream), and learns from those pieces all a
framer would have told it: the request's head and body to decide on, the method a
response answers (a HEAD's has no body), a 101's tunnel.
"""

from __future__ import annotations

import pytest

from faults._lib.match import RequestMatch
from faults.set_header import SetHeader
from faults.strip_header import StripHeader
from faults.testing import joined, replay
from middlebox.core.fault import Fault, Pipeline
from middlebox.core.stream import DOWN, UP, Chunk, Eof
from tests.faults.httpprops import request

MODELS = b"GET /v1/models HTTP/1.1\r\nHost: up\r\nCache-Control: no-cache\r\nAccept: */*\r\n\r\n"
REWRITTEN = b"GET /v1/models HTTP/1.1\r\nHost: up\r\nAccept: */*\r\nX-A: 1\r\n\r\n"
ANSWER = b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: 2\r\n\r\n{}"


def set_a(direction: str = "request") -> SetHeader:
    return SetHeader(headers={"X-A": "1"}, direction=direction)  # type: ignore[arg-type]


def strip_cache(direction: str = "request") -> StripHeader:
    return StripHeader(headers=["Cache-Control"], direction=direction)  # type: ignore[arg-type]


@pytest.mark.parametrize("set_first", [True, False])
def test_two_request_rewriters_both_rewrite_and_the_request_goes_on(set_first: bool) -> None:
    faults: list[Fault] = [set_a(), strip_cache()] if set_first else [strip_cache(), set_a()]
    pipeline = Pipeline(faults)
    out = replay(
        pipeline,
        [(0.0, Chunk(UP, MODELS)), (0.1, Chunk(DOWN, ANSWER)), (0.2, Eof(DOWN))],
    )
    assert joined(out, UP) == REWRITTEN
    assert joined(out, DOWN) == ANSWER
    assert [(f.name, r.action, r.details["request"]) for f in faults for r in f.reports] == [
        (f.name, "rewrote_head", 0) for f in faults
    ]


def test_every_request_of_a_keep_alive_connection_passes_three_request_rewriters() -> None:
    faults: list[Fault] = [
        set_a(),
        strip_cache(),
        SetHeader(headers={"X-B": "2"}, direction="request"),
    ]
    out = replay(Pipeline(faults), [(i * 1.0, Chunk(UP, MODELS)) for i in range(3)])
    expected = REWRITTEN[:-2] + b"X-B: 2\r\n\r\n"
    assert joined(out, UP) == expected * 3
    assert [len(f.reports) for f in faults] == [3, 3, 3]


def test_the_second_rewriter_matches_on_the_body_the_first_passed_on() -> None:
    # `match: {model: ...}` reads the request body: at the second place it is the body the
    # first rewriter forwarded (and published), not the client's stream.
    second = StripHeader(
        headers=["Content-Type"], direction="request", match=RequestMatch(model="Qwen/*")
    )
    faults: list[Fault] = [SetHeader(headers={"X-A": "1"}, direction="request"), second]
    out = replay(
        Pipeline(faults),
        [(0.0, Chunk(UP, request())), (1.0, Chunk(UP, request(model="other")))],
    )
    first, other = request(), request(model="other")
    assert joined(out, UP) == (
        first.replace(b"Content-Type: application/json\r\n", b"").replace(
            b"\r\n\r\n", b"\r\nX-A: 1\r\n\r\n", 1
        )
        + other.replace(b"\r\n\r\n", b"\r\nX-A: 1\r\n\r\n", 1)
    )
    assert [r.details["request"] for r in second.reports] == [0]


def test_a_head_request_through_a_request_rewriter_leaves_the_next_answer_framed() -> None:
    # The response stream takes its methods from the request stream the rewriter publishes:
    # the answer to HEAD has no body (RFC 9110 §9.3.2), so the next answer's head is a head
    # and the response rewriter nearer the client rewrites it.
    head_request = MODELS.replace(b"GET", b"HEAD", 1)
    response_side = set_a("response")
    faults: list[Fault] = [response_side, strip_cache()]
    out = replay(
        Pipeline(faults),
        [
            (0.0, Chunk(UP, head_request)),
            (0.1, Chunk(DOWN, ANSWER[: -len(b"{}")])),
            (1.0, Chunk(UP, MODELS)),
            (1.1, Chunk(DOWN, ANSWER)),
        ],
    )
    with_a = ANSWER.replace(b"\r\n\r\n", b"\r\nX-A: 1\r\n\r\n", 1)
    assert joined(out, DOWN) == with_a[: -len(b"{}")] + with_a
    assert [r.details["message"] for r in response_side.reports] == [0, 1]


def test_a_101_through_a_response_rewriter_turns_the_client_request_stream_into_a_tunnel() -> None:
    upgrade = b"GET /ws HTTP/1.1\r\nHost: up\r\nConnection: Upgrade\r\nUpgrade: websocket\r\n\r\n"
    switching = (
        b"HTTP/1.1 101 Switching Protocols\r\nConnection: Upgrade\r\nUpgrade: websocket\r\n\r\n"
    )
    pipeline = Pipeline([set_a("response")])
    replay(pipeline, [(0.0, Chunk(UP, upgrade)), (0.1, Chunk(DOWN, switching))])
    framing = pipeline.framing
    assert framing is not None
    client_requests, _ = framing.leg("client")
    assert client_requests.http is not None and client_requests.http.tunnel
    # a live tunnel is not an idle keep-alive connection (graceful shutdown keeps it)
    assert not framing.between_messages()


def test_a_200_through_a_response_rewriter_opens_no_tunnel() -> None:
    pipeline = Pipeline([set_a("response")])
    replay(pipeline, [(0.0, Chunk(UP, MODELS)), (0.1, Chunk(DOWN, ANSWER))])
    assert pipeline.framing is not None
    client_requests, _ = pipeline.framing.leg("client")
    assert client_requests.http is not None and not client_requests.http.tunnel
    assert pipeline.framing.between_messages()
