"""max_duration: a hard cap on each response, counted from its request's start."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from faults._lib.match import RequestMatch
from faults.max_duration import MaxDuration
from faults.testing import TimedItem, replay
from middlebox.core.http1 import LAST_CHUNK_BYTES
from middlebox.core.responses import error_response
from middlebox.core.stream import DOWN, UP, Chunk, Eof, Reset
from tests.faults.httpstreams import (
    REQUEST,
    SSE_HEAD,
    chunked,
    down_bytes,
    ends,
    event,
    request,
    sse_response,
    timeline,
)

# A stream that never stops on its own: a token every second for a minute.
FOREVER = [SSE_HEAD, *chunked(*(event(f"t{i}") for i in range(60)))]


def test_a_busy_stream_is_cut_at_the_limit_without_the_terminal_chunk() -> None:
    fault = MaxDuration(limit=29.0)
    out = replay(fault, timeline(FOREVER, step=1.0))
    assert [t for t, _ in out if _.direction is DOWN][-1] == 29.0
    # The writes at 1 s ... 28 s; the one due at 29 s comes after the limit fired.
    assert down_bytes(out) == b"".join(FOREVER[:28])
    assert ends(out) == [(29.0, Eof(DOWN)), (29.0, Eof(UP))]
    (report,) = fault.reports
    assert (report.time, report.action, report.details["end"]) == (
        29.0,
        "limit_reached",
        "truncated_chunked",
    )
    assert report.details["byte"] == len(b"".join(FOREVER[:28]))


def test_fin_completes_the_http_message_so_only_done_is_missing() -> None:
    out = replay(MaxDuration(limit=3.5, end="fin"), timeline(FOREVER))
    assert down_bytes(out) == b"".join(FOREVER[:3]) + LAST_CHUNK_BYTES
    assert ends(out) == [(3.5, Eof(DOWN)), (3.5, Eof(UP))]


def test_fin_mid_chunk_cannot_complete_the_message_and_says_so() -> None:
    half = FOREVER[1][:10]
    fault = MaxDuration(limit=5.0, end="fin")
    out = replay(fault, [(0.0, Chunk(UP, REQUEST)), (1.0, Chunk(DOWN, SSE_HEAD + half))])
    assert down_bytes(out) == SSE_HEAD + half
    assert fault.reports[0].details["end"] == "truncated_chunked"


def test_rst_resets_both_sides() -> None:
    out = replay(MaxDuration(limit=2.5, end="rst"), timeline(FOREVER))
    assert ends(out) == [(2.5, Reset(DOWN)), (2.5, Reset(UP))]


def test_before_any_response_byte_the_client_gets_a_504_like_api_gateway() -> None:
    fault = MaxDuration(limit=29.0)
    out = replay(fault, [(1.0, Chunk(UP, REQUEST))])
    assert out[1:] == [
        (30.0, Chunk(DOWN, error_response(504))),
        (30.0, Eof(DOWN)),
        (30.0, Eof(UP)),
    ]
    assert fault.reports[0].details["phase"] == "before_headers"


def test_a_response_that_completes_in_time_disarms_it_and_each_exchange_has_its_own_clock() -> None:
    whole = b"".join(sse_response("a", "b"))
    fault = MaxDuration(limit=10.0)
    out = replay(
        fault,
        [
            (0.0, Chunk(UP, REQUEST)),
            (9.0, Chunk(DOWN, whole)),
            (15.0, Chunk(UP, REQUEST)),
            (16.0, Chunk(DOWN, SSE_HEAD)),
        ],
    )
    assert ends(out) == [(25.0, Eof(DOWN)), (25.0, Eof(UP))]
    assert fault.reports[0].details["response"] == 1


def test_requests_the_match_does_not_select_are_not_capped() -> None:
    fault = MaxDuration(limit=1.0, match=RequestMatch(path="/v1/completions"))
    out = replay(fault, timeline(FOREVER[:5], request_bytes=request("/v1/chat/completions")))
    assert ends(out) == []
    assert not fault.fired


@pytest.mark.parametrize(
    ("config", "message"),
    [
        ({"limit": 0.0}, "limit must be > 0"),
        ({"end": "hang"}, "end must be one of"),
        ({"before_headers": "500"}, "before_headers must be one of"),
    ],
)
def test_bad_config_is_refused_with_a_clear_message(
    config: dict[str, object], message: str
) -> None:
    with pytest.raises(ValueError, match=message):
        MaxDuration(**config)  # type: ignore[arg-type]


@given(st.integers(1, 40), st.sampled_from(["truncated_chunked", "fin", "rst"]))
def test_whatever_arrived_before_the_limit_went_through_unchanged_and_nothing_after(
    limit_tenths: int, end: str
) -> None:
    limit = limit_tenths / 10 + 0.05  # never on a write time
    out = replay(MaxDuration(limit=limit, end=end), timeline(FOREVER, step=0.25))  # type: ignore[arg-type]
    before = [w for i, w in enumerate(FOREVER) if 0.25 * (i + 1) < limit]
    data = down_bytes(out)
    if before:
        assert data.removesuffix(LAST_CHUNK_BYTES) == b"".join(before)
    else:
        assert data == error_response(504)
    assert all(t <= limit for t, _ in out)


@given(st.integers(0, 2**32))
def test_the_same_seed_gives_the_same_decisions(seed: int) -> None:
    def run() -> list[TimedItem]:
        fault = MaxDuration(limit=2.0, match=RequestMatch(probability=0.5))
        return replay(fault, timeline(FOREVER[:10]), seed=seed)

    assert run() == run()
