"""Fail closed: a request the framer refuses never reaches a fault or the
upstream when an HTTP-aware fault is in the path; the client gets nginx's answer and a
close. Driven through a real `Pipeline` as the server composes it (compose.PROXY_STAGES)."""

from __future__ import annotations

import random

import pytest

from faults._lib.match import RequestMatch
from faults._proxy.fail_closed import FailClosed
from faults.http_error import HttpError
from faults.latency import Latency
from middlebox.compose import PROXY_STAGES
from middlebox.core.fault import FaultContext, FaultReport, Pipeline
from middlebox.core.responses import error_response
from middlebox.core.stream import DOWN, UP, Chunk, Eof, Item
from middlebox.scenario.model import ProxyOptions

CHAT = (
    b"POST /v1/chat/completions HTTP/1.1\r\nHost: a\r\nContent-Type: application/json\r\n"
    b'Content-Length: 15\r\n\r\n{"model": "m"}\n'
)
SMUGGLE = b"POST /v1/chat/completions HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: chunked\r\n\r\n\r\n"


def composed(options: ProxyOptions, *faults: object) -> tuple[Pipeline, list[FaultReport]]:
    client_side, upstream_side = PROXY_STAGES.around(options)
    pipeline = Pipeline([*client_side, *faults, *upstream_side])  # type: ignore[list-item]
    reports: list[FaultReport] = []
    pipeline.bind(FaultContext(1, random.Random(0), reports.append))
    pipeline.on_open(0.0)
    return pipeline, reports


def rate_limited() -> HttpError:
    return HttpError(status=429, match=RequestMatch(path="/v1/chat/completions"))


def run(pipeline: Pipeline, *chunks: bytes) -> list[Item]:
    out: list[Item] = []
    for data in chunks:
        out += pipeline.on_item(Chunk(UP, data), 1.0)
    return out


def upstream_bytes(out: list[Item]) -> bytes:
    return b"".join(i.data for i in out if isinstance(i, Chunk) and i.direction is UP)


def client_bytes(out: list[Item]) -> bytes:
    return b"".join(i.data for i in out if isinstance(i, Chunk) and i.direction is DOWN)


BYPASSES = {
    "smuggled in a chunked body": (SMUGGLE + CHAT, 400),
    "double space in the request line": (
        b"POST  /v1/chat/completions HTTP/1.1\r\n\r\n" + CHAT,
        400,
    ),
    "CONNECT then a chat": (b"CONNECT x:443 HTTP/1.1\r\nHost: x:443\r\n\r\n" + CHAT, 405),
    "CL and TE together": (
        b"POST /v1/chat/completions HTTP/1.1\r\nContent-Length: 5\r\n"
        b"Transfer-Encoding: chunked\r\n\r\n0\r\n\r\n" + CHAT,
        400,
    ),
}


@pytest.mark.parametrize(("data", "status"), BYPASSES.values(), ids=list(BYPASSES))
def test_a_refused_request_gets_nginx_s_answer_and_nothing_reaches_the_upstream(
    data: bytes, status: int
) -> None:
    pipeline, reports = composed(ProxyOptions(), rate_limited())
    out = run(pipeline, data)
    assert upstream_bytes(out) == b""
    assert client_bytes(out) == error_response(status)
    assert out[-2:] == [Eof(DOWN), Eof(UP)]
    (refused,) = [r for r in reports if r.fault == "fail_closed"]
    assert refused.action == "refused" and refused.details["status"] == status
    # The 429 fault never saw a request: no decision, no answer.
    assert not [r for r in reports if r.fault == "http_error"]
    assert run(pipeline, CHAT) == []  # nothing more goes anywhere


def test_a_fault_never_sees_a_second_message_after_a_framing_error() -> None:
    pipeline, _ = composed(ProxyOptions(), Latency(delay=0.0), rate_limited())
    out = run(pipeline, CHAT, b"GET  / HTTP/1.1\r\n\r\n" + CHAT)
    # The first chat is answered 429 by the fault, the refused read closes the connection.
    assert client_bytes(out).startswith(b"HTTP/1.1 429")
    assert client_bytes(out).endswith(error_response(400))
    assert upstream_bytes(out) == b""


def test_pass_through_is_a_scenario_s_explicit_choice() -> None:
    pipeline, reports = composed(
        ProxyOptions(on_unframeable_request="pass_through"), rate_limited()
    )
    out = run(pipeline, b"POST  /v1/chat/completions HTTP/1.1\r\n\r\n" + CHAT)
    assert upstream_bytes(out) == b"POST  /v1/chat/completions HTTP/1.1\r\n\r\n" + CHAT
    assert not [r for r in reports if r.fault == "fail_closed"]


def test_with_no_http_aware_fault_the_stage_steps_aside_and_nothing_is_framed() -> None:
    pipeline, _ = composed(ProxyOptions(), Latency(delay=0.0))
    (stage,) = [f for f in pipeline.faults if isinstance(f, FailClosed)]
    assert stage.finished and pipeline.framing is None


def test_bytes_after_a_connection_close_request_are_discarded_unanswered() -> None:
    pipeline, reports = composed(ProxyOptions(), rate_limited())
    first = b"GET /health HTTP/1.1\r\nConnection: close\r\n\r\n"
    out = run(pipeline, first + CHAT)
    assert upstream_bytes(out) == first and client_bytes(out) == b""
    (refused,) = [r for r in reports if r.fault == "fail_closed"]
    assert refused.details["status"] is None and "Connection: close" in refused.details["reason"]


def test_a_bad_body_after_its_head_went_on_closes_without_a_second_answer() -> None:
    pipeline, _ = composed(ProxyOptions(), HttpError(status=429, match=RequestMatch(path="/x")))
    head = b"POST /v1/chat/completions HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n"
    out = run(pipeline, head, b"5\r\nhello\r\nzz\r\n" + CHAT)
    assert upstream_bytes(out) == head + b"5\r\nhello\r\n"
    assert client_bytes(out) == error_response(400)
    assert out[-2:] == [Eof(DOWN), Eof(UP)]
