"""A response body passed over every fault at once (`BodyLane`): after a read passed over
every fault as body, the next reads that are whole chunks (or a body's bytes short of its
end) go out as they came, and the faults are told the sums before anything else reaches
them. Each check compares the lane with the same pipeline read by read (a listener on
its response stream, as the journal's, keeps the lane shut), on a virtual clock.

- `Http1Framer.skip_body` takes exactly what feeding would cut as body of the message
  under way without ending it, and leaves the state feeding leaves; anything else it
  refuses with nothing changed;
- through the bench's three faults between the proxy's stages, and with head rewriters
  in a row: the same effects call by call, the same reports (an idle timeout's byte
  counts and idle time) and the same places in the framed streams, over any
  segmentation, pauses and keep-alive exchanges;
- where it must open (SSE frames through the bench path: the faults' passes are not
  called read by read) and where it must not (a listener, a lazy read timer, SSE framed
  for the journal, a fault that sees every read, a fault whose output is framed again,
  a body pass that does its own work per read)."""

from __future__ import annotations

import itertools
import random

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from faults.idle_reaper import _BodyReads
from middlebox.compose import PROXY_STAGES, load_text
from middlebox.core.fault import Effects, Fault, FaultContext, FaultReport, Pipeline, proxy_stages
from middlebox.core.framed import BodyLane, BodyPass, BodyRun, Framed
from middlebox.core.http1 import LAST_CHUNK_BYTES, Http1Framer, PieceKind, encode_chunk
from middlebox.core.stream import DOWN, UP, Chunk, Eof, Item, Reset

REQUEST = b"GET /stream HTTP/1.1\r\nHost: a\r\n\r\n"
SSE_HEAD = (
    b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nTransfer-Encoding: chunked\r\n\r\n"
)
LENGTH_HEAD = b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\n\r\n"
CLOSE_HEAD = b"HTTP/1.1 200 OK\r\nConnection: close\r\n\r\n"  # a body read until close
PING = b"8\r\n: ping\n\n\r\n"

BENCH = """
name: bench
path:
  - latency: {delay: 0}
  - set_header: {}
  - idle_reaper: {timeout: 2s}
"""
HTTP_ERROR = """
name: errors
path:
  - http_error: {status: 503, match: {every: 2}}
  - idle_reaper: {timeout: 2s}
"""
REWRITERS = """
name: rewriters
path:
  - set_header: {headers: {X-A: "1"}}
  - strip_header: {headers: [server]}
  - set_header: {headers: {X-B: "2"}}
"""
LAZY = """
name: lazy
path:
  - set_header: {}
  - idle_reaper: {timeout: 2s, lazy: 300ms}
"""
SLICED = """
name: sliced
path:
  - set_header: {}
  - slicer: {size: 4096}
"""


def frame(i: int) -> bytes:
    return b'data: {"choices":[{"delta":{"content":"t%d"}}]}\n\n' % i


def pipeline_of(text: str, *, read_by_read: bool = False) -> tuple[Pipeline, list[FaultReport]]:
    """The scenario's faults between the proxy's stages, bound as the server binds them;
    `read_by_read`: a listener on the response stream keeps the lane shut."""
    scenario = load_text(text)
    client_side, upstream_side = PROXY_STAGES.around(scenario.proxy)
    faults: list[Fault] = [*client_side, *scenario.build_faults(), *upstream_side]
    pipeline = Pipeline(faults)
    reports: list[FaultReport] = []
    pipeline.bind(FaultContext(1, random.Random(0), reports.append))
    pipeline.set_stages(proxy_stages(pipeline.faults))
    if read_by_read:
        assert pipeline.framing is not None
        pipeline.framing.down_at[pipeline.framing.size].listen(lambda entry: None)
    return pipeline, reports


Step = tuple[float, tuple[tuple[str, str, bytes], ...], float | None, frozenset, bool, bool]


def drive(pipeline: Pipeline, timeline: list[tuple[float, Item]], until: float) -> list[Step]:
    """What the relay does: each item fed at its time, the pipeline woken at the wake
    its last effects asked for (before an item due later), every call's effects kept."""
    steps: list[Step] = []

    def keep(now: float, effects: Effects) -> float | None:
        items = tuple(
            (type(i).__name__, i.direction.value, i.data if isinstance(i, Chunk) else b"")
            for i in effects.items
        )
        steps.append((now, items, effects.wake, effects.paused, effects.passthrough, effects.ended))
        return effects.wake

    wake = keep(0.0, pipeline.open(0.0))
    for now, item in [*timeline, (until, None)]:
        for _ in range(100):
            if wake is None or wake > now:
                break
            wake = keep(wake, pipeline.wake(wake))
        if item is not None:
            wake = keep(now, pipeline.feed(item, now))
    return steps


def reported(reports: list[FaultReport]) -> list[tuple[object, ...]]:
    return [(r.fault, r.time, r.action, sorted(r.details.items())) for r in reports]


def same_both_ways(text: str, timeline: list[tuple[float, Item]], until: float) -> list[Step]:
    lane, lane_reports = pipeline_of(text)
    each, each_reports = pipeline_of(text, read_by_read=True)
    steps = drive(lane, timeline, until)
    assert steps == drive(each, timeline, until)
    assert reported(lane_reports) == reported(each_reports)
    assert places(lane) == places(each)
    return steps


def places(pipeline: Pipeline) -> list[tuple[object, ...]]:
    """Where each stream and each reader on it stands, once told (`deadline` closes the
    lane): the pieces' sequence numbers aside, which the lane does not make."""
    pipeline.deadline()
    assert pipeline.framing is not None
    return [
        (
            stream.received,
            stream.emitted,
            [(r.cursor, r.delivered, r.message, r.partial) for r in stream._readers],
        )
        for stream in pipeline.framing.streams
    ]


def counted_passes(monkeypatch: pytest.MonkeyPatch) -> list[float]:
    """The times idle_reaper's body pass is called read by read (`_BodyReads.passed`)."""
    times: list[float] = []
    passed = _BodyReads.passed

    def counting(self: _BodyReads, framed: list, run: object, now: float) -> None:
        times.append(now)
        passed(self, framed, run, now)  # type: ignore[arg-type]

    monkeypatch.setattr(_BodyReads, "passed", counting)
    return times


def fed(pipeline: Pipeline, timeline: list[tuple[float, Item]]) -> list[BodyLane | None]:
    """Open, then each item fed: the lane after each call."""
    pipeline.open(0.0)
    lanes = []
    for now, item in timeline:
        pipeline.feed(item, now)
        lanes.append(pipeline._lane)
    return lanes


def sse_timeline(frames: int, gap: float = 0.05) -> list[tuple[float, Item]]:
    timeline: list[tuple[float, Item]] = [(0.0, Chunk(UP, REQUEST)), (0.1, Chunk(DOWN, SSE_HEAD))]
    timeline += [(0.2 + i * gap, Chunk(DOWN, encode_chunk(frame(i)))) for i in range(frames)]
    return timeline


# ------------------------------------------------------------------ the framer's part


def framer_in(head: bytes) -> Http1Framer:
    framer = Http1Framer("response")
    framer.feed(head)
    return framer


def state(framer: Http1Framer) -> tuple[object, ...]:
    return (
        framer._state,
        framer.offset,
        framer.body_received,
        framer._remaining,
        framer.held,
        framer.message,
    )


HEADS = [SSE_HEAD, LENGTH_HEAD % 300, CLOSE_HEAD]
wire_parts = st.lists(
    st.one_of(
        st.binary(min_size=1, max_size=40).map(encode_chunk),
        st.sampled_from([PING, LAST_CHUNK_BYTES, b"5;ext=1\r\nhello\r\n", b"3\nabc\r\n"]),
        st.binary(min_size=1, max_size=12),
    ),
    min_size=1,
    max_size=6,
)


@settings(max_examples=400, deadline=None)
@given(head=st.sampled_from(HEADS), parts=wire_parts, cut=st.integers(0, 400))
def test_skip_body_takes_what_feeding_cuts_as_body_and_refuses_the_rest(
    head: bytes, parts: list[bytes], cut: int
) -> None:
    data = b"".join(parts)
    data = data[: max(1, cut)] if cut < len(data) else data
    skipping, feeding = framer_in(head), framer_in(head)
    before = state(skipping)
    body = skipping.skip_body(data)
    pieces = feeding.feed(data)
    wanted = {PieceKind.CHUNK_HEADER, PieceKind.BODY, PieceKind.CHUNK_TRAILER_CRLF}
    cut_as_body = (
        not feeding.held
        and all(p.kind in wanted and not p.end_of_message for p in pieces)
        and (head != SSE_HEAD or feeding.in_chunks)
    )
    if body < 0:
        assert state(skipping) == before
        # it refuses only what is not whole body: chunks cut short, ends, the rest
        assert not cut_as_body or (head == SSE_HEAD and not data.endswith(b"\r\n"))
    else:
        assert cut_as_body
        assert body == sum(len(p.data) for p in pieces if p.kind is PieceKind.BODY)
        assert state(skipping) == state(feeding)


def test_skip_body_takes_the_reads_an_sse_stream_is_made_of() -> None:
    framer = framer_in(SSE_HEAD)
    reads = [encode_chunk(frame(0)), PING, encode_chunk(frame(1)) + encode_chunk(frame(2))]
    assert [framer.skip_body(r) for r in reads] == [
        len(frame(0)),
        len(b": ping\n\n"),
        len(frame(1) + frame(2)),
    ]
    for refused in (LAST_CHUNK_BYTES, encode_chunk(frame(3))[:-1], b"zz\r\n", b"5\r\nhello\n"):
        assert framer.skip_body(refused) == -1
    length = framer_in(LENGTH_HEAD % 10)
    assert (length.skip_body(b"0123"), length.skip_body(b"456789")) == (4, -1)  # its end: fed


# ------------------------------------------------------------------ the pipeline's part


def test_sse_frames_through_the_bench_path_pass_in_the_lane(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    passes = counted_passes(monkeypatch)
    steps = same_both_ways(BENCH, sse_timeline(30), until=2.0)  # within the 2 s timeout
    # read by read (the listener's pipeline) 30 passes; in the lane, the first read only
    assert len(passes) == 30 + 1
    out = b"".join(data for _, items, *_ in steps for _, way, data in items if way == "downstream")
    assert out.endswith(b"".join(encode_chunk(frame(i)) for i in range(30)))


def test_the_reaper_told_after_the_lane_times_out_from_the_last_read(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    timeline = sse_timeline(10, gap=0.5)  # the last frame at 4.7: the timeout at 6.7
    lane, reports = pipeline_of(BENCH)
    steps = drive(lane, timeline, until=10.0)
    (report,) = [r for r in reports if r.action == "timed_out"]
    assert (report.time, report.details["idle_since"]) == (pytest.approx(6.7), 4.7)
    assert report.details["body_byte"] == sum(len(frame(i)) for i in range(10))
    assert [items for now, items, *_ in steps if now == report.time][-1][-1][0] == "Eof"
    same_both_ways(BENCH, timeline, until=10.0)


@pytest.mark.parametrize(
    "text, why",
    [
        (LAZY, "a lazy read timer needs every read's time"),
        (SLICED, "a fault that is given every read"),
        (HTTP_ERROR, "a fault whose output is framed again after it"),
    ],
)
def test_no_lane_where_a_fault_must_see_each_read(
    monkeypatch: pytest.MonkeyPatch, text: str, why: str
) -> None:
    pipeline, _ = pipeline_of(text)
    assert fed(pipeline, sse_timeline(5)) == [None] * 7, why


def test_no_lane_while_a_listener_or_an_event_stream_framing_reads_the_responses(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    passes = counted_passes(monkeypatch)
    listened, _ = pipeline_of(BENCH, read_by_read=True)
    framed_sse, _ = pipeline_of(BENCH)
    assert framed_sse.framing is not None
    for stream in framed_sse.framing.streams:
        stream.sse = True  # event streams framed as SSE, as for a fault that reads SSE
    for pipeline in (listened, framed_sse):
        assert fed(pipeline, sse_timeline(5)) == [None] * 7
    assert len(passes) == 2 * 5


def test_any_other_call_tells_the_faults_first() -> None:
    pipeline, _ = pipeline_of(BENCH)
    lanes = fed(pipeline, sse_timeline(5))
    assert lanes[:2] == [None] * 2 and None not in lanes[2:]  # open from the first frame
    assert pipeline.deadline() == pytest.approx(0.2 + 4 * 0.05 + 2.0)  # the last read's
    assert pipeline._lane is None
    assert not pipeline.between_messages()


def exchange_wire(kind: str, frames: int) -> bytes:
    if kind == "sse":
        body = b"".join(encode_chunk(frame(i)) for i in range(frames))
        return SSE_HEAD + body + PING + LAST_CHUNK_BYTES
    if kind == "length":
        body = b"".join(frame(i) for i in range(frames))
        return LENGTH_HEAD % len(body) + body
    return CLOSE_HEAD + b"".join(frame(i) for i in range(frames))


@settings(max_examples=120, deadline=None)
@given(
    text=st.sampled_from([BENCH, REWRITERS]),
    kinds=st.lists(st.sampled_from(["sse", "length"]), min_size=1, max_size=3),
    last_until_close=st.booleans(),
    frames=st.integers(0, 12),
    cuts=st.lists(st.integers(0, 3000), max_size=30),
    gaps=st.lists(st.sampled_from([0.0, 0.01, 0.3, 1.5, 2.5]), min_size=1, max_size=8),
    eof=st.sampled_from([None, "fin", "rst"]),
)
def test_the_lane_gives_what_read_by_read_gives(
    text: str,
    kinds: list[str],
    last_until_close: bool,
    frames: int,
    cuts: list[int],
    gaps: list[float],
    eof: str | None,
) -> None:
    if last_until_close:
        kinds = [*kinds, "close"]
    timeline: list[tuple[float, Item]] = []
    now = 0.0
    reads = 0
    for kind in kinds:
        timeline.append((now, Chunk(UP, REQUEST)))
        wire = exchange_wire(kind, frames)
        bounds = sorted({0, len(wire), *(c for c in cuts if 0 < c < len(wire))})
        for low, high in itertools.pairwise(bounds):
            now += gaps[reads % len(gaps)]
            reads += 1
            timeline.append((now, Chunk(DOWN, wire[low:high])))
    if eof is not None:
        timeline.append((now + 0.1, Eof(DOWN) if eof == "fin" else Reset(DOWN)))
    same_both_ways(text, timeline, until=now + 5.0)


@pytest.mark.parametrize("text", [BENCH, REWRITERS])
def test_a_read_that_cuts_a_chunk_closes_the_lane_and_the_next_whole_ones_reopen_it(
    text: str,
) -> None:
    pipeline, _ = pipeline_of(text)
    split = encode_chunk(frame(5))
    timeline = sse_timeline(5)  # the lane is open from the first frame
    timeline += [(0.5, Chunk(DOWN, split[:7])), (0.55, Chunk(DOWN, split[7:]))]
    timeline += [(0.6 + i * 0.05, Chunk(DOWN, encode_chunk(frame(6 + i)))) for i in range(3)]
    lanes = fed(pipeline, timeline)
    opened = lanes[6]
    # the chunk's first bytes close it; its rest passes every fault read by read and
    # opens a new one for the next reads
    assert opened is not None and lanes[7] is None
    assert lanes[8] is not None and lanes[8] is lanes[-1] is not opened
    same_both_ways(text, timeline, until=1.0)


class CountsPasses(BodyPass):
    """Does something of its own for each read it is passed over for (`passes`)."""

    __slots__ = ()

    def passes(self, item: Item, now: float) -> bool:
        return super().passes(item, now)


class CountsPassed(BodyPass):
    """Extends `passed`, but says nothing of how to be told of reads skipped."""

    __slots__ = ()

    def passed(self, framed: list[Framed], run: BodyRun, now: float) -> None:
        super().passed(framed, run, now)


@pytest.mark.parametrize("kind", [CountsPasses, CountsPassed])
def test_a_body_pass_that_does_its_own_per_read_work_is_passed_read_by_read(
    kind: type[BodyPass],
) -> None:
    pipeline, _ = pipeline_of(REWRITERS)
    lanes_before = fed(pipeline, sse_timeline(3))
    assert lanes_before[-1] is not None  # plain head rewriters: a lane
    pipeline, _ = pipeline_of(REWRITERS)
    for fault in pipeline.faults:
        if type(fault.body_aside) is BodyPass:
            fault.body_aside.__class__ = kind
    assert fed(pipeline, sse_timeline(5)) == [None] * 7


def test_faults_that_refused_a_lane_are_not_asked_again_until_a_hook_runs(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    asked: list[int] = []
    open_lane = BodyLane.open.__func__  # type: ignore[attr-defined]

    def counted(cls: type[BodyLane], *args: object) -> BodyLane | None:
        asked.append(1)
        return open_lane(cls, *args)  # type: ignore[no-any-return]

    monkeypatch.setattr(BodyLane, "open", classmethod(counted))
    pipeline, _ = pipeline_of(LAZY)
    second = sse_timeline(5)[2:]
    assert fed(pipeline, sse_timeline(5)) == [None] * 7
    assert len(asked) == 1  # after the first frame: refused, and not asked per read
    pipeline.feed(Chunk(DOWN, LAST_CHUNK_BYTES), 1.0)  # the end reaches the reaper's hook
    pipeline.feed(Chunk(UP, REQUEST), 1.1)
    pipeline.feed(Chunk(DOWN, SSE_HEAD), 1.2)
    for now, item in second:
        pipeline.feed(item, now + 1.0)
    assert len(asked) == 2  # asked again once after the hooks, for the next response
