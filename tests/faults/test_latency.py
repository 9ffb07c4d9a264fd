"""latency: a fixed delay plus jitter that never reorders, only in its window and direction."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from faults.latency import Latency
from faults.testing import TimedItem, replay
from middlebox.core.stream import DOWN, UP, Chunk, Eof, Reset
from tests.faults.netprops import assert_deterministic, assert_preserved, timelines


def test_each_item_comes_out_delay_seconds_after_it_went_in_in_both_directions() -> None:
    out = replay(
        Latency(delay=0.25),
        [(0.0, Chunk(UP, b"GET")), (0.125, Chunk(DOWN, b"200")), (0.5, Chunk(UP, b"more"))],
    )
    assert out == [
        (0.25, Chunk(UP, b"GET")),
        (0.375, Chunk(DOWN, b"200")),
        (0.75, Chunk(UP, b"more")),
    ]


def test_a_reset_arrives_after_the_bytes_sent_before_it() -> None:
    out = replay(Latency(delay=0.5), [(0.0, Chunk(DOWN, b"data")), (0.25, Reset(DOWN))])
    assert out == [(0.5, Chunk(DOWN, b"data")), (0.75, Reset(DOWN))]


def test_only_the_chosen_direction_is_delayed() -> None:
    out = replay(
        Latency(delay=0.5, direction="downstream"),
        [(0.0, Chunk(UP, b"req")), (0.0, Chunk(DOWN, b"tok")), (0.25, Eof(UP))],
    )
    assert out == [(0.0, Chunk(UP, b"req")), (0.25, Eof(UP)), (0.5, Chunk(DOWN, b"tok"))]


def test_items_outside_the_window_pass_at_once_unless_queued_items_are_ahead() -> None:
    fault = Latency(delay=0.25, start=1.0, stop=2.0)
    out = replay(
        fault,
        [
            (0.5, Chunk(DOWN, b"a")),
            (1.0, Chunk(DOWN, b"b")),
            (1.875, Chunk(DOWN, b"c")),
            (2.0, Chunk(DOWN, b"d")),
            (3.0, Chunk(DOWN, b"e")),
        ],
    )
    assert out == [
        (0.5, Chunk(DOWN, b"a")),
        (1.25, Chunk(DOWN, b"b")),
        (2.125, Chunk(DOWN, b"c")),
        (2.125, Chunk(DOWN, b"d")),
        (3.0, Chunk(DOWN, b"e")),
    ]
    assert [(r.time, r.action, r.details["offset"]) for r in fault.reports] == [
        (1.0, "delaying", 1)
    ]


def test_the_window_counts_from_connection_open_not_from_time_zero() -> None:
    out = replay(Latency(delay=0.25, start=1.0), [(10.5, Chunk(UP, b"x"))], start=10.0)
    assert out == [(10.5, Chunk(UP, b"x"))]


def test_jitter_larger_than_the_delay_never_releases_before_the_item_arrived() -> None:
    timeline: list[TimedItem] = [(i / 8, Chunk(DOWN, bytes([65 + i]))) for i in range(8)]
    out = replay(Latency(delay=0.0, jitter=1.0), timeline, seed=3)
    assert all(t_out >= t_in for (t_out, _), (t_in, _) in zip(out, timeline, strict=True))
    assert [item for _, item in out] == [item for _, item in timeline]


@pytest.mark.parametrize(
    ("config", "message"),
    [
        ({"delay": -1.0}, "delay must be >= 0"),
        ({"jitter": -0.1}, "jitter must be >= 0"),
        ({"start": 2.0, "stop": 1.0}, "stop"),
        ({"direction": "sideways"}, "direction must be one of"),
    ],
)
def test_bad_config_is_refused_with_a_clear_message(
    config: dict[str, object], message: str
) -> None:
    with pytest.raises(ValueError, match=message):
        Latency(**config)  # type: ignore[arg-type]


@given(timelines(), st.floats(0, 0.5), st.floats(0, 0.5), st.integers(0, 2**32))
def test_bytes_ends_and_order_are_preserved_per_direction(
    timeline: list[TimedItem], delay: float, jitter: float, seed: int
) -> None:
    out = replay(Latency(delay=delay, jitter=jitter), timeline, seed=seed)
    assert_preserved(timeline, out)


@settings(max_examples=30)
@given(timelines(), st.integers(0, 2**32))
def test_the_same_seed_gives_the_same_delays(timeline: list[TimedItem], seed: int) -> None:
    assert_deterministic(lambda: Latency(delay=0.1, jitter=0.1), timeline, seed)
