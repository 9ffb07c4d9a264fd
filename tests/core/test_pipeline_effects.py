"""A pipeline call's `Effects`: the items, the next wake, the paused sources, a stage that
steps aside for the rest of the connection and one that ends it, all in the answer."""

from __future__ import annotations

import random
from dataclasses import dataclass, field
from typing import ClassVar

from middlebox.core.fault import Fault, FaultContext, Pipeline, proxy_stages
from middlebox.core.stream import DOWN, UP, Chunk, Direction, Item


@dataclass
class Holder(Fault):
    """Holds each chunk one second and pauses the client's reads while it holds one."""

    name: ClassVar[str] = "holder"
    held: list[tuple[float, Item]] = field(init=False, repr=False, default_factory=list)

    def on_item(self, item: Item, now: float) -> list[Item]:
        self.held.append((now + 1.0, item))
        return []

    def on_deadline(self, now: float) -> list[Item]:
        due = [item for at, item in self.held if at <= now]
        self.held = [(at, item) for at, item in self.held if at > now]
        return due

    def deadline(self) -> float | None:
        return min((at for at, _ in self.held), default=None)

    def reading_paused(self, source: Direction) -> bool:
        return source is Direction.UPSTREAM and bool(self.held)


@dataclass
class Stage(Fault):
    """A proxy stage (`ProxyStage`): finishes after its first item, or closes on it."""

    name: ClassVar[str] = "stage"
    closes: bool = False
    seen: int = field(init=False, repr=False, default=0)

    @property
    def finished(self) -> bool:
        return self.seen > 0 and not self.closes

    @property
    def connection_closed(self) -> bool:
        return self.seen > 0 and self.closes

    def on_item(self, item: Item, now: float) -> list[Item]:
        self.seen += 1
        return [] if self.closes else [item]


def bound(*faults: Fault) -> Pipeline:
    pipeline = Pipeline(faults)
    pipeline.bind(FaultContext(1, random.Random(0)))
    pipeline.set_stages(proxy_stages(faults))
    return pipeline


def test_a_held_item_is_a_wake_time_and_a_paused_source_until_it_goes_out() -> None:
    pipeline = bound(Holder())
    held = pipeline.feed(Chunk(UP, b"GET"), 0.0)
    assert held.items == [] and held.wake == 1.0 and held.paused == {Direction.UPSTREAM}
    early = pipeline.wake(0.5)  # not due yet: nothing runs
    assert early.items == [] and early.wake == 1.0
    out = pipeline.wake(1.0)
    assert out.items == [Chunk(UP, b"GET")]
    assert out.wake is None and out.paused == frozenset() and not out.ended


def test_a_finished_stage_steps_aside_and_an_empty_path_is_pass_through() -> None:
    stage, other = Stage(), Stage()
    pipeline = bound(stage, Holder())
    assert not pipeline.open(0.0).passthrough
    pipeline.feed(Chunk(UP, b"a"), 0.0)
    assert pipeline.faults[0] is not stage and pipeline.stages == ()
    # A stage alone: once it finishes, nothing is left on the path.
    alone = bound(other)
    effects = alone.feed(Chunk(DOWN, b"b"), 0.0)
    assert effects.items == [Chunk(DOWN, b"b")] and effects.passthrough and not effects.ended


def test_a_stage_that_closed_the_connection_ends_it_and_one_that_did_not_does_not() -> None:
    closing = bound(Stage(closes=True), Stage())
    assert not closing.open(0.0).ended
    assert closing.feed(Chunk(UP, b"x"), 0.0).ended
    # A fault that is not a stage never ends the connection, whatever its flags' names.
    plain = Pipeline([Holder()])
    plain.bind(FaultContext(1, random.Random(0)))
    assert not plain.feed(Chunk(UP, b"x"), 0.0).ended
