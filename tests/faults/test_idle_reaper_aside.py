"""idle_reaper steps aside for response bodies (`Fault.body_aside`): the pipeline passes it
over for reads that are all body, and each read passed over still re-arms its timer at that
read's own time (with `lazy`, only a read that moves it by the lazy delay: the time of the
last byte alone is not enough), counts in the bytes its report gives, and has its pieces
published to the faults nearer the client. These tests pin that in `make bench`'s
three-fault path, where the zero-delay latency nearer the client steps aside too."""

from __future__ import annotations

from faults.idle_reaper import IdleReaper
from faults.latency import Latency
from faults.set_header import SetHeader
from faults.testing import TimedItem, replay
from middlebox.core.fault import Fault, FaultContext, Pipeline
from middlebox.core.http1 import LAST_CHUNK_BYTES
from middlebox.core.responses import error_response
from middlebox.core.stream import DOWN, UP, Chunk, Eof, Item
from tests.faults.httpprops import SSE_HEAD, counting, request, sse_chunks

PING = b"8\r\n: ping\n\n\r\n"  # a keep-alive comment in its own chunk


def bench_path(reaper: IdleReaper) -> tuple[Pipeline, Latency, list[Item]]:
    latency = Latency(delay=0.0)
    given = counting(reaper)
    faults: list[Fault] = [latency, SetHeader(), reaper]
    return Pipeline(faults), latency, given


def test_a_stream_that_goes_quiet_after_its_head_is_closed_timeout_after_its_last_byte() -> None:
    reaper = IdleReaper(timeout=2.0)
    pipeline, latency, given = bench_path(reaper)
    body = sse_chunks(3, done=False)[:-1]  # three frames, then silence
    timeline: list[TimedItem] = [
        (0.0, Chunk(UP, request())),
        (0.5, Chunk(DOWN, SSE_HEAD)),
        (1.0, Chunk(DOWN, body[0])),
        (2.5, Chunk(DOWN, PING)),  # 1.5 s after the frame: re-arms it
        (4.0, Chunk(DOWN, body[1] + body[2])),
    ]
    out = replay(pipeline, timeline)
    assert latency.aside  # the latency in front of it is passed over
    # the request and the head reached it; the body's reads passed it by, yet re-armed it
    assert given == [item for _, item in timeline[:2]]
    assert reaper.aside == frozenset()
    assert reaper.body_aside is None  # fired: it swallows what comes after, so sees it all
    (report,) = reaper.reports
    assert (report.time, report.details["idle_since"]) == (6.0, 4.0)
    assert report.details["byte"] == len(SSE_HEAD) + len(body[0] + PING + body[1] + body[2])
    assert out[-2:] == [(6.0, Eof(DOWN)), (6.0, Eof(UP))]
    assert LAST_CHUNK_BYTES not in b"".join(
        i.data for _, i in out if isinstance(i, Chunk) and i.direction is DOWN
    )


def test_a_silent_upstream_still_gets_the_504_through_the_stepping_aside_latency() -> None:
    pipeline, latency, _ = bench_path(IdleReaper(timeout=60.0))
    out = replay(pipeline, [(0.0, Chunk(UP, request()))])
    assert latency.aside
    page = error_response(504)
    head_end = page.index(b"\r\n\r\n")
    # nginx's page, with the field set_header (nearer the client) sets on every answer
    answer = page[:head_end] + b"\r\nX-Accel-Buffering: no" + page[head_end:]
    assert out[1:] == [(60.0, Chunk(DOWN, answer)), (60.0, Eof(DOWN)), (60.0, Eof(UP))]


def test_with_a_lazy_timer_it_needs_each_read_time_not_only_the_last() -> None:
    # Reads at 1.0, 1.35 and 1.5: the one at 1.35 moves the timer (0.35 >= 0.3), the one
    # at 1.5 does not (0.15 from 1.35). The last read's time (1.5) would give 3.5, not 3.35.
    reaper = IdleReaper(timeout=2.0, lazy=0.3)
    pipeline, _, given = bench_path(reaper)
    replay(
        pipeline,
        [
            (0.0, Chunk(UP, request())),
            (1.0, Chunk(DOWN, SSE_HEAD)),
            (1.35, Chunk(DOWN, PING)),
            (1.5, Chunk(DOWN, PING)),
        ],
    )
    (report,) = reaper.reports
    assert (report.time, report.details["idle_since"]) == (3.35, 1.35)
    assert Chunk(DOWN, PING) not in given  # both reads were passed over, each at its time


def test_a_complete_answer_disarms_it_and_the_next_request_of_the_connection_rearms_it() -> None:
    reaper = IdleReaper(timeout=1.0)
    pipeline, _, _ = bench_path(reaper)
    length_head = b"HTTP/1.1 200 OK\r\nContent-Length: 5\r\n\r\n"
    out = replay(
        pipeline,
        [
            (0.0, Chunk(UP, request())),
            (0.5, Chunk(DOWN, length_head + b"hello")),
            (5.0, Chunk(UP, request(path="/v1/completions"))),
            (5.5, Chunk(DOWN, length_head)),
        ],
    )
    (report,) = reaper.reports  # not during the idle keep-alive gap from 0.5 to 5.0
    assert (report.time, report.details["response"], report.details["phase"]) == (
        6.5,
        1,
        "after_headers",
    )
    assert out[-2:] == [(6.5, Eof(DOWN)), (6.5, Eof(UP))]
    assert pipeline.deadline() is None
    assert reaper.aside == frozenset()
    assert isinstance(out[1][1], Chunk) and out[1][1].data.endswith(b"hello")


def outcome(reaper: IdleReaper, timeline: list[TimedItem], aside: bool) -> tuple[object, ...]:
    pipeline, _, given = bench_path(reaper)
    if not aside:
        inner = reaper.bind

        def bind(context: FaultContext) -> None:
            inner(context)
            reaper.body_aside = None

        reaper.bind = bind  # type: ignore[method-assign]
    out = replay(pipeline, timeline)
    reports = [(r.time, r.action, r.details) for r in reaper.reports]
    return out, reports, len(given)


def test_passed_over_or_given_every_read_it_times_out_and_reports_the_same() -> None:
    # A keep-alive pair (an SSE stream with pings, then a length body that stalls), cut
    # into reads at every offset of a spread and timed 0.1-0.45 s apart, with and without
    # `lazy`: the bytes out, their times and the report are the same either way.
    wire = SSE_HEAD + b"".join(sse_chunks(2)[:1]) + PING + b"".join(sse_chunks(2)[1:])
    second = b"HTTP/1.1 200 OK\r\nContent-Length: 50\r\n\r\n" + b"x" * 30
    fewer = 0
    for lazy in (0.0, 0.3):
        for cut in range(1, len(wire), 3):
            reads = [wire[:cut], *[wire[i : i + 40] for i in range(cut, len(wire), 40)], second]
            timeline: list[TimedItem] = [(0.0, Chunk(UP, request() + request()))]
            timeline += [(0.5 + 0.35 * n, Chunk(DOWN, data)) for n, data in enumerate(reads)]
            passed = outcome(IdleReaper(timeout=1.0, lazy=lazy), timeline, aside=True)
            given = outcome(IdleReaper(timeout=1.0, lazy=lazy), timeline, aside=False)
            assert passed[:2] == given[:2], (lazy, cut)
            assert passed[1]  # the stalled second answer timed out
            fewer += passed[2] < given[2]
    assert fewer > 0  # some reads were all body and passed it by


def test_a_length_body_s_end_passes_it_by_and_disarms_it_as_a_read_given_to_it_does() -> None:
    # Two pipelined requests, their Content-Length answers' ends each in a read of its
    # own (passed over), a keep-alive gap, then a third request whose answer stalls: the
    # timer is disarmed by each end, so the only timeout is the third's, as when the
    # reaper is given every read.
    head = b"HTTP/1.1 200 OK\r\nContent-Length: 5\r\n\r\n"
    timeline: list[TimedItem] = [
        (0.0, Chunk(UP, request() + request())),
        (0.5, Chunk(DOWN, head + b"he")),
        (0.6, Chunk(DOWN, b"llo")),
        (0.7, Chunk(DOWN, head)),
        (0.8, Chunk(DOWN, b"hello")),
        (5.0, Chunk(UP, request())),
        (5.5, Chunk(DOWN, head + b"h")),
    ]
    passed = outcome(IdleReaper(timeout=1.0), timeline, aside=True)
    given = outcome(IdleReaper(timeout=1.0), timeline, aside=False)
    assert passed[:2] == given[:2]
    ((time, action, details),) = passed[1]  # type: ignore[misc]
    assert (time, action, details["response"], details["body_byte"]) == (6.5, "timed_out", 2, 1)
    assert passed[2] == given[2] - 2  # both ends passed it by
