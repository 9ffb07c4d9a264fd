"""inband_error: after N events of a matched 200 stream, the exact error frame vLLM (or
OpenAI) sends when generation fails, then [DONE] and a clean end, a truncated close, or
the rest of the stream."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from faults import REGISTRY
from faults._lib.match import RequestMatch
from faults.inband_error import DONE_FRAME, InbandError, error_frame
from faults.testing import joined, replay
from middlebox.core.http1 import LAST_CHUNK_BYTES, encode_chunk
from middlebox.core.stream import DOWN, UP, Chunk, Eof
from middlebox.scenario.load import load_scenario_text
from tests.faults.httpprops import (
    SSE_HEAD,
    cut_lists,
    dechunked,
    exchanges,
    frame,
    rechunk,
    request,
    sse_chunks,
    sse_response,
)
from tests.faults.netprops import assert_deterministic
from tests.faults.sse_timelines import in_segments

VLLM_FRAME = (
    b'data: {"error":{"message":"Internal server error","type":"InternalServerError",'
    b'"param":null,"code":500}}\n\n'
)


@pytest.mark.parametrize(
    ("shape", "expected"),
    [
        ("vllm", VLLM_FRAME),
        (
            "vllm-spaced",
            b'data: {"error": {"message": "Internal server error", "type": '
            b'"InternalServerError", "param": null, "code": 500}}\n\n',
        ),
        (
            "vllm-legacy",
            b'data: {"error": {"object": "error", "message": "Internal server error", "type": '
            b'"BadRequestError", "param": null, "code": 400}}\n\n',
        ),
        (
            "openai",
            b'data: {"error": {"message": "The server had an error while processing your '
            b'request. Sorry about that!", "type": "server_error", "param": null, "code": null}}'
            b"\n\n",
        ),
    ],
)
def test_each_shape_is_the_exact_frame_of_its_server(shape: Any, expected: bytes) -> None:
    assert error_frame(shape) == expected


def test_a_retryable_failure_can_be_spelled_out() -> None:
    assert error_frame("vllm", "Request failed; please retry", code=503) == (
        b'data: {"error":{"message":"Request failed; please retry","type":'
        b'"InternalServerError","param":null,"code":503}}\n\n'
    )


def test_after_two_events_the_error_done_and_last_chunk_follow_then_both_sides_close() -> None:
    body = sse_chunks(3)
    fault = InbandError(events=2)
    out = replay(
        fault,
        [
            (0.0, Chunk(UP, request())),
            (0.02, Chunk(DOWN, SSE_HEAD)),
            (1.0, Chunk(DOWN, body[0])),
            (1.05, Chunk(DOWN, body[1])),
            (1.1, Chunk(DOWN, body[2])),
            (1.15, Chunk(DOWN, body[3] + body[4])),
        ],
    )
    assert out == [
        (0.0, Chunk(UP, request())),
        (0.02, Chunk(DOWN, SSE_HEAD)),
        (1.0, Chunk(DOWN, body[0])),
        (
            1.05,
            Chunk(
                DOWN,
                body[1] + encode_chunk(VLLM_FRAME) + encode_chunk(DONE_FRAME) + LAST_CHUNK_BYTES,
            ),
        ),
        # the upstream is told to stop (vLLM aborts on the FIN); the rest is never read
        (1.05, Eof(DOWN)),
        (1.05, Eof(UP)),
    ]
    assert [(r.time, r.action, r.details) for r in fault.reports] == [
        (
            1.05,
            "injected",
            {
                "request": 0,
                "message": 0,
                "event": 2,
                "body_offset": 2 * len(frame(0)),
                "then": "done",
                "dialect": "chat",
                "shape": "vllm",
            },
        )
    ]


# two requests on one keep-alive connection, each answered with two events and [DONE]
TWO_EXCHANGES = [
    (0.0, Chunk(UP, request())),
    (1.0, Chunk(DOWN, sse_response(2))),
    (2.0, Chunk(UP, request())),
    (3.0, Chunk(DOWN, sse_response(2))),
]


def test_done_stops_the_upstream_response_instead_of_reading_it_for_nobody() -> None:
    """A gateway that failed a stream does not read its upstream's response on (the model
    would generate the rest for nobody, and a next request on the connection would wait
    behind it): the whole response goes out, then the connection closes both ways, and
    nothing the upstream still sends, nor a next request, crosses."""
    fault = InbandError(events=1, match=RequestMatch(requests=[0]))
    out = replay(fault, TWO_EXCHANGES)
    first = SSE_HEAD + sse_chunks(1, done=False)[0]
    first += encode_chunk(VLLM_FRAME) + encode_chunk(DONE_FRAME) + LAST_CHUNK_BYTES
    assert joined(out, DOWN) == first
    assert [item for _, item in out if not isinstance(item, Chunk)] == [Eof(DOWN), Eof(UP)]
    assert [item for _, item in out if item.direction is UP] == [Chunk(UP, request()), Eof(UP)]


def test_continue_keeps_the_upstream_response_and_the_connection() -> None:
    fault = InbandError(events=1, then="continue", match=RequestMatch(requests=[0]))
    out = replay(fault, TWO_EXCHANGES)
    assert not [item for _, item in out if not isinstance(item, Chunk)]
    assert joined(out, DOWN).endswith(sse_response(2))


def test_an_event_ending_inside_a_chunk_splits_that_chunk_at_the_event_boundary() -> None:
    payload = frame(0) + frame(1)
    cut = len(frame(0)) + 10
    wire = SSE_HEAD + encode_chunk(payload[:cut]) + encode_chunk(payload[cut:])
    out = replay(
        InbandError(events=1, then="continue"),
        [(0.0, Chunk(UP, request())), (1.0, Chunk(DOWN, wire)), (1.5, Eof(DOWN))],
    )
    assert joined(out, DOWN) == (
        SSE_HEAD
        + encode_chunk(frame(0))
        + encode_chunk(VLLM_FRAME)
        + encode_chunk(payload[len(frame(0)) : cut])
        + encode_chunk(payload[cut:])
    )


def test_close_truncates_the_chunked_body_and_ends_both_sides() -> None:
    body = sse_chunks(3)
    out = replay(
        InbandError(events=1, then="close"),
        [
            (0.0, Chunk(UP, request())),
            (0.5, Chunk(DOWN, SSE_HEAD + body[0])),
            (1.0, Chunk(DOWN, body[1])),
            (1.5, Chunk(UP, b"more")),
        ],
    )
    assert out == [
        (0.0, Chunk(UP, request())),
        (0.5, Chunk(DOWN, SSE_HEAD + body[0] + encode_chunk(VLLM_FRAME))),
        (0.5, Eof(DOWN)),
        (0.5, Eof(UP)),
    ]


def test_zero_events_puts_the_error_right_after_the_headers() -> None:
    out = replay(
        InbandError(events=0, shape="openai"),
        [(0.0, Chunk(UP, request())), (0.5, Chunk(DOWN, SSE_HEAD))],
    )
    assert out[1] == (
        0.5,
        Chunk(
            DOWN,
            SSE_HEAD
            + encode_chunk(error_frame("openai"))
            + encode_chunk(DONE_FRAME)
            + LAST_CHUNK_BYTES,
        ),
    )


def test_a_body_read_until_close_gets_the_frames_and_then_the_close() -> None:
    head = b"HTTP/1.0 200 OK\r\nContent-Type: text/event-stream\r\n\r\n"
    out = replay(
        InbandError(events=1),
        [(0.0, Chunk(UP, request())), (0.5, Chunk(DOWN, head + frame(0) + frame(1)))],
    )
    assert out[1:] == [
        (0.5, Chunk(DOWN, head + frame(0) + VLLM_FRAME + DONE_FRAME)),
        (0.5, Eof(DOWN)),
        (0.5, Eof(UP)),
    ]


def test_content_length_responses_errors_and_unmatched_requests_pass_untouched() -> None:
    sized = (
        b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nContent-Length: %d\r\n\r\n%s"
        % (
            len(frame(0)),
            frame(0),
        )
    )
    error = b"HTTP/1.1 503 Service Unavailable\r\ncontent-length: 0\r\n\r\n"
    fault = InbandError(events=1, match=RequestMatch(path="/v1/chat/completions"))
    out = replay(
        fault,
        [
            (0.0, Chunk(UP, request())),
            (0.5, Chunk(DOWN, sized)),
            (1.0, Chunk(UP, request())),
            (1.5, Chunk(DOWN, error)),
            (2.0, Chunk(UP, request(path="/v1/completions"))),
            (2.5, Chunk(DOWN, sse_response(2))),
        ],
    )
    assert joined(out, DOWN) == sized + error + sse_response(2)
    assert [(r.action, r.details["reason"]) for r in fault.reports] == [
        ("skipped", "content-length")
    ]


def test_fewer_events_than_asked_means_no_injection() -> None:
    fault = InbandError(events=5)
    out = replay(fault, [(0.0, Chunk(UP, request())), (0.5, Chunk(DOWN, sse_response(3)))])
    assert joined(out, DOWN) == sse_response(3) and not fault.fired


@given(
    events=st.integers(0, 4),
    chunk_cuts=st.lists(st.integers(0, 400), max_size=10),
    tcp_cuts=cut_lists,
    then=st.sampled_from(["done", "continue"]),
)
def test_whatever_the_chunking_the_client_reads_the_events_then_the_error(
    events: int, chunk_cuts: list[int], tcp_cuts: list[int], then: Any
) -> None:
    text = b"".join(frame(i) for i in range(4)) + DONE_FRAME
    wire = SSE_HEAD + rechunk(text, chunk_cuts)
    out = replay(InbandError(events=events, then=then), in_segments(wire, tcp_cuts))
    before = b"".join(frame(i) for i in range(events))
    rest = text[len(before) :]
    expected = before + VLLM_FRAME + (DONE_FRAME if then == "done" else rest)
    assert dechunked(joined(out, DOWN)) == [(expected, True)]


@settings(max_examples=25)
@given(seed=st.integers(0, 2**32))
def test_the_same_seed_breaks_the_same_streams(seed: int) -> None:
    assert_deterministic(
        lambda: InbandError(events=1, match=RequestMatch(probability=0.5)),
        exchanges(sse_response(2)),
        seed,
    )


def test_it_loads_from_yaml() -> None:
    scenario = load_scenario_text(
        "name: e\npath:\n  - inband_error: {events: 5, shape: vllm-spaced, code: 503,"
        " then: close, match: {every: 2}}\n",
        REGISTRY,
    )
    assert scenario.build_faults() == [
        InbandError(
            events=5, shape="vllm-spaced", code=503, then="close", match=RequestMatch(every=2)
        )
    ]


@pytest.mark.parametrize(
    ("config", "message"),
    [({"events": -1}, "events"), ({"shape": "grpc"}, "shape"), ({"then": "hang"}, "then")],
)
def test_bad_config_is_refused(config: dict[str, Any], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        InbandError(**config)


def test_a_matched_json_response_is_skipped_not_held_until_its_end() -> None:
    head = (
        b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ntransfer-encoding: chunked\r\n\r\n"
    )
    fault = InbandError(events=1)
    out = replay(
        fault,
        [
            (0.0, Chunk(UP, request())),
            (0.5, Chunk(DOWN, head + encode_chunk(b'{"choices": ['))),
            (1.0, Chunk(DOWN, encode_chunk(b"]}") + LAST_CHUNK_BYTES)),
        ],
    )
    assert out[1:] == [
        (0.5, Chunk(DOWN, head + encode_chunk(b'{"choices": ['))),
        (1.0, Chunk(DOWN, encode_chunk(b"]}") + LAST_CHUNK_BYTES)),
    ]
    assert fault.reports[0].details["reason"] == "not text/event-stream"
