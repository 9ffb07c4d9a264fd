"""idle_reaper: nginx's proxy_read_timeout between two upstream reads, per exchange."""

from __future__ import annotations

import itertools

import pytest
from hypothesis import given
from hypothesis import strategies as st

from faults._lib.match import RequestMatch
from faults.idle_reaper import IdleReaper
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
)

PING = b": ping\n\n"


def test_a_silent_upstream_gets_nginx_504_before_headers_and_both_sides_are_closed() -> None:
    fault = IdleReaper(timeout=60.0)
    out = replay(fault, [(0.0, Chunk(UP, REQUEST))])
    assert out == [
        (0.0, Chunk(UP, REQUEST)),
        (60.0, Chunk(DOWN, error_response(504))),
        (60.0, Eof(DOWN)),
        (60.0, Eof(UP)),
    ]
    (report,) = fault.reports
    assert (report.time, report.action, report.details["phase"]) == (
        60.0,
        "timed_out",
        "before_headers",
    )
    assert report.details["byte"] == 0


@pytest.mark.parametrize(
    ("kind", "expected"),
    [
        ("502", [Chunk(DOWN, error_response(502)), Eof(DOWN), Eof(UP)]),
        ("reset", [Reset(DOWN), Reset(UP)]),
    ],
)
def test_the_answer_before_headers_can_be_502_or_a_reset(kind: str, expected: list[object]) -> None:
    out = replay(IdleReaper(timeout=5.0, before_headers=kind), [(1.0, Chunk(UP, REQUEST))])  # type: ignore[arg-type]
    assert [item for t, item in out if t == 6.0] == expected


def test_after_headers_it_closes_without_the_terminal_chunk() -> None:
    first = chunked(event("Hi"))[0]
    fault = IdleReaper(timeout=10.0)
    out = replay(
        fault, [(0.0, Chunk(UP, REQUEST)), (1.0, Chunk(DOWN, SSE_HEAD)), (2.0, Chunk(DOWN, first))]
    )
    assert out[1:] == [
        (1.0, Chunk(DOWN, SSE_HEAD)),
        (2.0, Chunk(DOWN, first)),
        (12.0, Eof(DOWN)),
        (12.0, Eof(UP)),
    ]
    assert not down_bytes(out).endswith(LAST_CHUNK_BYTES)
    details = fault.reports[0].details
    assert (details["phase"], details["end"], details["byte"], details["idle_since"]) == (
        "after_headers",
        "close",
        len(SSE_HEAD) + len(first),
        2.0,
    )
    assert details["body_byte"] == len(event("Hi"))


def test_after_headers_it_can_reset_both_sides() -> None:
    out = replay(
        IdleReaper(timeout=10.0, after_headers="reset"),
        [(0.0, Chunk(UP, REQUEST)), (1.0, Chunk(DOWN, SSE_HEAD))],
    )
    assert ends(out) == [(11.0, Reset(DOWN)), (11.0, Reset(UP))]


def test_heartbeat_comments_rearm_the_timer_so_a_slow_stream_survives() -> None:
    writes = [(0.0, Chunk(UP, REQUEST)), (1.0, Chunk(DOWN, SSE_HEAD))]
    writes += [(1.0 + 50.0 * k, Chunk(DOWN, chunked(PING)[0])) for k in range(1, 5)]
    fault = IdleReaper(timeout=60.0)
    out = replay(fault, writes)
    assert ends(out) == [(261.0, Eof(DOWN)), (261.0, Eof(UP))]
    assert fault.reports[0].details["idle_since"] == 201.0


def test_a_complete_response_disarms_it_and_the_next_request_rearms_it() -> None:
    first = b"".join(sse_response("a"))
    fault = IdleReaper(timeout=30.0)
    out = replay(
        fault,
        [
            (0.0, Chunk(UP, REQUEST)),
            (1.0, Chunk(DOWN, first)),
            (100.0, Chunk(UP, REQUEST)),
        ],
    )
    assert out[-3:] == [
        (130.0, Chunk(DOWN, error_response(504))),
        (130.0, Eof(DOWN)),
        (130.0, Eof(UP)),
    ]
    assert fault.reports[0].details["response"] == 1


def test_the_timer_starts_only_when_the_request_is_complete() -> None:
    head, body = REQUEST.split(b"\r\n\r\n", 1)
    out = replay(
        IdleReaper(timeout=10.0),
        [(0.0, Chunk(UP, head + b"\r\n\r\n")), (25.0, Chunk(UP, body))],
    )
    assert ends(out) == [(35.0, Eof(DOWN)), (35.0, Eof(UP))]


def test_requests_the_match_does_not_select_are_never_timed() -> None:
    fault = IdleReaper(timeout=1.0, match=RequestMatch(path="/v1/completions"))
    out = replay(fault, [(0.0, Chunk(UP, request("/v1/chat/completions")))], until=100.0)
    assert out == [(0.0, Chunk(UP, request("/v1/chat/completions")))]
    assert not fault.fired


def test_after_it_fired_nothing_more_goes_through_either_way() -> None:
    out = replay(
        IdleReaper(timeout=1.0),
        [(0.0, Chunk(UP, REQUEST)), (5.0, Chunk(DOWN, SSE_HEAD)), (6.0, Eof(UP)), (7.0, Eof(DOWN))],
    )
    assert [t for t, _ in out] == [0.0, 1.0, 1.0, 1.0]


def test_the_client_leaving_disarms_it() -> None:
    out = replay(IdleReaper(timeout=1.0), [(0.0, Chunk(UP, REQUEST)), (0.5, Eof(UP))], until=10.0)
    assert out == [(0.0, Chunk(UP, REQUEST)), (0.5, Eof(UP))]


@pytest.mark.parametrize(
    ("config", "message"),
    [
        ({"timeout": 0.0}, "timeout must be > 0"),
        ({"before_headers": "503"}, "before_headers must be one of"),
        ({"after_headers": "fin"}, "after_headers must be one of"),
    ],
)
def test_bad_config_is_refused_with_a_clear_message(
    config: dict[str, object], message: str
) -> None:
    with pytest.raises(ValueError, match=message):
        IdleReaper(**config)  # type: ignore[arg-type]


@given(st.lists(st.integers(0, 20), min_size=1, max_size=8), st.integers(1, 15))
def test_it_fires_exactly_when_a_gap_between_bytes_first_exceeds_the_timeout(
    gaps: list[int], whole: int
) -> None:
    timeout = whole + 0.5  # never equal to a gap, so the expectation has no tie
    writes = [SSE_HEAD, *chunked(*(event(str(i)) for i in range(len(gaps) - 1)))]
    timeline: list[TimedItem] = [(0.0, Chunk(UP, REQUEST))]
    now = 0.0
    for gap, data in zip(gaps, writes, strict=True):
        now += gap
        timeline.append((now, Chunk(DOWN, data)))
    fault = IdleReaper(timeout=timeout)
    out = replay(fault, timeline)
    times = [t for t, _ in timeline]
    expected = next(
        (a + timeout for a, b in itertools.pairwise(times) if b - a > timeout),
        times[-1] + timeout,
    )
    (report,) = fault.reports
    assert report.time == expected
    # What arrived before it fired went through unchanged and in order, then the end.
    sent = b"".join(w for (t, _), w in zip(timeline[1:], writes, strict=True) if t < expected)
    assert down_bytes(out) == (sent or error_response(504))
    assert report.details["phase"] == ("after_headers" if sent else "before_headers")


@given(st.integers(0, 2**32))
def test_the_same_seed_gives_the_same_decisions(seed: int) -> None:
    def run() -> list[TimedItem]:
        fault = IdleReaper(timeout=2.0, match=RequestMatch(probability=0.5))
        return replay(fault, [(0.0, Chunk(UP, REQUEST))], seed=seed, until=10.0)

    assert run() == run()


def test_its_close_after_headers_is_a_hop_close_not_the_upstreams_end() -> None:
    out = replay(
        IdleReaper(timeout=10.0), [(0.0, Chunk(UP, REQUEST)), (1.0, Chunk(DOWN, SSE_HEAD))]
    )
    assert [(t, type(i).__name__, i.direction) for t, i in ends(out)] == [
        (11.0, "HopClose", DOWN),
        (11.0, "Eof", UP),
    ]


def test_finish_ends_a_started_response_with_a_clean_terminal_chunk_as_caddy_does() -> None:
    first = chunked(event("Hi"))[0]
    fault = IdleReaper(timeout=10.0, after_headers="finish")
    out = replay(
        fault, [(0.0, Chunk(UP, REQUEST)), (1.0, Chunk(DOWN, SSE_HEAD)), (2.0, Chunk(DOWN, first))]
    )
    assert out[3:] == [(12.0, Chunk(DOWN, LAST_CHUNK_BYTES)), (12.0, Eof(DOWN)), (12.0, Eof(UP))]
    assert b"[DONE]" not in down_bytes(out)
    assert fault.reports[0].details["end"] == "finish"


def test_finish_mid_chunk_can_only_close() -> None:
    first = chunked(event("Hi"))[0]
    fault = IdleReaper(timeout=10.0, after_headers="finish")
    out = replay(
        fault,
        [(0.0, Chunk(UP, REQUEST)), (1.0, Chunk(DOWN, SSE_HEAD)), (2.0, Chunk(DOWN, first[:7]))],
    )
    assert out[3:] == [(12.0, Eof(DOWN)), (12.0, Eof(UP))]
    assert fault.reports[0].details["end"] == "close"


def test_a_lazy_timer_moves_only_when_a_read_moves_it_by_the_lazy_delay_as_nginx() -> None:
    # nginx's ngx_event_add_timer keeps an armed timer whose new expiry is within
    # NGX_TIMER_LAZY_DELAY (300 ms): the head at 0.0 arms it; frames every 20 ms for 200 ms
    # do not move it, so a 1 s timeout fires at 1.0 s, not 1.2 s after the last frame
    frames = chunked(*(event(str(k)) for k in range(10)))
    writes = [(0.0, Chunk(UP, REQUEST)), (0.0, Chunk(DOWN, SSE_HEAD))]
    writes += [(0.02 * (k + 1), Chunk(DOWN, frame)) for k, frame in enumerate(frames)]
    lazy = IdleReaper(timeout=1.0, lazy=0.3)
    assert ends(replay(lazy, writes))[0] == (1.0, Eof(DOWN))
    assert lazy.reports[0].details["idle_since"] == 0.0
    eager = IdleReaper(timeout=1.0)  # every read re-arms it
    assert ends(replay(eager, writes))[0] == (pytest.approx(1.2), Eof(DOWN))
    # a read 300 ms or more after the timer's last move moves it
    later = [*writes, (0.35, Chunk(DOWN, chunked(PING)[0]))]
    assert ends(replay(IdleReaper(timeout=1.0, lazy=0.3), later))[0] == (
        pytest.approx(1.35),
        Eof(DOWN),
    )


def test_a_negative_lazy_delay_is_refused() -> None:
    with pytest.raises(ValueError, match="lazy must be"):
        IdleReaper(lazy=-0.1)


def test_apaches_page_answers_a_timeout_before_the_head_as_apache_does() -> None:
    # the real Apache 2.4 answered make calibrate's timeout-before-head with this page
    out = replay(
        IdleReaper(timeout=1.0, before_headers="502", page="apache"),
        [(0.0, Chunk(UP, REQUEST))],
    )
    answer = down_bytes(out)
    head, _, body = answer.partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 502 Proxy Error\r\n")
    assert b"Content-Type: text/html; charset=iso-8859-1" in head
    assert f"Content-Length: {len(body)}".encode() in head and len(body) == 381
    assert b"<title>502 Proxy Error</title>" in body and b"Error reading from remote" in body
    assert ends(out) == [(1.0, Eof(DOWN)), (1.0, Eof(UP))]
    with pytest.raises(ValueError, match="before_headers must be 502"):
        IdleReaper(before_headers="504", page="apache")
    with pytest.raises(ValueError, match="page must be one of"):
        IdleReaper(page="caddy")  # type: ignore[arg-type]
