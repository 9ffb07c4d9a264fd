"""slicer: small writes that cut SSE lines and UTF-8 sequences, paced if asked."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from faults.slicer import Slicer
from faults.testing import TimedItem, joined, replay
from middlebox.core.sse import utf8_cut_offsets
from middlebox.core.stream import DOWN, UP, Chunk, Eof
from tests.faults.netprops import assert_deterministic, assert_preserved, timelines


def test_a_write_becomes_fixed_size_slices_spaced_by_the_delay() -> None:
    fault = Slicer(size=2, delay=0.25)
    out = replay(
        fault,
        [
            (0.0, Chunk(DOWN, b"abcde")),
            (0.0, Chunk(UP, b"request")),
            (0.5, Chunk(DOWN, b"fg")),
            (0.5, Eof(DOWN)),
        ],
    )
    assert out == [
        (0.0, Chunk(DOWN, b"ab")),
        (0.0, Chunk(UP, b"request")),
        (0.25, Chunk(DOWN, b"cd")),
        (0.5, Chunk(DOWN, b"e")),
        (0.75, Chunk(DOWN, b"fg")),
        (0.75, Eof(DOWN)),
    ]
    assert [
        (r.time, r.action, r.details["offset"], r.details["slices"]) for r in fault.reports
    ] == [(0.0, "sliced", 0, 3)]


def test_without_a_delay_the_slices_leave_at_once_as_separate_writes() -> None:
    out = replay(Slicer(size=4), [(1.0, Chunk(DOWN, b"data: hi\n\n"))])
    assert out == [
        (1.0, Chunk(DOWN, b"data")),
        (1.0, Chunk(DOWN, b": hi")),
        (1.0, Chunk(DOWN, b"\n\n")),
    ]


def test_utf8_interior_cuts_before_every_continuation_byte() -> None:
    out = replay(Slicer(size=64, utf8_interior=True), [(0.0, Chunk(DOWN, "data: h€!\n".encode()))])
    assert [item for _, item in out] == [
        Chunk(DOWN, b"data: h\xe2"),
        Chunk(DOWN, b"\x82"),
        Chunk(DOWN, b"\xac!\n"),
    ]


def test_random_sizes_stay_in_their_range_and_vary() -> None:
    out = replay(Slicer(size=1, max_size=3), [(0.0, Chunk(DOWN, b"x" * 200))], seed=11)
    sizes = [len(item.data) for _, item in out if isinstance(item, Chunk)]
    assert sum(sizes) == 200
    assert set(sizes) == {1, 2, 3}


def test_outside_the_window_writes_pass_whole() -> None:
    out = replay(Slicer(size=1, start=1.0), [(0.5, Chunk(DOWN, b"abc")), (1.0, Chunk(DOWN, b"de"))])
    assert out == [(0.5, Chunk(DOWN, b"abc")), (1.0, Chunk(DOWN, b"d")), (1.0, Chunk(DOWN, b"e"))]


@pytest.mark.parametrize(
    ("config", "message"),
    [
        ({"size": 0}, "size must be > 0"),
        ({"size": 4, "max_size": 2}, "max_size"),
        ({"delay": -1.0}, "delay"),
    ],
)
def test_bad_config_is_refused_with_a_clear_message(config: dict[str, float], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        Slicer(**config)  # type: ignore[arg-type]


@given(timelines(), st.integers(1, 5), st.integers(0, 5), st.booleans(), st.integers(0, 2**32))
def test_bytes_and_order_are_preserved_and_no_slice_is_too_big(
    timeline: list[TimedItem], size: int, spread: int, utf8: bool, seed: int
) -> None:
    fault = Slicer(
        size=size, max_size=size + spread, delay=0.01, utf8_interior=utf8, direction="both"
    )
    out = replay(fault, timeline, seed=seed)
    assert_preserved(timeline, out)
    for _, item in out:
        if isinstance(item, Chunk):
            assert 0 < len(item.data) <= size + spread
            if utf8:
                assert utf8_cut_offsets(item.data) == []


@settings(max_examples=30)
@given(timelines(directions=(DOWN,)), st.integers(0, 2**32))
def test_the_same_seed_cuts_in_the_same_places(timeline: list[TimedItem], seed: int) -> None:
    assert_deterministic(lambda: Slicer(size=1, max_size=4), timeline, seed)
    assert joined(replay(Slicer(size=1, max_size=4), timeline, seed=seed), DOWN) == joined(
        timeline, DOWN
    )
