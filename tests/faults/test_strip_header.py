"""strip_header: a CDN drops X-Accel-Buffering from matched responses (or a field from
matched requests); every other byte passes as it came, at the time it came."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from faults._lib.match import RequestMatch
from faults.strip_header import StripHeader
from faults.testing import joined, replay
from middlebox.core.stream import DOWN, UP, Chunk, Eof
from tests.faults.httpprops import (
    SSE_HEAD,
    cut_lists,
    exchanges,
    request,
    resplit,
    sse_chunks,
    sse_response,
    timed,
)
from tests.faults.netprops import assert_deterministic

STRIPPED_HEAD = SSE_HEAD.replace(b"x-accel-buffering: no\r\n", b"")


def test_the_field_is_dropped_from_the_head_and_the_body_passes_at_the_same_times() -> None:
    body = sse_chunks(2)
    fault = StripHeader()
    out = replay(
        fault,
        [
            (0.0, Chunk(UP, request())),
            (0.02, Chunk(DOWN, SSE_HEAD)),
            (2.0, Chunk(DOWN, body[0])),
            (2.05, Chunk(DOWN, body[1])),
            (2.1, Chunk(DOWN, body[2] + body[3])),
            (2.2, Eof(DOWN)),
        ],
    )
    assert out == [
        (0.0, Chunk(UP, request())),
        (0.02, Chunk(DOWN, STRIPPED_HEAD)),
        (2.0, Chunk(DOWN, body[0])),
        (2.05, Chunk(DOWN, body[1])),
        (2.1, Chunk(DOWN, body[2] + body[3])),
        (2.2, Eof(DOWN)),
    ]
    assert [(r.time, r.action, r.details) for r in fault.reports] == [
        (
            0.02,
            "rewrote_head",
            {
                "direction": "response",
                "request": 0,
                "message": 0,
                "offset": 0,
                "stripped": ["x-accel-buffering"],
            },
        )
    ]


def test_a_head_split_across_writes_comes_out_whole_when_its_last_byte_arrives() -> None:
    out = replay(
        StripHeader(),
        [
            (0.0, Chunk(UP, request())),
            (0.5, Chunk(DOWN, SSE_HEAD[:30])),
            (0.75, Chunk(DOWN, SSE_HEAD[30:])),
        ],
    )
    assert out == [(0.0, Chunk(UP, request())), (0.75, Chunk(DOWN, STRIPPED_HEAD))]


def test_only_matched_exchanges_on_a_keep_alive_connection_are_rewritten() -> None:
    fault = StripHeader(match=RequestMatch(path="/v1/chat/completions", requests=[1]))
    first, second, third = sse_response(1), sse_response(1), sse_response(1)
    out = replay(
        fault,
        [
            (0.0, Chunk(UP, request())),
            (0.5, Chunk(DOWN, first)),
            (1.0, Chunk(UP, request(path="/health", method="GET"))),
            (
                1.5,
                Chunk(
                    DOWN, b"HTTP/1.1 200 OK\r\nx-accel-buffering: no\r\ncontent-length: 0\r\n\r\n"
                ),
            ),
            (2.0, Chunk(UP, request())),
            (2.5, Chunk(DOWN, second)),
            (3.0, Chunk(UP, request())),
            (3.5, Chunk(DOWN, third)),
        ],
    )
    assert joined(out, DOWN) == (
        first
        + b"HTTP/1.1 200 OK\r\nx-accel-buffering: no\r\ncontent-length: 0\r\n\r\n"
        + second.replace(b"x-accel-buffering: no\r\n", b"")
        + third
    )
    assert [(r.time, r.details["request"], r.details["message"]) for r in fault.reports] == [
        (2.5, 1, 2)
    ]


def test_a_head_without_the_field_and_an_interim_100_pass_untouched() -> None:
    plain = b"HTTP/1.1 100 Continue\r\nX-Accel-Buffering: no\r\n\r\n" + SSE_HEAD.replace(
        b"x-accel-buffering: no\r\n", b""
    )
    fault = StripHeader()
    out = replay(fault, [(0.0, Chunk(UP, request())), (0.5, Chunk(DOWN, plain))])
    assert out == [(0.0, Chunk(UP, request())), (0.5, Chunk(DOWN, plain))]
    assert not fault.fired


def test_in_the_request_direction_a_model_match_holds_the_request_until_its_body_is_in() -> None:
    req = request(model="Qwen/Qwen3-0.6B").replace(
        b"Host: upstream\r\n", b"Host: upstream\r\nAuthorization: Bearer sk\r\n"
    )
    split = req.index(b"\r\n\r\n") + 4
    fault = StripHeader(
        headers=["Authorization"], direction="request", match=RequestMatch(model="Qwen/*")
    )
    out = replay(fault, [(0.0, Chunk(UP, req[:split])), (0.25, Chunk(UP, req[split:]))])
    assert out == [(0.25, Chunk(UP, req.replace(b"Authorization: Bearer sk\r\n", b"")))]
    assert fault.reports[0].details["stripped"] == ["Authorization"]


def test_requests_of_another_model_pass_as_they_came_once_decided() -> None:
    req = request(model="llama")
    split = req.index(b"\r\n\r\n") + 4
    fault = StripHeader(headers=["Host"], direction="request", match=RequestMatch(model="Qwen/*"))
    out = replay(fault, [(0.0, Chunk(UP, req[:split])), (0.25, Chunk(UP, req[split:]))])
    assert out == [(0.25, Chunk(UP, req))]
    assert not fault.fired


@given(up_cuts=cut_lists, down_cuts=cut_lists)
def test_whatever_the_segmentation_only_the_head_changes(
    up_cuts: list[int], down_cuts: list[int]
) -> None:
    timeline = timed(UP, resplit(request(), up_cuts), 0.0, 0.001) + timed(
        DOWN, resplit(sse_response(3), down_cuts), 1.0, 0.01
    )
    out = replay(StripHeader(), timeline)
    assert joined(out, UP) == request()
    assert joined(out, DOWN) == STRIPPED_HEAD + b"".join(sse_chunks(3))
    times = [t for t, _ in out]
    assert times == sorted(times)


@settings(max_examples=25)
@given(seed=st.integers(0, 2**32))
def test_the_same_seed_strips_the_same_responses(seed: int) -> None:
    timeline = exchanges(sse_response(1))
    assert_deterministic(lambda: StripHeader(match=RequestMatch(probability=0.5)), timeline, seed)


@pytest.mark.parametrize(
    ("config", "message"),
    [
        ({"headers": []}, "at least one"),
        ({"headers": ["X Bad"]}, "HTTP tokens"),
        ({"direction": "sideways"}, "direction"),
    ],
)
def test_bad_config_is_refused(config: dict[str, Any], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        StripHeader(**config)
