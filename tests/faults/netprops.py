"""Hypothesis strategies and checks shared by the network and link fault tests.

A timeline is what a connection's two sockets would produce: chunks in each direction
at non-decreasing times, each direction optionally ended by a FIN. The checks are
the properties every link-like fault must keep: per direction, the bytes and the end
come out unchanged and in order; the same seed gives the same output and reports.
"""

from __future__ import annotations

import random
from collections.abc import Callable
from typing import Any

from hypothesis import strategies as st

from faults.testing import TimedItem, replay
from middlebox.core.fault import Fault, FaultContext
from middlebox.core.stream import DOWN, UP, Chunk, Direction, Eof, Item, Reset

# Multi-byte UTF-8 alongside ASCII, so cuts inside sequences are exercised.
_PIECES = st.sampled_from(
    [b"data: ", b"\n\n", b"h\xc3\xa9", b"\xe2\x82\xac", b"\xf0\x9f\x98\x80", b"x"]
)
payloads = st.lists(_PIECES, min_size=1, max_size=6).map(b"".join)


@st.composite
def timelines(
    draw: st.DrawFn, directions: tuple[Direction, ...] = (UP, DOWN), max_items: int = 12
) -> list[TimedItem]:
    """Chunks at non-decreasing times (ms resolution), then maybe a FIN per direction."""
    steps = draw(
        st.lists(
            st.tuples(st.integers(0, 500), st.sampled_from(directions), payloads),
            min_size=1,
            max_size=max_items,
        )
    )
    time = 0.0
    out: list[TimedItem] = []
    for gap_ms, direction, data in steps:
        time += gap_ms / 1000
        out.append((time, Chunk(direction, data)))
    for direction in directions:
        if draw(st.booleans()):
            out.append((time + 0.001, Eof(direction)))
    return out


def stream(items: list[TimedItem] | list[Item], direction: Direction) -> list[object]:
    """One direction's stream as bytes plus its end, with chunk boundaries erased."""
    data = b""
    ends: list[object] = []
    for entry in items:
        item = entry[1] if isinstance(entry, tuple) else entry
        if item.direction is not direction:
            continue
        assert not ends, f"{item!r} came out after the end {ends[0]!r}"
        if isinstance(item, Chunk):
            data += item.data
        elif isinstance(item, Eof | Reset):
            ends.append(type(item).__name__)
    return [data, *ends]


def assert_preserved(timeline: list[TimedItem], output: list[TimedItem]) -> None:
    """Per direction: same bytes, same end, nothing after the end; times never go back."""
    for direction in (UP, DOWN):
        assert stream(output, direction) == stream(timeline, direction)
        times = [t for t, item in output if item.direction is direction]
        assert times == sorted(times)


def assert_deterministic(
    make: Callable[[], Fault], timeline: list[TimedItem], seed: int, until: float | None = None
) -> None:
    """Two fresh faults with the same seed decide exactly the same things."""
    first, second = make(), make()
    out_first = replay(first, timeline, seed=seed, until=until)
    out_second = replay(second, timeline, seed=seed, until=until)
    assert out_first == out_second
    assert first.reports == second.reports


class ScriptedRandom(random.Random):
    """A `random.Random` whose `random()` returns scripted values, to force seeded decisions."""

    def __init__(self, values: list[float]) -> None:
        super().__init__(0)
        self.values = list(values)

    def random(self) -> float:
        return self.values.pop(0)


def bind_scripted(fault: Fault, values: list[float], shared: dict[str, Any] | None = None) -> Fault:
    """Bind `fault` with scripted random draws (and a shared dict, as across connections)."""
    fault.bind(FaultContext(rng=ScriptedRandom(values), shared={} if shared is None else shared))
    return fault
