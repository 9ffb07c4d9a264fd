"""The pure pipeline: path order, per-direction routing, deadlines, replay."""

from __future__ import annotations

import random
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import ClassVar

from hypothesis import given
from hypothesis import strategies as st

from faults.latency import Latency
from faults.testing import joined, replay
from middlebox.core.fault import Fault, FaultContext, Pipeline
from middlebox.core.framed import Position
from middlebox.core.stream import DOWN, UP, Chunk, Direction, Eof, Item, Reset


@dataclass
class Tag(Fault):
    """Appends its label to every chunk it sees, to make the path order visible."""

    name: ClassVar[str] = "tag"
    label: bytes = b""

    def on_item(self, item: Item, now: float) -> list[Item]:
        if isinstance(item, Chunk):
            return [Chunk(item.direction, item.data + self.label)]
        return [item]


@dataclass
class AnswerEarly(Fault):
    """Answers the client itself and swallows the request, like an injected 503."""

    name: ClassVar[str] = "answer_early"
    seen: int = field(init=False, repr=False, default=0)

    def on_item(self, item: Item, now: float) -> list[Item]:
        if item.direction is UP and isinstance(item, Chunk):
            self.report(now, "answered", byte=self.seen)
            self.seen += len(item.data)
            return [Chunk(DOWN, b"503"), Eof(DOWN)]
        return [item]


def test_an_empty_pipeline_passes_every_item_through_unchanged() -> None:
    timeline = [
        (0.0, Chunk(UP, b"GET")),
        (1.0, Chunk(DOWN, b"200")),
        (2.0, Eof(UP)),
        (3.0, Reset(DOWN)),
    ]
    assert replay(Pipeline([]), timeline) == timeline


def test_upstream_items_visit_faults_client_side_first_and_downstream_items_last_first() -> None:
    pipeline = Pipeline([Tag(label=b"1"), Tag(label=b"2"), Tag(label=b"3")])
    out = replay(pipeline, [(0.0, Chunk(UP, b"req")), (0.5, Chunk(DOWN, b"resp"))])
    assert out == [(0.0, Chunk(UP, b"req123")), (0.5, Chunk(DOWN, b"resp321"))]


def test_a_fault_can_answer_the_client_and_its_answer_skips_the_faults_nearer_the_server() -> None:
    pipeline = Pipeline([Tag(label=b"c"), AnswerEarly(), Tag(label=b"s")])
    out = replay(pipeline, [(0.0, Chunk(UP, b"POST"))])
    assert out == [(0.0, Chunk(DOWN, b"503c")), (0.0, Eof(DOWN))]
    answer = pipeline.faults[1]
    assert answer.fired and answer.reports[0].action == "answered"


def test_the_pipeline_deadline_is_the_earliest_of_its_faults() -> None:
    pipeline = Pipeline([Latency(delay=0.3), Latency(delay=0.1)])
    replay(pipeline, [(0.0, Chunk(DOWN, b"x"))], until=0.05)
    # DOWN enters at the last fault (0.1 s) first; the 0.3 s fault has nothing yet.
    assert pipeline.deadline() == 0.1


def test_delays_add_up_along_the_path_on_the_virtual_clock() -> None:
    pipeline = Pipeline([Latency(delay=0.3), Latency(delay=0.1)])
    out = replay(pipeline, [(0.0, Chunk(DOWN, b"x")), (0.0, Eof(DOWN))])
    assert out == [(0.4, Chunk(DOWN, b"x")), (0.4, Eof(DOWN))]


def test_each_fault_gets_its_own_rng_drawn_deterministically_from_the_connection() -> None:
    def draws() -> list[float]:
        pipeline = Pipeline([Latency(), Latency()])
        pipeline.bind(FaultContext(7, random.Random("seed:7")))
        return [fault.rng.random() for fault in pipeline.faults]

    first, second = draws(), draws()
    assert first == second and first[0] != first[1]


def test_shared_state_is_per_fault_position_when_the_server_provides_it() -> None:
    shared: list[dict[str, object]] = [{}, {}]
    pipeline = Pipeline([Latency(), Latency()])
    pipeline.bind(FaultContext(1, random.Random(1)), shared)
    assert pipeline.faults[0].context.shared is shared[0]
    assert pipeline.faults[1].context.shared is shared[1]


@given(
    payloads=st.lists(st.tuples(st.booleans(), st.binary(min_size=1, max_size=64)), max_size=30),
    depth=st.integers(min_value=0, max_value=4),
)
def test_pass_through_preserves_bytes_and_order_per_direction(
    payloads: list[tuple[bool, bytes]], depth: int
) -> None:
    timeline: list[tuple[float, Item]] = [
        (index * 0.01, Chunk(UP if upward else DOWN, data))
        for index, (upward, data) in enumerate(payloads)
    ]
    out = replay(Pipeline([Fault() for _ in range(depth)]), timeline)
    for direction in (UP, DOWN):
        expected = b"".join(
            i.data for _, i in timeline if isinstance(i, Chunk) and i.direction is direction
        )
        assert joined(out, direction) == expected
    assert out == timeline


# -- faults that step aside (Fault.aside) ---------------------------------------------


@dataclass
class StepsAside(Fault):
    """Tags what it sees; after `calls` items it steps aside for the responses."""

    name: ClassVar[str] = "steps_aside"
    label: bytes = b"!"
    calls: int = 1
    seen: list[bytes] = field(init=False, repr=False, default_factory=list)
    rewrites: bool = False

    def changes(self) -> frozenset[Direction]:
        return frozenset({DOWN}) if self.rewrites else frozenset()

    def on_item(self, item: Item, now: float) -> list[Item]:
        data = item.data if isinstance(item, Chunk) else b"<end>"
        self.seen.append(data)
        if len(self.seen) >= self.calls:
            self.aside = frozenset({DOWN})
        if isinstance(item, Chunk):
            return [Chunk(item.direction, item.data + self.label)]
        return [item]


@dataclass
class ReadsHttp(Fault):
    """Makes the pipeline frame the path (a fault that reads HTTP), passing items on."""

    name: ClassVar[str] = "reads_http"

    def reads_http(self) -> bool:
        return True


def test_a_fault_that_stepped_aside_is_passed_over_in_that_direction_only() -> None:
    aside = StepsAside(calls=1)
    pipeline = Pipeline([Tag(label=b"1"), aside, Tag(label=b"3")])
    out = replay(
        pipeline,
        [
            (0.0, Chunk(DOWN, b"a")),  # it tags this one, then steps aside for DOWN
            (0.1, Chunk(DOWN, b"b")),
            (0.2, Chunk(UP, b"q")),
            (0.3, Eof(DOWN)),
        ],
    )
    assert out == [
        (0.0, Chunk(DOWN, b"a3!1")),
        (0.1, Chunk(DOWN, b"b31")),
        (0.2, Chunk(UP, b"q1!3")),
        (0.3, Eof(DOWN)),
    ]
    assert aside.seen == [b"a3", b"q1"]


def test_a_fault_called_again_once_it_stops_stepping_aside() -> None:
    aside = StepsAside(calls=1)
    pipeline = Pipeline([aside])
    replay(pipeline, [(0.0, Chunk(DOWN, b"a")), (0.1, Chunk(DOWN, b"b"))])
    aside.aside = frozenset()
    out = replay(pipeline, [(0.2, Chunk(DOWN, b"c"))])
    assert out == [(0.2, Chunk(DOWN, b"c!"))]
    assert aside.seen == [b"a", b"c"]


def test_items_an_answering_fault_emits_pass_over_a_fault_stepping_aside() -> None:
    aside = StepsAside(calls=0)
    aside.aside = frozenset({DOWN})
    pipeline = Pipeline([Tag(label=b"1"), aside, AnswerEarly()])
    out = replay(pipeline, [(0.0, Chunk(UP, b"req"))])
    assert out == [(0.0, Chunk(DOWN, b"5031")), (0.0, Eof(DOWN))]
    assert aside.seen == [b"req1"]  # the request reached it; the answer passed it over


def test_the_stream_after_a_rewriting_fault_that_steps_aside_is_still_framed() -> None:
    # The fault may change responses, so the faults nearer the client read a stream of
    # its own output; passed over, its output is its input, and that stream gets it.
    aside = StepsAside(calls=1, label=b"", rewrites=True)
    pipeline = Pipeline([ReadsHttp(), aside, ReadsHttp()])
    pipeline.bind(FaultContext(rng=random.Random(0)))
    response = b"HTTP/1.1 200 OK\r\nContent-Length: 5\r\n\r\n"
    first = pipeline.on_item(Chunk(DOWN, response), 0.0)
    second = pipeline.on_item(Chunk(DOWN, b"hello"), 0.1)
    assert first == [Chunk(DOWN, response)] and second == [Chunk(DOWN, b"hello")]
    assert aside.seen == [response]
    framing = pipeline.framing
    assert framing is not None
    after = framing.down_at[1]  # what the client-side fault reads: after the rewriter
    assert after is not framing.down_at[2]
    assert after.received == len(response) + 5
    assert after.http is not None and after.http.message_complete


@dataclass
class Rewrites(Fault):
    """Reads HTTP and may change `directions`; publishes the pieces of `published`."""

    name: ClassVar[str] = "rewrites"
    directions: frozenset[Direction] = frozenset()
    published: frozenset[Direction] = frozenset()

    def reads_http(self) -> bool:
        return True

    def changes(self) -> frozenset[Direction]:
        return self.directions

    def publishes(self) -> frozenset[Direction]:
        return self.published


BOTH = frozenset({UP, DOWN})
# Paths as makers of fresh faults: every connection builds its own from one config.
LAYOUT_PATHS: list[Callable[[], list[Fault]]] = [
    lambda: [ReadsHttp()],
    lambda: [ReadsHttp(), Rewrites(BOTH), ReadsHttp()],
    lambda: [Rewrites(frozenset({DOWN}), frozenset({DOWN})), Tag(), Rewrites(frozenset({UP}))],
    lambda: [Rewrites(BOTH, frozenset({UP})), Rewrites(BOTH), Rewrites(frozenset({DOWN}))],
]


def shape(pipeline: Pipeline) -> tuple[object, ...]:
    """A bound pipeline's framing as numbers: which stream each place and fault reads,
    which run framers, whose output feeds which, how requests and responses pair."""
    framing = pipeline.framing
    assert framing is not None
    number = {id(stream): n for n, stream in enumerate(framing.streams)}

    def place(position: Position | None) -> object:
        if position is None:
            return None
        published = {d.name: number[id(s)] for d, s in position.publish.items()}
        return number[id(position.up)], number[id(position.down)], published

    return (
        [number[id(s)] for s in framing.up_at],
        [number[id(s)] for s in framing.down_at],
        [s.http is not None for s in framing.streams],
        sorted((i, d.name, number[id(s)]) for (i, d), s in framing.fed_after.items()),
        [[number[id(r)] for r in s.responses_to] for s in framing.streams],
        [[number[id(r)] for r in s.tunnels] for s in framing.streams],
        [place(fault.context.framing) for fault in pipeline.faults],
    )


def test_a_layout_worked_out_once_binds_every_later_connection_as_binding_alone_does() -> None:
    for make in LAYOUT_PATHS:
        first = Pipeline(make())
        first.bind(FaultContext(rng=random.Random(1)))
        layout = first.layout
        assert layout is not None
        later = Pipeline(make())
        later.bind(FaultContext(rng=random.Random(2)), layout=layout)
        assert later.layout is layout  # reused, not worked out again
        alone = Pipeline(make())
        alone.bind(FaultContext(rng=random.Random(3)))
        assert shape(later) == shape(alone) == shape(first)
        # Its own streams: nothing of the first connection's is shared.
        assert first.framing is not None and later.framing is not None
        assert not {id(s) for s in first.framing.streams} & {id(s) for s in later.framing.streams}


def test_a_layout_for_other_fault_classes_is_not_used() -> None:
    reads = Pipeline([ReadsHttp()])
    reads.bind(FaultContext())
    plain = Pipeline([Tag(label=b"1")])
    plain.bind(FaultContext(), layout=reads.layout)
    assert plain.framing is None and plain.layout is not reads.layout
    longer = Pipeline([ReadsHttp(), ReadsHttp()])
    longer.bind(FaultContext(), layout=reads.layout)
    assert longer.layout is not reads.layout and longer.framing is not None
    assert len(longer.framing.up_at) == 3


def test_a_pipeline_bound_with_a_layout_frames_and_replays_as_one_bound_alone() -> None:
    head = b"HTTP/1.1 200 OK\r\nContent-Length: 5\r\n\r\n"
    timeline = [(0.0, Chunk(DOWN, head + b"hel")), (0.1, Chunk(DOWN, b"lo"))]

    def make() -> Pipeline:
        return Pipeline([ReadsHttp(), Latency(delay=0.01, jitter=0.005), ReadsHttp()])

    first = make()
    first.bind(FaultContext(rng=random.Random("s:1")))
    again, alone = make(), make()
    again.bind(FaultContext(rng=random.Random("s:2")), layout=first.layout)
    alone.bind(FaultContext(rng=random.Random("s:2")))
    assert replay(again, timeline, bind=False) == replay(alone, timeline, bind=False)
    assert again.framing is not None and alone.framing is not None
    assert again.framing.down_at[0].received == alone.framing.down_at[0].received == len(head) + 5
