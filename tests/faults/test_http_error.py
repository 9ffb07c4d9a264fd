"""http_error: matched requests are answered by the hop itself (a rate limiter's 429, a
full vLLM queue's 503, nginx's 502), never reach the server, and keep HTTP/1.1 order."""

from __future__ import annotations

import json
import random
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from faults import REGISTRY
from faults._lib.match import RequestMatch
from faults.http_error import HttpError, error_body
from faults.testing import joined, replay
from middlebox.core.fault import FaultContext
from middlebox.core.stream import DOWN, UP, Chunk, Eof, Reset
from middlebox.scenario.load import load_scenario_text
from tests.faults.httpprops import cut_lists, exchanges, request, resplit, sse_response, timed
from tests.faults.netprops import assert_deterministic

OK = b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok"


def openai_429(retry: str | None = "2") -> bytes:
    body, _ = error_body("openai", 429, model="Qwen/Qwen3-0.6B", retry_after=float(retry or 0))
    retry_after = b"Retry-After: %s\r\n" % retry.encode() if retry else b""
    return (
        b"HTTP/1.1 429 Too Many Requests\r\nServer: cloudflare\r\n"
        b"Content-Type: application/json\r\nContent-Length: %d\r\n%s\r\n%s"
        % (len(body), retry_after, body)
    )


def test_the_first_request_gets_a_429_at_once_and_the_next_one_reaches_the_server() -> None:
    fault = HttpError(retry_after=2.0, match=RequestMatch(first=1))
    out = replay(
        fault,
        [
            (0.0, Chunk(UP, request())),
            (1.0, Chunk(UP, request())),
            (1.5, Chunk(DOWN, OK)),
        ],
    )
    assert out == [
        (0.0, Chunk(DOWN, openai_429())),
        (1.0, Chunk(UP, request())),
        (1.5, Chunk(DOWN, OK)),
    ]
    assert [(r.time, r.action, r.details) for r in fault.reports] == [
        (
            0.0,
            "answered",
            {"request": 0, "message": 0, "offset": 0, "status": 429, "connection": "keep-alive"},
        )
    ]


def test_the_openai_body_is_the_rate_limit_error_clients_parse() -> None:
    body, content_type = error_body("openai", 429, model="gpt-x", retry_after=1.5)
    error = json.loads(body)["error"]
    assert content_type == "application/json" and body.endswith(b"}\n")
    assert (error["type"], error["code"], error["param"]) == (
        "requests",
        "rate_limit_exceeded",
        None,
    )
    assert error["message"].startswith("Rate limit reached for gpt-x in organization")
    assert "Please try again in 1.5s." in error["message"]


@pytest.mark.parametrize(
    ("status", "message", "body"),
    [
        (
            503,
            None,
            b'{"error":{"message":"The engine is currently busy and cannot accept new requests.'
            b' Please try again later or on a different instance.","type":"Service Unavailable",'
            b'"param":null,"code":503}}',
        ),
        (
            500,
            None,
            b'{"error":{"message":"The server had an error while processing your request.",'
            b'"type":"InternalServerError","param":null,"code":500}}',
        ),
        (
            404,
            None,
            b'{"error":{"message":"The model `m` does not exist.","type":"NotFoundError",'
            b'"param":"model","code":404}}',
        ),
        (
            429,
            "slow down",
            b'{"error":{"message":"slow down","type":"Too Many Requests","param":null,"code":429}}',
        ),
        (401, None, b'{"error":"Unauthorized"}'),
    ],
)
def test_vllm_bodies_are_byte_exact_as_its_error_handler_writes_them(
    status: int, message: str | None, body: bytes
) -> None:
    assert error_body("vllm", status, message, model="m") == (body, "application/json")


def test_nginx_and_text_bodies() -> None:
    page, content_type = error_body("nginx", 502)
    assert content_type == "text/html"
    assert b"<title>502 Bad Gateway</title>" in page and b"<center>nginx</center>" in page
    assert error_body("text", 503) == (b"Service Unavailable", "text/plain; charset=utf-8")
    assert error_body("text", 503, "no healthy upstream") == (
        b"no healthy upstream",
        "text/plain; charset=utf-8",
    )


def test_connection_close_ends_both_sides_and_drops_what_the_client_sends_next() -> None:
    fault = HttpError(status=503, body="nginx", connection="close")
    out = replay(
        fault,
        [(0.0, Chunk(UP, request())), (0.5, Chunk(UP, request())), (0.75, Eof(UP))],
    )
    answer = fault.answer(None, close=True)
    assert answer.startswith(b"HTTP/1.1 503 Service Unavailable\r\nServer: nginx\r\n")
    assert b"Connection: close\r\n" in answer
    assert out == [(0.0, Chunk(DOWN, answer)), (0.0, Eof(DOWN)), (0.0, Eof(UP))]


def test_a_request_asking_to_close_gets_a_closing_answer_even_in_keep_alive_mode() -> None:
    req = request().replace(b"Host: upstream\r\n", b"Host: upstream\r\nConnection: close\r\n")
    out = replay(HttpError(body="text", status=429), [(0.0, Chunk(UP, req))])
    assert [type(item).__name__ for _, item in out] == ["Chunk", "Eof", "Eof"]
    assert b"Connection: close\r\n" in joined(out, DOWN)


def test_an_answer_behind_a_streaming_response_waits_until_that_response_is_done() -> None:
    stream = sse_response(2)
    fault = HttpError(body="vllm", status=503, connection="close", match=RequestMatch(requests=[1]))
    out = replay(
        fault,
        [
            (0.0, Chunk(UP, request() + request())),  # pipelined
            (0.5, Chunk(DOWN, stream[:120])),
            (1.0, Chunk(DOWN, stream[120:] + OK)),
            (2.0, Chunk(DOWN, OK)),
        ],
    )
    answer = fault.answer(None, close=True)
    assert out == [
        (0.0, Chunk(UP, request())),
        (0.5, Chunk(DOWN, stream[:120])),
        (1.0, Chunk(DOWN, stream[120:])),
        (1.0, Chunk(DOWN, answer)),
        (1.0, Eof(DOWN)),
        (1.0, Eof(UP)),
    ]
    assert fault.reports[0].time == 0.0 and fault.reports[0].details["message"] == 1


def test_a_model_filter_holds_the_request_until_its_body_says_which_model() -> None:
    mine, other = request(model="Qwen/Qwen3-0.6B"), request(model="llama")
    cut = mine.index(b"\r\n\r\n") + 4
    fault = HttpError(match=RequestMatch(model="Qwen/*"))
    out = replay(
        fault,
        [
            (0.0, Chunk(UP, other[:cut])),
            (0.25, Chunk(UP, other[cut:])),
            (1.0, Chunk(DOWN, OK)),
            (2.0, Chunk(UP, mine[:cut])),
            (2.25, Chunk(UP, mine[cut:])),
        ],
    )
    assert out == [
        (0.25, Chunk(UP, other)),
        (1.0, Chunk(DOWN, OK)),
        (2.25, Chunk(DOWN, openai_429(retry=None))),
    ]
    assert fault.reports[0].details["request"] == 0  # the first request of that model


SSE_HEAD_ONLY = (
    b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ntransfer-encoding: chunked\r\n\r\n"
)


@pytest.mark.parametrize(
    "response",
    [
        b"",  # the server closed without answering the forwarded request
        SSE_HEAD_ONLY,  # a stream cut after its head (a server aborting on the client's FIN)
        b"HTTP/1.1 200 OK\r\n\r\npartial",  # a body the close itself delimits
    ],
    ids=["no-response", "bodyless-head", "close-delimited"],
)
@pytest.mark.parametrize("client_fin", [True, False])
def test_an_answer_behind_a_response_the_server_s_close_ends_is_never_written(
    response: bytes, client_fin: bool
) -> None:
    # The client pipelines two requests (and half-closes); the first is forwarded, the
    # second matched. Whatever the server's close leaves owed, a 429 after it would be
    # read as (part of) the first request's response: the client gets the close instead.
    fault = HttpError(body="text", match=RequestMatch(requests=[1]))
    timeline = [(0.0, Chunk(UP, request() + request()))]
    timeline += [(0.0, Eof(UP))] if client_fin else []
    timeline += [(0.5, Chunk(DOWN, response))] if response else []
    out = replay(fault, [*timeline, (1.0, Eof(DOWN))])
    assert joined(out, DOWN) == response
    assert out[-1] == (1.0, Eof(DOWN))
    assert [(r.action, r.details["request"]) for r in fault.reports] == [
        ("answered", 1),
        ("unsent", 1),
    ]


def test_an_answer_behind_a_response_framed_to_its_end_goes_out_before_the_server_s_close() -> None:
    fault = HttpError(body="text", match=RequestMatch(requests=[1]))
    timeline = [(0.0, Chunk(UP, request() + request())), (0.0, Eof(UP)), (0.5, Chunk(DOWN, OK))]
    out = replay(fault, [*timeline, (1.0, Eof(DOWN))])
    assert out[1:] == [
        (0.0, Eof(UP)),
        (0.5, Chunk(DOWN, OK)),
        (0.5, Chunk(DOWN, fault.answer(None, close=False))),
        (1.0, Eof(DOWN)),
    ]
    assert [r.action for r in fault.reports] == ["answered"]


def test_a_client_reset_after_a_closing_answer_still_reaches_the_server() -> None:
    out = replay(
        HttpError(connection="close"),
        [(0.0, Chunk(UP, request())), (0.5, Chunk(UP, b"junk")), (0.6, Reset(UP))],
    )
    assert out[-1] == (0.6, Reset(UP))
    assert joined(out, UP) == b""


def test_the_first_two_requests_across_connections_are_answered() -> None:
    shared: dict[str, Any] = {}
    answered = []
    for connection in range(3):
        fault = HttpError(match=RequestMatch(first=2))
        fault.bind(FaultContext(connection_id=connection, rng=random.Random(0), shared=shared))
        out = replay(fault, [(connection * 1.0, Chunk(UP, request()))], bind=False)
        answered.append(joined(out, UP) == b"")
    assert answered == [True, True, False]


@given(cuts=cut_lists)
def test_whatever_the_segmentation_unmatched_requests_and_responses_pass_byte_exact(
    cuts: list[int],
) -> None:
    client = request() + request(model="second") + request(model="third")
    fault = HttpError(body="vllm", status=503, match=RequestMatch(requests=[1]))
    timeline = timed(UP, resplit(client, cuts), 0.0, 0.001) + timed(
        DOWN, resplit(OK + OK, cuts), 1.0, 0.001
    )
    out = replay(fault, timeline)
    assert joined(out, UP) == request() + request(model="third")
    assert joined(out, DOWN) == OK + fault.answer(None, close=False) + OK


@settings(max_examples=25)
@given(seed=st.integers(0, 2**32))
def test_the_same_seed_answers_the_same_requests(seed: int) -> None:
    timeline = exchanges(OK)
    assert_deterministic(lambda: HttpError(match=RequestMatch(probability=0.5)), timeline, seed)


def test_it_loads_from_yaml_with_a_duration_and_a_match_block() -> None:
    scenario = load_scenario_text(
        "name: rl\npath:\n  - http_error: {status: 503, retry_after: 1500ms, body: vllm,"
        " connection: close, match: {path: /v1/*, first: 2}}\n",
        REGISTRY,
    )
    (fault,) = scenario.build_faults()
    assert fault == HttpError(
        status=503,
        retry_after=1.5,
        body="vllm",
        connection="close",
        match=RequestMatch(path="/v1/*", first=2),
    )
    assert b"Retry-After: 2\r\n" in fault.answer(None, close=True)


@pytest.mark.parametrize(
    ("config", "message"),
    [
        ({"status": 200}, "status"),
        ({"status": 499}, "status"),
        ({"retry_after": -1.0}, "retry_after"),
        ({"body": "html"}, "body"),
        ({"connection": "upgrade"}, "connection"),
    ],
)
def test_bad_config_is_refused(config: dict[str, Any], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        HttpError(**config)


def test_a_head_request_gets_the_status_and_fields_without_a_body() -> None:
    fault = HttpError(body="vllm", status=503)
    out = replay(fault, [(0.0, Chunk(UP, b"HEAD /v1/models HTTP/1.1\r\nHost: x\r\n\r\n"))])
    data = joined(out, DOWN)
    assert data.startswith(b"HTTP/1.1 503 Service Unavailable\r\n") and data.endswith(b"\r\n\r\n")
    body, _ = error_body("vllm", 503)
    assert b"Content-Length: %d\r\n" % len(body) in data and body not in data
