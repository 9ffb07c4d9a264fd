"""set_header: a gateway adds `X-Accel-Buffering: no` (or overrides any field) on matched
heads; every other byte passes as it came, at the time it came."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from faults import REGISTRY
from faults._lib.match import RequestMatch
from faults.set_header import SetHeader
from faults.testing import joined, replay
from middlebox.core.stream import DOWN, UP, Chunk, Eof
from middlebox.scenario.load import load_scenario_text
from tests.faults.httpprops import (
    SSE_HEAD,
    cut_lists,
    exchanges,
    request,
    resplit,
    sse_chunks,
    timed,
)
from tests.faults.netprops import assert_deterministic

BARE_HEAD = SSE_HEAD.replace(b"x-accel-buffering: no\r\n", b"")


def test_a_missing_field_is_appended_and_the_body_passes_at_the_same_times() -> None:
    body = sse_chunks(1)
    fault = SetHeader()
    out = replay(
        fault,
        [
            (0.0, Chunk(UP, request())),
            (0.02, Chunk(DOWN, BARE_HEAD)),
            (2.0, Chunk(DOWN, body[0])),
            (2.5, Chunk(DOWN, body[1] + body[2])),
            (2.5, Eof(DOWN)),
        ],
    )
    assert out == [
        (0.0, Chunk(UP, request())),
        (0.02, Chunk(DOWN, BARE_HEAD[:-2] + b"X-Accel-Buffering: no\r\n\r\n")),
        (2.0, Chunk(DOWN, body[0])),
        (2.5, Chunk(DOWN, body[1] + body[2])),
        (2.5, Eof(DOWN)),
    ]
    assert [(r.time, r.action, r.details["set"], r.details["offset"]) for r in fault.reports] == [
        (0.02, "rewrote_head", {"X-Accel-Buffering": "no"}, 0)
    ]


def test_a_present_field_is_replaced_in_place_and_its_repeats_dropped() -> None:
    head = (
        b"HTTP/1.1 200 OK\r\nCache-Control: no-store\r\nA: 1\r\ncache-control: x\r\n"
        b"Content-Length: 0\r\n\r\n"
    )
    out = replay(
        SetHeader(headers={"Cache-Control": "no-cache"}),
        [(0.0, Chunk(UP, request())), (1.0, Chunk(DOWN, head))],
    )
    assert out[1] == (
        1.0,
        Chunk(
            DOWN, b"HTTP/1.1 200 OK\r\nCache-Control: no-cache\r\nA: 1\r\nContent-Length: 0\r\n\r\n"
        ),
    )


def test_a_head_that_already_has_the_value_passes_byte_exact_and_nothing_is_reported() -> None:
    fault = SetHeader(headers={"X-Accel-Buffering": "no"})
    out = replay(fault, [(0.0, Chunk(UP, request())), (1.0, Chunk(DOWN, SSE_HEAD))])
    assert out[1] == (1.0, Chunk(DOWN, SSE_HEAD))
    assert not fault.fired


def test_in_the_request_direction_the_field_is_set_on_the_matched_second_request_only() -> None:
    fault = SetHeader(
        headers={"X-Request-Id": "resume-1"}, direction="request", match=RequestMatch(requests=[1])
    )
    out = replay(
        fault,
        [
            (0.0, Chunk(UP, request())),
            (0.5, Chunk(DOWN, b"HTTP/1.1 204 No Content\r\n\r\n")),
            (1.0, Chunk(UP, request())),
        ],
    )
    assert out == [
        (0.0, Chunk(UP, request())),
        (0.5, Chunk(DOWN, b"HTTP/1.1 204 No Content\r\n\r\n")),
        (
            1.0,
            Chunk(UP, request().replace(b"\r\n\r\n", b"\r\nX-Request-Id: resume-1\r\n\r\n", 1)),
        ),
    ]
    assert [(r.details["request"], r.details["message"]) for r in fault.reports] == [(1, 1)]


@given(up_cuts=cut_lists, down_cuts=cut_lists)
def test_whatever_the_segmentation_only_the_head_changes(
    up_cuts: list[int], down_cuts: list[int]
) -> None:
    response = BARE_HEAD + b"".join(sse_chunks(3))
    timeline = timed(UP, resplit(request(), up_cuts), 0.0, 0.001) + timed(
        DOWN, resplit(response, down_cuts), 1.0, 0.01
    )
    out = replay(SetHeader(), timeline)
    assert joined(out, UP) == request()
    assert joined(out, DOWN) == (
        BARE_HEAD[:-2] + b"X-Accel-Buffering: no\r\n\r\n" + b"".join(sse_chunks(3))
    )


@settings(max_examples=25)
@given(seed=st.integers(0, 2**32))
def test_the_same_seed_sets_the_field_on_the_same_responses(seed: int) -> None:
    timeline = exchanges(BARE_HEAD)
    assert_deterministic(lambda: SetHeader(match=RequestMatch(probability=0.5)), timeline, seed)


@pytest.mark.parametrize(
    ("config", "message"),
    [
        ({"headers": {}}, "at least one"),
        ({"headers": {"Bad Name": "x"}}, "HTTP tokens"),
        ({"headers": {"X-A": "a\r\nInjected: 1"}}, "control"),
        ({"direction": "both"}, "direction"),
    ],
)
def test_bad_config_is_refused(config: dict[str, Any], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        SetHeader(**config)


def test_an_unquoted_yaml_no_is_sent_as_the_word_no() -> None:
    scenario = load_scenario_text(
        "name: s\npath:\n  - set_header: {headers: {X-Accel-Buffering: no, X-Max: 5}}\n",
        REGISTRY,
    )
    (fault,) = scenario.build_faults()
    out = replay(fault, [(0.0, Chunk(UP, request())), (1.0, Chunk(DOWN, BARE_HEAD))])
    assert joined(out, DOWN) == BARE_HEAD[:-2] + b"X-Accel-Buffering: no\r\nX-Max: 5\r\n\r\n"


def test_a_keep_alive_connection_of_many_requests_keeps_a_bounded_decision_record() -> None:
    """1,000 requests on one connection, each answered: every response head rewritten, the
    fault's reports capped at REPORTS_KEPT and counted past it, and its per-request decisions
    kept for the last DECISIONS_KEPT requests only (one per request grew for the
    connection's life)."""
    from faults._lib.match import DECISIONS_KEPT
    from middlebox.core.fault import REPORTS_KEPT

    response = BARE_HEAD.replace(b"transfer-encoding: chunked", b"content-length: 0")
    assert response != BARE_HEAD
    timeline = []
    for index in range(1000):
        timeline += [(index * 1.0, Chunk(UP, request())), (index + 0.5, Chunk(DOWN, response))]
    fault = SetHeader()
    out = replay(fault, timeline)
    rewritten = response[:-2] + b"X-Accel-Buffering: no\r\n\r\n"
    assert [item.data for _, item in out if item.direction is DOWN] == [rewritten] * 1000
    assert len(fault._decisions) <= DECISIONS_KEPT
    assert len(fault.reports) == REPORTS_KEPT
    assert fault.reports_more == {"rewrote_head": 1000 - REPORTS_KEPT}
