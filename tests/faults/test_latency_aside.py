"""latency steps aside (`Fault.aside`) for a direction once every item of it would go out
at once: never for a delay or a jitter it applies, and a pipeline's output, times and
reports are the same with and without stepping aside."""

from __future__ import annotations

import random
from collections.abc import Callable
from dataclasses import dataclass

from hypothesis import given
from hypothesis import strategies as st

from faults.idle_reaper import IdleReaper
from faults.latency import Latency
from faults.set_header import SetHeader
from faults.testing import TimedItem, replay
from middlebox.core.fault import Fault, FaultContext, FaultReport, Pipeline
from middlebox.core.stream import DOWN, UP, Chunk, Direction, Eof
from tests.faults.httpprops import SSE_HEAD, counting, request, resplit, sse_chunks

BOTH = frozenset(Direction)
BARE_HEAD = SSE_HEAD.replace(b"x-accel-buffering: no\r\n", b"")


@dataclass
class NeverAside(Latency):
    """The same latency, seeing every item (what it did before it could step aside)."""

    def _step_aside(self, now: float) -> None:
        return None


def stream(frames: int = 4, step: float = 0.01) -> list[TimedItem]:
    """A request, a bare SSE head and `frames` frames `step` apart, then the server's FIN."""
    body = sse_chunks(frames)
    timeline: list[TimedItem] = [(0.0, Chunk(UP, request())), (0.05, Chunk(DOWN, BARE_HEAD))]
    timeline += [(0.1 + i * step, Chunk(DOWN, chunk)) for i, chunk in enumerate(body)]
    return [*timeline, (0.1 + len(body) * step, Eof(DOWN))]


def test_a_zero_delay_steps_aside_for_both_directions_once_it_has_reported() -> None:
    latency = Latency(delay=0.0)
    seen = counting(latency)
    timeline = stream()
    out = replay(Pipeline([latency]), timeline)
    assert out == timeline  # every item at the time it came
    assert seen == [timeline[0][1]]  # only the first, which it reported; the rest passed over
    assert latency.aside == BOTH
    assert [(r.action, r.details) for r in latency.reports] == [
        ("delaying", {"direction": "upstream", "offset": 0, "delay": 0.0})
    ]
    assert latency.deadline() is None


def test_a_delay_is_never_stepped_aside_for() -> None:
    latency = Latency(delay=0.25)
    seen = counting(latency)
    timeline = stream()
    out = replay(Pipeline([latency]), timeline)
    assert [t for t, _ in out] == [t + 0.25 for t, _ in timeline]
    assert len(seen) == len(timeline)
    assert latency.aside == frozenset()


def test_a_jitter_without_a_delay_is_never_stepped_aside_for_and_draws_as_before() -> None:
    timeline = stream(frames=8)
    latency = Latency(delay=0.0, jitter=0.02)
    seen = counting(latency)
    out = replay(Pipeline([latency]), timeline, seed=5)
    assert len(seen) == len(timeline) and latency.aside == frozenset()
    before = replay(Pipeline([NeverAside(delay=0.0, jitter=0.02)]), timeline, seed=5)
    assert out == before
    assert any(t_out > t_in for (t_out, _), (t_in, _) in zip(out, timeline, strict=True))


def test_a_direction_it_does_not_delay_is_stepped_aside_for_from_the_open() -> None:
    latency = Latency(delay=0.5, direction="downstream")
    seen = counting(latency)
    timeline = stream()
    out = replay(Pipeline([latency]), timeline)
    assert latency.aside == frozenset({UP})
    assert all(item.direction is DOWN for item in seen)  # the request passed it over
    assert out[0] == timeline[0]
    assert [t for t, i in out if i.direction is DOWN] == [t + 0.5 for t, _ in timeline[1:]]


def test_a_zero_delay_waits_for_its_window_and_reports_the_offset_it_starts_at() -> None:
    latency = Latency(delay=0.0, start=0.1)
    seen = counting(latency)
    timeline = stream()
    replay(Pipeline([latency]), timeline)
    # the request (0.0) and the head (0.05) came before the window: seen, not reported
    assert seen == [item for _, item in timeline[:3]]
    (report,) = latency.reports
    assert (report.time, report.details["offset"]) == (0.1, len(BARE_HEAD))
    assert latency.aside == BOTH


def test_a_window_that_is_over_is_stepped_aside_for_once_nothing_waits_in_it() -> None:
    latency = Latency(delay=0.25, stop=0.1, direction="downstream")
    seen = counting(latency)
    body = sse_chunks(3)  # three frames, [DONE], the last chunk
    timeline: list[TimedItem] = [(0.0, Chunk(UP, request())), (0.05, Chunk(DOWN, BARE_HEAD))]
    timeline += [
        (time, Chunk(DOWN, chunk))
        for time, chunk in zip([0.125, 0.25, 0.5, 0.75, 1.0], body, strict=True)
    ]
    out = replay(Pipeline([latency]), timeline)
    # the head (0.05, in the window) goes out at 0.3; the chunks after the window wait
    # behind it (order is kept) and then pass at once: seen until the queue is empty
    assert [t for t, i in out if i.direction is DOWN] == [0.3, 0.3, 0.3, 0.5, 0.75, 1.0]
    assert [i for i in seen if i.direction is DOWN] == [item for _, item in timeline[1:4]]
    assert latency.aside == BOTH


def test_a_window_that_is_over_passes_later_items_at_the_time_they_come() -> None:
    latency = Latency(delay=0.25, stop=0.1, direction="downstream")
    timeline = stream(frames=3, step=0.01)
    late: list[TimedItem] = [(1.0, Chunk(DOWN, b"late")), (1.5, Chunk(DOWN, b"later"))]
    out = replay(Pipeline([latency]), timeline[:-1] + late)
    assert out[-2:] == late
    assert latency.aside == BOTH


def test_backpressure_keeps_it_in_the_path_until_lifted() -> None:
    latency = Latency(delay=1.0, stop=0.01, max_backlog=4, direction="downstream")
    pipeline = Pipeline([latency])
    pipeline.bind(_context())
    pipeline.on_open(0.0)
    pipeline.on_item(Chunk(DOWN, b"0123456789"), 0.0)  # queued, over the backlog
    assert latency.reading_paused(DOWN)
    pipeline.on_item(Chunk(DOWN, b"x"), 0.5)  # past the window, behind the queued one
    assert DOWN not in latency.aside
    assert latency.deadline() == 1.0  # both wait: the late one behind the first
    assert pipeline.on_deadline(1.0) == [Chunk(DOWN, b"0123456789"), Chunk(DOWN, b"x")]
    assert not latency.reading_paused(DOWN)
    assert latency.aside == BOTH
    assert [r.action for r in latency.reports] == [
        "delaying",
        "backpressure_on",
        "backpressure_off",
    ]


def _context(sink: Callable[[FaultReport], None] | None = None) -> FaultContext:
    return FaultContext(rng=random.Random(7), report=sink)


# -- the same output with and without stepping aside ------------------------------------


def keep_alive(draw: st.DrawFn) -> list[TimedItem]:
    """Two exchanges on one connection (an SSE answer, then a Content-Length one), every
    stream cut at drawn points and gaps; `pipelined`: the second request goes out while
    the first answer is still coming, else after it."""
    first = BARE_HEAD + b"".join(sse_chunks(draw(st.integers(0, 4))))
    second = b"HTTP/1.1 200 OK\r\nContent-Length: 5\r\n\r\nhello"
    cuts = st.lists(st.integers(0, 600), max_size=5)
    gaps = st.floats(0.0, 0.2, allow_nan=False)
    timeline: list[TimedItem] = []
    now = 0.0

    def send(direction: Direction, piece: bytes) -> None:
        nonlocal now
        timeline.append((now, Chunk(direction, piece)))
        now += draw(gaps)

    for piece in resplit(request(), draw(cuts)):
        send(UP, piece)
    later = resplit(request(path="/v1/completions"), draw(cuts))
    pipelined = draw(st.booleans())
    for piece in resplit(first, draw(cuts)):
        while pipelined and later and draw(st.booleans()):
            send(UP, later.pop(0))
        send(DOWN, piece)
    for piece in later:
        send(UP, piece)
    for piece in resplit(second, draw(cuts)):
        send(DOWN, piece)
    if draw(st.booleans()):
        timeline.append((now, Eof(DOWN)))
    return timeline


def three(latency: Callable[..., Latency], **config: float) -> tuple[Pipeline, list[FaultReport]]:
    reports: list[FaultReport] = []
    faults: list[Fault] = [latency(**config), SetHeader(), IdleReaper(timeout=5.0)]
    pipeline = Pipeline(faults)
    pipeline.bind(_context(reports.append))
    return pipeline, reports


@given(
    st.data(),
    st.sampled_from([0.0, 0.03]),
    st.sampled_from([0.0, 0.02]),
    st.sampled_from([None, 0.15]),
    st.sampled_from(["both", "downstream", "upstream"]),
)
def test_the_three_fault_path_gives_the_same_bytes_times_and_reports_either_way(
    data: st.DataObject, delay: float, jitter: float, stop: float | None, direction: str
) -> None:
    timeline = data.draw(st.composite(lambda draw: keep_alive(draw))())
    config = {"delay": delay, "jitter": jitter, "stop": stop, "direction": direction}
    stepping, stepping_reports = three(Latency, **config)  # type: ignore[arg-type]
    seeing, seeing_reports = three(NeverAside, **config)  # type: ignore[arg-type]
    out = replay(stepping, timeline, bind=False)
    assert out == replay(seeing, timeline, bind=False)
    assert stepping_reports == seeing_reports
    answers = b"".join(i.data for _, i in out if isinstance(i, Chunk) and i.direction is DOWN)
    assert answers.count(b"X-Accel-Buffering: no\r\n") == 2  # both heads rewritten
