"""bandwidth: segments clocked out at a rate, ends behind the data, bounded backlog."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from faults.bandwidth import Bandwidth
from faults.testing import TimedItem, bind_for_test, replay
from middlebox.core.stream import DOWN, UP, Chunk, Eof, Reset
from tests.faults.netprops import assert_deterministic, assert_preserved, timelines


def test_a_large_write_arrives_as_a_train_of_segments_at_the_link_rate() -> None:
    out = replay(
        Bandwidth(rate=1024, segment=512),
        [(0.0, Chunk(DOWN, b"a" * 1280)), (0.125, Eof(DOWN)), (2.0, Chunk(UP, b"b" * 256))],
    )
    assert out == [
        (0.5, Chunk(DOWN, b"a" * 512)),
        (1.0, Chunk(DOWN, b"a" * 512)),
        (1.25, Chunk(DOWN, b"a" * 256)),
        (1.25, Eof(DOWN)),
        (2.25, Chunk(UP, b"b" * 256)),
    ]


def test_a_write_waits_for_the_link_to_finish_the_previous_one() -> None:
    out = replay(
        Bandwidth(rate=1024, direction="downstream"),
        [
            (0.0, Chunk(DOWN, b"x" * 512)),
            (0.25, Chunk(DOWN, b"y" * 256)),
            (0.25, Chunk(UP, b"up")),
            (2.0, Reset(DOWN)),
        ],
    )
    assert out == [
        (0.25, Chunk(UP, b"up")),
        (0.5, Chunk(DOWN, b"x" * 512)),
        (0.75, Chunk(DOWN, b"y" * 256)),
        (2.0, Reset(DOWN)),
    ]


def test_outside_the_window_bytes_pass_at_once_after_those_still_on_the_link() -> None:
    fault = Bandwidth(rate=1024, stop=1.0)
    out = replay(
        fault,
        [(0.75, Chunk(DOWN, b"a" * 512)), (1.0, Chunk(DOWN, b"b")), (2.0, Chunk(DOWN, b"c"))],
    )
    assert out == [
        (1.25, Chunk(DOWN, b"a" * 512)),
        (1.25, Chunk(DOWN, b"b")),
        (2.0, Chunk(DOWN, b"c")),
    ]
    assert [(r.time, r.action, r.details["offset"]) for r in fault.reports] == [
        (0.75, "throttling", 0)
    ]


def test_reading_pauses_while_the_backlog_exceeds_its_bound_and_resumes_as_it_drains() -> None:
    fault = bind_for_test(Bandwidth(rate=1024, segment=512, max_backlog=1000))
    fault.on_open(0.0)
    assert fault.on_item(Chunk(DOWN, b"z" * 1280), 0.0) == []
    assert fault.reading_paused(DOWN)
    assert not fault.reading_paused(UP)
    assert fault.deadline() == 0.5
    assert fault.on_deadline(0.5) == [Chunk(DOWN, b"z" * 512)]
    assert not fault.reading_paused(DOWN)
    pressure = [r for r in fault.reports if r.action.startswith("backpressure")]
    assert [(r.time, r.action, r.details["backlog"]) for r in pressure] == [
        (0.0, "backpressure_on", 1024),
        (0.5, "backpressure_off", 768),
    ]


@pytest.mark.parametrize(
    ("config", "message"),
    [({"rate": 0}, "rate"), ({"segment": 0}, "segment"), ({"max_backlog": -1}, "max_backlog")],
)
def test_bad_config_is_refused_with_a_clear_message(config: dict[str, Any], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        Bandwidth(**config)


@given(timelines(), st.integers(1, 4096), st.integers(1, 64))
def test_bytes_ends_and_order_are_preserved_and_the_rate_is_never_exceeded(
    timeline: list[TimedItem], rate: int, segment: int
) -> None:
    out = replay(Bandwidth(rate=rate, segment=segment), timeline)
    assert_preserved(timeline, out)
    for direction in (UP, DOWN):
        first_in = min((t for t, item in timeline if item.direction is direction), default=0.0)
        sent = 0
        for t, item in out:
            if isinstance(item, Chunk) and item.direction is direction:
                assert len(item.data) <= segment
                sent += len(item.data)
                assert sent <= rate * (t - first_in) * (1 + 1e-9) + 1e-6


@settings(max_examples=30)
@given(timelines(), st.integers(0, 2**32))
def test_the_same_seed_gives_the_same_schedule(timeline: list[TimedItem], seed: int) -> None:
    assert_deterministic(lambda: Bandwidth(rate=100, segment=3), timeline, seed)
