"""Fail closed on responses: an upstream response the framer refuses never reaches
a fault or the client as raw bytes when an HTTP-aware fault is in the path. Before its head
reached the client: nginx's 502 ("upstream sent invalid header"); after it: a close of both
sides ("upstream sent invalid chunked response"); a start line that is not HTTP/1.x: relayed
raw, nginx's HTTP/0.9 fallback. Driven through a real `Pipeline` as the server composes it."""

from __future__ import annotations

import random

import pytest

from faults._proxy.fail_closed_response import FailClosedResponse
from faults.cut import Cut
from faults.latency import Latency
from middlebox.compose import PROXY_STAGES
from middlebox.core.fault import FaultContext, FaultReport, Pipeline
from middlebox.core.responses import error_response
from middlebox.core.stream import DOWN, UP, Chunk, Eof, Item, Reset
from middlebox.scenario.model import ProxyOptions

REQUEST = b"POST /v1/chat/completions HTTP/1.1\r\nHost: a\r\nContent-Length: 2\r\n\r\n{}"
SSE_HEAD = (
    b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nTransfer-Encoding: chunked\r\n\r\n"
)
EVENT = b'data: {"x": 1}\n\n'
EVENT_CHUNK = b"%x\r\n%s\r\n" % (len(EVENT), EVENT)


def composed(
    options: ProxyOptions | None = None, *faults: object
) -> tuple[Pipeline, list[FaultReport]]:
    """The proxy's stages around `faults` (a cut that never fires: an SSE-aware fault)."""
    client_side, upstream_side = PROXY_STAGES.around(options or ProxyOptions())
    path = list(faults) or [Cut(after="events", count=1000)]
    pipeline = Pipeline([*client_side, *path, *upstream_side])  # type: ignore[list-item]
    reports: list[FaultReport] = []
    pipeline.bind(FaultContext(1, random.Random(0), reports.append))
    pipeline.on_open(0.0)
    return pipeline, reports


def exchange(pipeline: Pipeline, *responses: bytes | Item) -> list[Item]:
    """The request goes up, then each response read (or end) comes down."""
    out = pipeline.on_item(Chunk(UP, REQUEST), 0.0)
    for step, data in enumerate(responses, start=1):
        item = Chunk(DOWN, data) if isinstance(data, bytes) else data
        out += pipeline.on_item(item, float(step))
    return out


def client_bytes(out: list[Item]) -> bytes:
    return b"".join(i.data for i in out if isinstance(i, Chunk) and i.direction is DOWN)


def stage_reports(reports: list[FaultReport]) -> list[FaultReport]:
    return [r for r in reports if r.fault == "fail_closed_response"]


INVALID_HEADS = {
    "a bare CR in a field line": b"HTTP/1.1 200 OK\r\nBad\rHeader: x\r\n\r\n",
    "CL and TE together": (
        b"HTTP/1.1 200 OK\r\nContent-Length: 3\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\n"
    ),
    "an invalid Content-Length": b"HTTP/1.1 200 OK\r\nContent-Length: abcd\r\n\r\nabcd",
    "a field line without a colon": b"HTTP/1.1 200 OK\r\nno colon here\r\n\r\n",
}


@pytest.mark.parametrize("head", INVALID_HEADS.values(), ids=list(INVALID_HEADS))
def test_an_invalid_upstream_head_is_answered_with_nginx_s_502_and_none_of_it_passes(
    head: bytes,
) -> None:
    pipeline, reports = composed()
    out = exchange(pipeline, head)
    assert client_bytes(out) == error_response(502)
    assert out[-2:] == [Eof(DOWN), Eof(UP)]
    (refused,) = stage_reports(reports)
    assert refused.action == "refused" and refused.details["status"] == 502
    assert refused.details["byte"] == 0
    assert exchange(pipeline, SSE_HEAD) == []  # closed: nothing more goes anywhere


def test_an_invalid_head_split_over_reads_is_held_so_no_byte_of_it_reaches_the_client() -> None:
    pipeline, _ = composed()
    head = INVALID_HEADS["a bare CR in a field line"]
    out = exchange(pipeline, head[:10], head[10:20], head[20:])
    assert client_bytes(out) == error_response(502)


def test_a_bad_chunk_after_the_head_went_on_closes_both_sides_without_a_502() -> None:
    pipeline, reports = composed()
    out = exchange(pipeline, SSE_HEAD + EVENT_CHUNK, b"zz\r\n" + EVENT_CHUNK)
    # The head and the first event reached the client; then a close (no terminal chunk).
    assert client_bytes(out) == SSE_HEAD + EVENT_CHUNK
    assert out[-2:] == [Eof(DOWN), Eof(UP)]
    (closed,) = stage_reports(reports)
    assert closed.action == "closed" and closed.details["status"] is None
    assert closed.details["byte"] == len(SSE_HEAD + EVENT_CHUNK)


def test_a_bad_chunk_in_the_same_read_as_its_head_still_lets_the_good_bytes_through() -> None:
    pipeline, _ = composed()
    out = exchange(pipeline, SSE_HEAD + EVENT_CHUNK + b"-1\r\n")
    assert client_bytes(out) == SSE_HEAD + EVENT_CHUNK
    assert out[-2:] == [Eof(DOWN), Eof(UP)]


def test_a_start_line_that_is_not_http_is_relayed_raw_as_nginx_s_http_0_9_fallback() -> None:
    pipeline, reports = composed()
    garbage = b"BAD STATUS LINE\r\n\r\nand more"
    out = exchange(pipeline, garbage, Eof(DOWN))
    assert client_bytes(out) == garbage
    assert Eof(DOWN) in out and Eof(UP) not in out
    (relayed,) = stage_reports(reports)
    assert relayed.action == "relayed_raw"
    (stage,) = [f for f in pipeline.faults if isinstance(f, FailClosedResponse)]
    assert stage.finished  # it stepped aside


def test_bytes_after_a_connection_close_response_are_dropped() -> None:
    pipeline, reports = composed()
    response = b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\nConnection: close\r\n\r\nok"
    out = exchange(pipeline, response + b"extra", b"more", Eof(DOWN))
    assert client_bytes(out) == response
    assert out[-1] == Eof(DOWN)
    (dropped,) = stage_reports(reports)
    assert dropped.action == "discarded"


def test_a_valid_stream_passes_byte_exact_however_it_is_split() -> None:
    stream = SSE_HEAD + EVENT_CHUNK * 3 + b"0\r\n\r\n"
    for size in (1, 2, 7, 64, len(stream)):
        pipeline, reports = composed()
        reads = [stream[i : i + size] for i in range(0, len(stream), size)]
        out = exchange(pipeline, *reads, Eof(DOWN))
        assert client_bytes(out) == stream, size
        assert out[-1] == Eof(DOWN)
        assert not stage_reports(reports)


@pytest.mark.parametrize("end", [Eof(DOWN), Reset(DOWN)], ids=["fin", "rst"])
def test_a_head_cut_short_by_the_upstream_is_nginx_s_502_and_none_of_it_passes(end: Item) -> None:
    pipeline, reports = composed()
    out = exchange(pipeline, b"HTTP/1.1 200 OK\r\nConte", end)
    assert client_bytes(out) == error_response(502)
    assert out[-2:] == [Eof(DOWN), Eof(UP)] and Reset(DOWN) not in out
    (refused,) = stage_reports(reports)
    assert refused.action == "refused" and refused.details["status"] == 502
    assert refused.details["reason"] == "premature_close"
    assert "prematurely closed" in refused.details["message"]
    assert refused.details["byte"] == 0
    (stage,) = [f for f in pipeline.faults if isinstance(f, FailClosedResponse)]
    assert stage.connection_closed


def test_a_head_split_over_reads_then_a_close_still_gives_no_byte_of_it() -> None:
    pipeline, _ = composed()
    head = b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\n"
    out = exchange(pipeline, head[:7], head[7:30], head[30:], Eof(DOWN))
    assert client_bytes(out) == error_response(502)


def test_a_close_before_any_byte_of_the_answer_is_nginx_s_502() -> None:
    pipeline, reports = composed()
    out = exchange(pipeline, Eof(DOWN))
    assert client_bytes(out) == error_response(502)
    (refused,) = stage_reports(reports)
    assert refused.details["reason"] == "premature_close"


def test_a_close_during_a_request_body_already_sent_upstream_is_a_502() -> None:
    pipeline, _ = composed()
    head = b"POST /v1/chat/completions HTTP/1.1\r\nHost: a\r\nContent-Length: 10\r\n\r\n{}"
    out = pipeline.on_item(Chunk(UP, head), 0.0) + pipeline.on_item(Eof(DOWN), 1.0)
    assert client_bytes(out) == error_response(502)


def test_a_close_of_an_idle_kept_alive_upstream_is_no_502() -> None:
    pipeline, reports = composed()
    response = b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok"
    out = exchange(pipeline, response, Eof(DOWN))
    # the answer was whole and nothing else was asked: the close goes on as it came
    assert client_bytes(out) == response and out[-1] == Eof(DOWN)
    assert not stage_reports(reports)


def test_a_close_with_no_request_at_all_is_no_502() -> None:
    pipeline, reports = composed()
    out = pipeline.on_item(Eof(DOWN), 1.0)
    assert out == [Eof(DOWN)] and not stage_reports(reports)


def test_a_close_after_the_client_left_gets_no_answer() -> None:
    pipeline, reports = composed()
    out = pipeline.on_item(Chunk(UP, REQUEST), 0.0) + pipeline.on_item(Eof(UP), 0.5)
    out += pipeline.on_item(Chunk(DOWN, b"HTTP/1.1 200"), 0.8)
    out += pipeline.on_item(Eof(DOWN), 1.0)
    assert client_bytes(out) == b"HTTP/1.1 200"  # as it came, to a client already gone
    assert not stage_reports(reports)


def test_a_close_mid_body_after_the_head_is_no_502() -> None:
    pipeline, reports = composed()
    out = exchange(pipeline, SSE_HEAD + EVENT_CHUNK, Eof(DOWN))
    assert client_bytes(out) == SSE_HEAD + EVENT_CHUNK and out[-1] == Eof(DOWN)
    assert not stage_reports(reports)


def test_a_reset_mid_body_passes_after_the_bytes_before_it() -> None:
    pipeline, _ = composed()
    out = exchange(pipeline, SSE_HEAD + EVENT_CHUNK, Reset(DOWN))
    assert client_bytes(out) == SSE_HEAD + EVENT_CHUNK and out[-1] == Reset(DOWN)


def test_a_close_delimited_body_ends_whole_at_the_upstream_s_close() -> None:
    pipeline, reports = composed()
    response = b"HTTP/1.0 200 OK\r\nContent-Type: text/event-stream\r\n\r\n" + EVENT
    out = exchange(pipeline, response, Eof(DOWN))
    assert client_bytes(out) == response and out[-1] == Eof(DOWN)
    assert not stage_reports(reports)


def test_with_no_http_aware_fault_the_stage_steps_aside_and_nothing_is_framed() -> None:
    pipeline, _ = composed(ProxyOptions(), Latency(delay=0.0))
    (stage,) = [f for f in pipeline.faults if isinstance(f, FailClosedResponse)]
    assert stage.finished and pipeline.framing is None


def test_pass_through_is_the_scenario_s_explicit_choice_for_responses_too() -> None:
    pipeline, reports = composed(ProxyOptions(on_unframeable_request="pass_through"))
    head = INVALID_HEADS["a bare CR in a field line"]
    out = exchange(pipeline, head)
    assert client_bytes(out) == head
    assert not [f for f in pipeline.faults if isinstance(f, FailClosedResponse)]
    assert not stage_reports(reports)


def test_the_stage_is_server_most_so_no_fault_sees_a_refused_response() -> None:
    _, upstream_side = PROXY_STAGES.around(ProxyOptions(read_timeout=60.0))
    assert isinstance(upstream_side[-1], FailClosedResponse)
