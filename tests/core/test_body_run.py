"""A body stretch is judged once for the path (`BodyRun`), and the proxy's response stages
pass over whole reads: each fast path gives what the slow one gives.

- `BodyRun.scan`: what a stretch of a framed stream is (all body of the message under
  way or not, its data bytes, whether it ends after a chunk's CRLF), and a place in step
  with one that asked before, or fed by one that passed the same bytes on, reuses it
  rather than scanning again;
- `ResponseProgress.feed_body` leaves the state `feed` leaves for the same body pieces;
- `fail_closed_response` passed over for a read framed whole with no refusal
  (`_WholeReads`) and `fail_closed` stepping aside for responses give the bytes, reports
  and state of the stages called for every item, over every two-way split of the wires
  that reach their refusals."""

from __future__ import annotations

import random

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from faults._lib.ends import ResponseProgress
from faults._proxy.fail_closed import FailClosed
from faults._proxy.fail_closed_response import FailClosedResponse
from faults.idle_reaper import IdleReaper
from faults.latency import Latency
from faults.set_header import SetHeader
from middlebox.compose import PROXY_STAGES
from middlebox.core.fault import Fault, FaultContext, FaultReport, Pipeline, proxy_stages
from middlebox.core.framed import BodyRun, FramedStream
from middlebox.core.http1 import PieceKind
from middlebox.core.stream import DOWN, UP, Chunk, Eof, Item
from middlebox.scenario.model import ProxyOptions

REQUEST = b"GET /stream HTTP/1.1\r\nHost: a\r\n\r\n"
SSE_HEAD = (
    b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nTransfer-Encoding: chunked\r\n\r\n"
)
FRAME = b"data: " + b"x" * 40 + b"\n\n"
CHUNK = b"%x\r\n%s\r\n" % (len(FRAME), FRAME)


def bench_path(*, fast: bool = True) -> tuple[Pipeline, list[FaultReport]]:
    """The bench's three faults between the proxy's stages, bound as the server binds
    them; `fast=False` turns the stages' passes off (they see every item)."""
    client_side, upstream_side = PROXY_STAGES.around(ProxyOptions())
    faults: list[Fault] = [
        *client_side,
        Latency(delay=0.0),
        SetHeader(),
        IdleReaper(timeout=600.0),
        *upstream_side,
    ]
    pipeline = Pipeline(faults)
    reports: list[FaultReport] = []
    pipeline.bind(FaultContext(1, random.Random(0), reports.append))
    pipeline.set_stages(proxy_stages(pipeline.faults))
    if not fast:
        for fault in faults:
            if isinstance(fault, FailClosedResponse):
                fault.body_aside = None
            if isinstance(fault, FailClosed):
                fault.aside = frozenset()
    pipeline.on_open(0.0)
    return pipeline, reports


def test_places_in_step_share_one_verdict_per_read(monkeypatch: pytest.MonkeyPatch) -> None:
    scans: list[int] = []
    scan = BodyRun.scan.__func__  # type: ignore[attr-defined]

    def counted(cls: type[BodyRun], stream: FramedStream, *args: int) -> BodyRun:
        scans.append(args[0])
        return scan(cls, stream, *args)  # type: ignore[no-any-return]

    monkeypatch.setattr(BodyRun, "scan", classmethod(counted))
    pipeline, _ = bench_path()
    pipeline.on_item(Chunk(UP, REQUEST), 0.0)
    pipeline.on_item(Chunk(DOWN, SSE_HEAD), 0.1)
    scans.clear()
    out: list[Item] = []
    for step in range(10):
        out += pipeline.on_item(Chunk(DOWN, CHUNK), 1.0 + step)
    # idle_reaper judged each read; set_header, fed the same pieces by it, reused that
    assert len(scans) == 10
    assert b"".join(i.data for i in out if isinstance(i, Chunk)) == CHUNK * 10


def stream_of(*reads: bytes) -> tuple[FramedStream, int]:
    """A response stream with one reader, fed `reads`; the reader's index after the head."""
    stream = FramedStream(DOWN, sse=False)
    reader = stream.reader()
    stream.feed(reads[0])
    reader.advance(len(reads[0]))
    for data in reads[1:]:
        stream.feed(data)
    return stream, reader.index


def test_a_stretch_of_whole_chunks_is_body_and_counts_only_chunk_data() -> None:
    stream, index = stream_of(SSE_HEAD, CHUNK * 2)
    start = len(SSE_HEAD)
    run = BodyRun.scan(stream, index, start, start + 2 * len(CHUNK), 0)
    assert run.body == 2 * len(FRAME) and run.whole_chunks


def test_a_stretch_that_ends_inside_chunk_data_counts_the_part_within_it() -> None:
    stream, index = stream_of(SSE_HEAD, CHUNK)
    start = len(SSE_HEAD)
    line = len(b"%x\r\n" % len(FRAME))
    run = BodyRun.scan(stream, index, start, start + line + 10, 0)
    assert run.body == 10 and not run.whole_chunks


@pytest.mark.parametrize(
    ("tail", "why"),
    [
        (b"0\r\n\r\n", "the last chunk ends the message"),
        (b"0\r\n\r\nHTTP/1.1 200 OK\r\nContent-Length: 0\r\n\r\n", "another message"),
    ],
)
def test_a_stretch_with_more_than_body_is_not_passed(tail: bytes, why: str) -> None:
    stream, index = stream_of(SSE_HEAD, CHUNK + tail)
    start = len(SSE_HEAD)
    end = stream.emitted
    assert BodyRun.scan(stream, index, start, end, 0).body == -1, why
    # the chunk before it alone is body
    assert BodyRun.scan(stream, index, start, start + len(CHUNK), 0).body == len(FRAME)


def test_a_chunk_line_cut_by_the_stretch_s_end_is_not_passed() -> None:
    stream, index = stream_of(SSE_HEAD, CHUNK * 2)
    start = len(SSE_HEAD)
    assert BodyRun.scan(stream, index, start, start + len(CHUNK) + 1, 0).body == -1


@settings(max_examples=60, deadline=None)
@given(
    sizes=st.lists(st.integers(min_value=1, max_value=300), min_size=1, max_size=5),
    started=st.booleans(),
)
def test_feed_body_leaves_the_state_feed_leaves(sizes: list[int], started: bool) -> None:
    stream, index = stream_of(SSE_HEAD, b"".join(b"%x\r\n%s\r\n" % (n, b"y" * n) for n in sizes))
    start = len(SSE_HEAD)
    end = stream.emitted
    run = BodyRun.scan(stream, index, start, end, 0)
    pieces = [entry.piece for entry in stream._log[index - stream._base :]]
    assert all(p.kind is not PieceKind.HEAD for p in pieces)
    walked, counted = ResponseProgress(), ResponseProgress()
    for progress in (walked, counted):
        progress.started = started
        progress.chunked = True
        progress.offset = start
    walked.feed(end - start, pieces, 0)
    counted.feed_body(end - start, run.body, run.whole_chunks)
    assert counted == walked


def split_replay(pipeline: Pipeline, reads: list[Item]) -> list[Item]:
    out: list[Item] = []
    for step, item in enumerate(reads):
        out += pipeline.on_item(item, float(step))
    return out


WIRES = {
    "a stream of chunks": SSE_HEAD + CHUNK * 3 + b"0\r\n\r\n",
    "a bad chunk line after the head": SSE_HEAD + CHUNK + b"zz\r\n" + CHUNK,
    "an invalid head": b"HTTP/1.1 200 OK\r\nBad\rHeader: x\r\n\r\n" + CHUNK,
    "bytes after a Connection: close response": (
        b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\nConnection: close\r\n\r\nokmore" + CHUNK
    ),
    "a start line that is not HTTP": b"ICY 200 OK\r\n\r\n" + CHUNK,
}


@pytest.mark.parametrize("wire", WIRES.values(), ids=list(WIRES))
def test_the_stages_passes_give_what_calling_them_for_every_item_gives(wire: bytes) -> None:
    for cut in range(len(wire) + 1):
        parts = [p for p in (wire[:cut], wire[cut:]) if p]
        reads: list[Item] = [Chunk(UP, REQUEST), *(Chunk(DOWN, p) for p in parts), Eof(DOWN)]
        fast, fast_reports = bench_path()
        slow, slow_reports = bench_path(fast=False)
        assert split_replay(fast, reads) == split_replay(slow, reads), cut
        assert fast_reports == slow_reports, cut
        stages = [
            (f, s)
            for f, s in zip(fast.faults, slow.faults, strict=True)
            if isinstance(f, FailClosedResponse | FailClosed)
        ]
        for mine, theirs in stages:
            assert (mine._passed, mine.connection_closed, mine._discarding) == (
                theirs._passed,
                theirs.connection_closed,
                theirs._discarding,
            ), cut


def test_fail_closed_sees_responses_again_once_it_closed() -> None:
    pipeline, reports = bench_path()
    (stage,) = [f for f in pipeline.faults if isinstance(f, FailClosed)]
    assert stage.aside == frozenset({DOWN})
    out = pipeline.on_item(Chunk(UP, b"GET / HTTP/1.1\r\nHost: a\r\nBad\rHeader: x\r\n\r\n"), 0.0)
    assert stage.connection_closed and stage.aside == frozenset()
    assert [r.action for r in reports if r.fault == "fail_closed"] == ["refused"]
    assert pipeline.on_item(Chunk(DOWN, SSE_HEAD), 1.0) == []  # closed: nothing goes on
    assert out


def full_effects(pipeline: Pipeline, items: list[Item]) -> tuple[object, ...]:
    effects = pipeline.effects(items)
    return (effects.items, effects.wake, effects.paused, effects.passthrough, effects.ended)


def test_a_read_that_only_passes_over_keeps_the_last_effects_and_a_wake_no_later() -> None:
    pipeline, _ = bench_path()
    (reaper,) = [f for f in pipeline.faults if isinstance(f, IdleReaper)]
    pipeline.feed(Chunk(UP, REQUEST), 0.0)
    head = pipeline.feed(Chunk(DOWN, SSE_HEAD), 1.0)  # reaches the faults: computed afresh
    assert head.wake == 601.0
    passed = pipeline.feed(Chunk(DOWN, CHUNK), 5.0)  # passes over every fault
    assert passed.items == [Chunk(DOWN, CHUNK)]
    assert reaper.deadline() == 605.0  # the read re-armed the timer ...
    assert passed.wake == 601.0  # ... and the effects kept the earlier wake
    assert (passed.paused, passed.passthrough, passed.ended) == (
        head.paused,
        head.passthrough,
        head.ended,
    )
    # the wake at 601 finds nothing due and answers the deadline now, as computed afresh
    woken = pipeline.wake(601.0)
    assert woken.items == [] and woken.wake == 605.0
    assert full_effects(pipeline, []) == ([], 605.0, woken.paused, False, False)
    # the timer then fires where a call per read would have fired it
    fired = pipeline.wake(605.0)
    assert fired.items[-2:] == [Eof(DOWN), Eof(UP)] and fired.wake is None
    assert [r.action for r in reaper.reports] == ["timed_out"]


def test_a_read_that_reaches_a_fault_computes_the_effects_afresh() -> None:
    pipeline, _ = bench_path()
    pipeline.feed(Chunk(UP, REQUEST), 0.0)
    pipeline.feed(Chunk(DOWN, SSE_HEAD), 1.0)
    pipeline.feed(Chunk(DOWN, CHUNK), 5.0)
    # the last chunk ends the response: it reaches the faults, and nothing waits anymore
    done = pipeline.feed(Chunk(DOWN, b"0\r\n\r\n"), 6.0)
    assert done.wake is None


class _AsideTimer(Fault):
    """A fault stepping aside for both directions whose deadline a pass may clear (as
    idle_reaper's does when a response's last bytes pass it by)."""

    name = "aside_timer"

    def __init__(self) -> None:
        self.aside = frozenset({UP, DOWN})
        self.due: float | None = 10.0

    def deadline(self) -> float | None:
        return self.due


def test_an_end_of_stream_gets_fresh_effects_where_a_read_keeps_the_last() -> None:
    timer = _AsideTimer()
    pipeline = Pipeline([timer])
    pipeline.bind(FaultContext(1, random.Random(0)))
    assert pipeline.open(0.0).wake == 10.0
    timer.due = None  # a pass cleared it: no hook ran, so nothing recomputed it
    read = pipeline.feed(Chunk(DOWN, b"x"), 1.0)
    assert read.items == [Chunk(DOWN, b"x")] and read.wake == 10.0  # kept: a lazy wake
    # an end may be the connection's last item: a stale wake would hold it open until 10
    end = pipeline.feed(Eof(DOWN), 2.0)
    assert end.items == [Eof(DOWN)] and end.wake is None
