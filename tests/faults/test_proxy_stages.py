"""The proxy's own nginx behaviour as pure stages, on the virtual clock with exact times:
client_header_timeout, proxy_read_timeout (idle_reaper with the proxy's ends) and the
answer when the upstream cannot be reached."""

from __future__ import annotations

import pytest

from faults._proxy.client_header_timeout import ClientHeaderTimeout
from faults._proxy.proxy_read_timeout import ProxyReadTimeout
from faults._proxy.upstream_unreachable import (
    NGINX_MAX_HEAD,
    TOO_LARGE_PAGE,
    UpstreamUnreachable,
)
from faults.idle_reaper import IdleReaper
from faults.testing import replay
from middlebox.core.responses import error_response
from middlebox.core.stream import DOWN, UP, Chunk, Eof, Reset
from tests.faults.httpstreams import REQUEST, SSE_HEAD, chunked, event

HEAD = b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Length: 2\r\n\r\n"

# ------------------------------------------------------------ client_header_timeout


def test_a_head_not_in_by_the_timeout_is_closed_unanswered_both_ways() -> None:
    stage = ClientHeaderTimeout(timeout=60.0)
    out = replay(stage, [(1.0, Chunk(UP, b"POST / HTTP/1.1\r\n"))])
    assert out == [(1.0, Chunk(UP, b"POST / HTTP/1.1\r\n")), (60.0, Eof(DOWN)), (60.0, Eof(UP))]
    assert stage.connection_closed and not stage.finished
    (report,) = stage.reports
    assert (report.time, report.action, report.details["byte"]) == (60.0, "closed", 17)


def test_a_drip_of_header_bytes_does_not_re_arm_the_timer() -> None:
    drip = [(t, Chunk(UP, b"X-Slow: 1\r\n")) for t in (10.0, 20.0, 30.0)]
    out = replay(ClientHeaderTimeout(timeout=30.5), drip)
    assert [(t, item) for t, item in out if not isinstance(item, Chunk)] == [
        (30.5, Eof(DOWN)),
        (30.5, Eof(UP)),
    ]


@pytest.mark.parametrize(
    "parts",
    [
        [b"GET / HTTP/1.1\r", b"\nHost: x\r\n", b"\r", b"\n"],  # the blank line split up
        [b"GET / HTTP/1.0\n", b"\n"],  # bare LF line ends, as nginx accepts them
    ],
)
def test_a_complete_head_ends_the_watch_and_the_stage_steps_aside(parts: list[bytes]) -> None:
    stage = ClientHeaderTimeout(timeout=5.0)
    timeline = [(float(i), Chunk(UP, part)) for i, part in enumerate(parts)]
    out = replay(stage, timeline, until=1000.0)
    assert out == timeline  # everything passed, nothing was added, no deadline fired
    assert stage.finished and stage.deadline() is None and not stage.reports


def test_upstream_bytes_never_complete_the_client_s_head() -> None:
    stage = ClientHeaderTimeout(timeout=5.0)
    out = replay(stage, [(1.0, Chunk(DOWN, b"HTTP/1.1 200 OK\r\n\r\n"))])
    assert out[-2:] == [(5.0, Eof(DOWN)), (5.0, Eof(UP))]


def test_a_client_that_leaves_first_is_not_timed() -> None:
    stage = ClientHeaderTimeout(timeout=5.0)
    out = replay(stage, [(1.0, Chunk(UP, b"GET")), (2.0, Eof(UP))], until=100.0)
    assert out == [(1.0, Chunk(UP, b"GET")), (2.0, Eof(UP))]
    assert stage.finished


@pytest.mark.parametrize("direction", [UP, DOWN])
def test_an_rst_either_way_ends_the_watch_so_the_connection_can_end(direction: object) -> None:
    stage = ClientHeaderTimeout(timeout=5.0)
    out = replay(stage, [(1.0, Chunk(UP, b"RST please")), (2.0, Reset(direction))], until=100.0)  # type: ignore[arg-type]
    assert out == [(1.0, Chunk(UP, b"RST please")), (2.0, Reset(direction))]  # type: ignore[arg-type]
    assert stage.deadline() is None and stage.finished


def test_after_the_close_nothing_more_goes_anywhere() -> None:
    out = replay(ClientHeaderTimeout(timeout=1.0), [(2.0, Chunk(UP, b"late")), (3.0, Eof(DOWN))])
    assert out == [(1.0, Eof(DOWN)), (1.0, Eof(UP))]


# --------------------------------------------------------------- proxy_read_timeout


def test_the_proxy_read_timeout_is_the_idle_reaper_fault() -> None:
    assert issubclass(ProxyReadTimeout, IdleReaper)
    assert ProxyReadTimeout(timeout=3.0).timeout == 3.0


def test_a_silent_upstream_gets_504_an_rst_upstream_and_the_client_lingers_until_it_closes() -> (
    None
):
    stage = ProxyReadTimeout(timeout=30.0)
    out = replay(stage, [(0.0, Chunk(UP, REQUEST)), (31.0, Eof(UP))])
    assert out == [
        (0.0, Chunk(UP, REQUEST)),
        (30.0, Chunk(DOWN, error_response(504))),
        (30.0, Eof(DOWN)),
        (30.0, Reset(UP)),  # a hung upstream cannot hold the connection open
    ]
    assert stage.connection_closed and stage.deadline() is None
    assert stage.reports[0].details["phase"] == "before_headers"


def test_a_client_that_never_closes_after_the_504_is_closed_at_the_end_of_the_linger() -> None:
    stage = ProxyReadTimeout(timeout=30.0, linger=5.0)
    replay(stage, [(0.0, Chunk(UP, REQUEST))], until=34.9)
    assert not stage.connection_closed and stage.deadline() == 35.0
    assert stage.on_deadline(35.0) == []
    assert stage.connection_closed and stage.deadline() is None


def test_mid_response_the_read_timeout_closes_both_sides_at_once() -> None:
    head, *chunks = [SSE_HEAD, *chunked(event("a"))]
    stage = ProxyReadTimeout(timeout=10.0)
    out = replay(
        stage,
        [(0.0, Chunk(UP, REQUEST)), (1.0, Chunk(DOWN, head)), (2.0, Chunk(DOWN, chunks[0]))],
    )
    assert out[-2:] == [(12.0, Eof(DOWN)), (12.0, Eof(UP))]  # no last chunk: a truncation
    assert stage.connection_closed


def test_each_upstream_byte_re_arms_the_read_timeout() -> None:
    stage = ProxyReadTimeout(timeout=10.0)
    replay(stage, [(0.0, Chunk(UP, REQUEST)), (1.0, Chunk(DOWN, SSE_HEAD))], until=10.5)
    assert stage.deadline() == 11.0 and not stage.reports


def test_a_complete_response_leaves_an_idle_keep_alive_connection_alone() -> None:
    response = b"HTTP/1.1 200 OK\r\nContent-Length: 5\r\n\r\nhello"
    stage = ProxyReadTimeout(timeout=1.0)
    out = replay(stage, [(0.0, Chunk(UP, REQUEST)), (0.5, Chunk(DOWN, response))], until=100.0)
    assert [item for _, item in out] == [Chunk(UP, REQUEST), Chunk(DOWN, response)]
    assert stage.deadline() is None and not stage.connection_closed


# ------------------------------------------------------------- upstream_unreachable


def test_a_complete_head_gets_nginx_s_502_and_a_close() -> None:
    stage = UpstreamUnreachable()
    out = replay(stage, [(0.0, Chunk(UP, HEAD[:20])), (0.5, Chunk(UP, HEAD[20:] + b"{}"))])
    assert out == [(0.5, Chunk(DOWN, error_response(502))), (0.5, Eof(DOWN))]
    assert stage.connection_closed and stage.reports[0].details["answer"] == "502"


def test_a_malformed_head_gets_400() -> None:
    out = replay(UpstreamUnreachable(), [(0.0, Chunk(UP, b"GARBAGE\x00 / HTTP/1.1\r\n\r\n"))])
    assert out == [(0.0, Chunk(DOWN, error_response(400))), (0.0, Eof(DOWN))]


def test_an_oversized_head_gets_400_too_large_once_nginx_s_buffers_are_full() -> None:
    cookie = b"GET / HTTP/1.1\r\nCookie: " + b"c" * NGINX_MAX_HEAD
    out = replay(UpstreamUnreachable(), [(0.0, Chunk(UP, cookie[:1000])), (1.0, Chunk(UP, cookie))])
    assert out == [(1.0, Chunk(DOWN, error_response(400, TOO_LARGE_PAGE))), (1.0, Eof(DOWN))]


def test_a_head_that_never_completes_is_closed_unanswered_at_the_header_timeout() -> None:
    out = replay(UpstreamUnreachable(header_timeout=2.0), [(0.0, Chunk(UP, b"GET / HTTP/1.1\r\n"))])
    assert out == [(2.0, Eof(DOWN))]


def test_a_client_that_leaves_mid_head_gets_a_close() -> None:
    out = replay(UpstreamUnreachable(), [(0.0, Chunk(UP, b"GET / HT")), (0.1, Eof(UP))])
    assert out == [(0.1, Eof(DOWN))]


@pytest.mark.parametrize(("answer", "end"), [("reset", Reset(DOWN)), ("close", Eof(DOWN))])
def test_reset_and_close_answer_at_once_without_reading(answer: str, end: object) -> None:
    stage = UpstreamUnreachable(answer=answer)  # type: ignore[arg-type]
    assert replay(stage, [(1.0, Chunk(UP, HEAD))]) == [(0.0, end)]
    assert stage.connection_closed


def test_a_bad_answer_is_refused_by_name() -> None:
    with pytest.raises(ValueError, match="answer"):
        UpstreamUnreachable(answer="503")  # type: ignore[arg-type]


def test_a_head_response_has_no_body_whatever_its_length_says_so_nothing_is_timed_after_it() -> (
    None
):
    stage = ProxyReadTimeout(timeout=1.0)
    head_request = b"HEAD / HTTP/1.1\r\nHost: x\r\n\r\n"
    response = b"HTTP/1.1 200 OK\r\nContent-Length: 99\r\n\r\n"
    replay(stage, [(0.0, Chunk(UP, head_request)), (0.5, Chunk(DOWN, response))], until=100.0)
    assert stage.deadline() is None and not stage.reports


def test_traffic_that_is_not_http_is_not_timed_by_the_read_timeout() -> None:
    """The read timeout times HTTP exchanges (requests that end, responses that start), as
    idle_reaper does; the shell's old watch also timed silence after any non-HTTP bytes."""
    stage = ProxyReadTimeout(timeout=1.0)
    replay(stage, [(0.0, Chunk(UP, b"SSH-2.0-OpenSSH_9.6\r\n\r\n"))], until=100.0)
    assert stage.deadline() is None and not stage.reports
