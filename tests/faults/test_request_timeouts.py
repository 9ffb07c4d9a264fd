"""nginx's per-request client timeouts as a pure stage, on the virtual clock with exact
times: client_header_timeout for every head of a kept-alive connection,
keepalive_timeout between requests, client_body_timeout between body reads (408)."""

from __future__ import annotations

from faults._proxy.request_timeouts import RequestTimeouts, request_timeout_answer
from faults.testing import TimedItem, replay
from middlebox.compose import PROXY_STAGES
from middlebox.core.stream import DOWN, UP, Chunk, Eof
from middlebox.scenario.model import ProxyOptions

GET = b"GET /v1/models HTTP/1.1\r\nHost: x\r\n\r\n"
OK = b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok"
POST_HEAD = b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Length: 10\r\n\r\n"


def ends(out: list[TimedItem]) -> list[TimedItem]:
    return [(t, item) for t, item in out if not isinstance(item, Chunk)]


def test_a_slow_second_head_on_a_kept_alive_connection_is_closed_at_its_header_timeout() -> None:
    stage = RequestTimeouts(header_timeout=10.0, keepalive_timeout=75.0, body_timeout=60.0)
    out = replay(
        stage,
        [
            (1.0, Chunk(UP, GET)),
            (2.0, Chunk(DOWN, OK)),
            (30.0, Chunk(UP, b"GET / HTTP/1.1\r\n")),  # the second head begins at 30 s ...
        ],
    )
    # ... and is timed from its first byte: closed unanswered at 40 s, a FIN both ways
    assert ends(out) == [(40.0, Eof(DOWN)), (40.0, Eof(UP))]
    (report,) = stage.reports
    assert (report.time, report.details["timer"]) == (40.0, "client_header_timeout")


def test_the_first_head_is_timed_from_the_accept() -> None:
    stage = RequestTimeouts(header_timeout=60.0, keepalive_timeout=None, body_timeout=None)
    out = replay(stage, [(59.0, Chunk(UP, b"GET / HTTP/1.1\r\n"))])
    assert ends(out) == [(60.0, Eof(DOWN)), (60.0, Eof(UP))]


def test_an_idle_kept_alive_connection_is_closed_at_keepalive_timeout_after_the_response() -> None:
    stage = RequestTimeouts(header_timeout=60.0, keepalive_timeout=75.0, body_timeout=60.0)
    out = replay(stage, [(1.0, Chunk(UP, GET)), (3.5, Chunk(DOWN, OK))])
    assert ends(out) == [(78.5, Eof(DOWN)), (78.5, Eof(UP))]
    assert stage.reports[0].details["timer"] == "keepalive_timeout"


def test_a_long_response_is_not_idle_time() -> None:
    # the response's head at 2 s, its body at 200 s: keep-alive idles only after it
    body_head = b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\n"
    stage = RequestTimeouts(header_timeout=60.0, keepalive_timeout=75.0, body_timeout=60.0)
    out = replay(
        stage, [(1.0, Chunk(UP, GET)), (2.0, Chunk(DOWN, body_head)), (200.0, Chunk(DOWN, b"ok"))]
    )
    assert ends(out) == [(275.0, Eof(DOWN)), (275.0, Eof(UP))]


def test_a_body_gap_over_client_body_timeout_gets_nginx_s_408_and_a_close() -> None:
    stage = RequestTimeouts(header_timeout=60.0, keepalive_timeout=75.0, body_timeout=60.0)
    out = replay(
        stage,
        [(1.0, Chunk(UP, POST_HEAD)), (31.0, Chunk(UP, b'{"a"'))],  # 4 of 10 bytes
    )
    # re-armed by the read at 31 s: due at 91 s
    assert out[-3:] == [
        (91.0, Chunk(DOWN, request_timeout_answer())),
        (91.0, Eof(DOWN)),
        (91.0, Eof(UP)),
    ]
    answer = request_timeout_answer()
    assert answer.startswith(b"HTTP/1.1 408 Request Time-out\r\n")
    assert b"Connection: close\r\n" in answer and b"<title>408 Request Time-out</title>" in answer
    (report,) = stage.reports
    assert (report.details["timer"], report.details["status"]) == ("client_body_timeout", 408)


def test_a_drip_of_body_bytes_is_served_as_nginx_does() -> None:
    # client_body_timeout is between two reads, not for the whole body (nginx docs)
    drip = [(1.0 + 0.5 * i, Chunk(UP, b"x")) for i in range(10)]
    stage = RequestTimeouts(header_timeout=60.0, keepalive_timeout=None, body_timeout=1.0)
    out = replay(stage, [(0.5, Chunk(UP, POST_HEAD)), *drip], until=100.0)
    assert ends(out) == [] and not stage.connection_closed


def test_a_request_waiting_for_its_response_is_not_timed_by_the_client_timers() -> None:
    stage = RequestTimeouts(header_timeout=1.0, keepalive_timeout=1.0, body_timeout=1.0)
    out = replay(stage, [(0.5, Chunk(UP, GET))], until=1000.0)
    assert ends(out) == []  # the response is proxy_read_timeout's business


def test_compose_uses_it_when_keepalive_or_body_timeout_is_set() -> None:
    (plain, *_), _ = PROXY_STAGES.around(ProxyOptions())
    assert plain.name == "client_header_timeout"  # the default is unchanged
    (stage, *_), _ = PROXY_STAGES.around(ProxyOptions(keepalive_timeout=75.0))
    assert isinstance(stage, RequestTimeouts)
    assert (stage.header_timeout, stage.keepalive_timeout, stage.body_timeout) == (
        60.0,
        75.0,
        None,
    )
