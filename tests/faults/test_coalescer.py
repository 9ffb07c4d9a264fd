"""coalescer: writes merged within a window or up to a size, flushed before the end."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from faults.coalescer import Coalescer
from faults.testing import TimedItem, replay
from middlebox.core.stream import DOWN, UP, Chunk, Direction, Eof, Reset
from tests.faults.netprops import assert_deterministic, assert_preserved, timelines


def test_writes_within_the_window_leave_together_when_it_expires() -> None:
    fault = Coalescer(window=0.25)
    out = replay(
        fault,
        [
            (0.0, Chunk(DOWN, b"data: a\n\n")),
            (0.125, Chunk(DOWN, b"data: b\n\n")),
            (0.125, Chunk(UP, b"ack")),
            (0.5, Chunk(DOWN, b"data: c\n\n")),
        ],
    )
    assert out == [
        (0.125, Chunk(UP, b"ack")),
        (0.25, Chunk(DOWN, b"data: a\n\ndata: b\n\n")),
        (0.75, Chunk(DOWN, b"data: c\n\n")),
    ]
    assert [
        (r.time, r.details["offset"], r.details["writes"], r.details["reason"])
        for r in fault.reports
    ] == [
        (0.25, 0, 2, "window"),
        (0.75, 18, 1, "window"),
    ]


def test_a_full_size_leaves_at_once_and_the_rest_waits_for_its_own_window() -> None:
    out = replay(
        Coalescer(window=1.0, size=4),
        [(0.0, Chunk(DOWN, b"ab")), (0.5, Chunk(DOWN, b"cdefghij"))],
    )
    assert out == [
        (0.5, Chunk(DOWN, b"abcd")),
        (0.5, Chunk(DOWN, b"efgh")),
        (1.5, Chunk(DOWN, b"ij")),
    ]


def test_the_end_of_the_stream_flushes_what_is_held_first() -> None:
    out = replay(
        Coalescer(window=1.0, direction="both"),
        [(0.0, Chunk(DOWN, b"tail")), (0.0, Chunk(UP, b"q")), (0.25, Reset(DOWN)), (0.5, Eof(UP))],
    )
    assert out == [
        (0.25, Chunk(DOWN, b"tail")),
        (0.25, Reset(DOWN)),
        (0.5, Chunk(UP, b"q")),
        (0.5, Eof(UP)),
    ]


def test_after_the_window_closes_writes_pass_as_they_come_after_the_held_bytes() -> None:
    out = replay(
        Coalescer(window=1.0, stop=0.5), [(0.0, Chunk(DOWN, b"a")), (0.5, Chunk(DOWN, b"b"))]
    )
    assert out == [(0.5, Chunk(DOWN, b"a")), (0.5, Chunk(DOWN, b"b"))]


@pytest.mark.parametrize(
    ("config", "message"), [({"window": 0.0}, "window"), ({"size": 0}, "size")]
)
def test_bad_config_is_refused_with_a_clear_message(config: dict[str, float], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        Coalescer(**config)  # type: ignore[arg-type]


def _byte_times(output: list[TimedItem], direction: Direction) -> list[float]:
    return [
        t
        for t, item in output
        if isinstance(item, Chunk) and item.direction is direction
        for _ in item.data
    ]


@given(timelines(), st.sampled_from([0.001, 0.05, 0.3]), st.integers(1, 40))
def test_bytes_and_order_are_preserved_and_no_byte_waits_longer_than_the_window(
    timeline: list[TimedItem], window: float, size: int
) -> None:
    out = replay(Coalescer(window=window, size=size, direction="both"), timeline)
    assert_preserved(timeline, out)
    for direction in (UP, DOWN):
        waits = zip(_byte_times(out, direction), _byte_times(timeline, direction), strict=True)
        assert all(0 <= t_out - t_in <= window + 1e-9 for t_out, t_in in waits)
    writes_in = sum(isinstance(item, Chunk) for _, item in timeline)
    small_out = sum(isinstance(item, Chunk) and len(item.data) < size for _, item in out)
    assert small_out <= writes_in


@settings(max_examples=30)
@given(timelines(), st.integers(0, 2**32))
def test_the_same_input_gives_the_same_flushes(timeline: list[TimedItem], seed: int) -> None:
    assert_deterministic(lambda: Coalescer(window=0.1, size=8), timeline, seed)


def _bound_with_mss(fault: Any, mss: int | None) -> Any:
    import random

    from middlebox.core.fault import FaultContext

    fault.bind(FaultContext(rng=random.Random(0), client_mss=mss))
    return fault


@pytest.mark.parametrize(("mss", "sizes"), [(65483, [3000]), (1448, [1448, 1448, 104])])
def test_segment_auto_holds_up_to_the_links_mss(mss: int, sizes: list[int]) -> None:
    # 10 frames of 300 bytes 20 ms apart under a 200 ms cork: on loopback's 65,483-byte
    # MSS one burst at the window, on Ethernet's 1,448 full segments as they fill.
    fault = _bound_with_mss(Coalescer(window=0.2, size=1448, segment="auto"), mss)
    timeline: list[TimedItem] = [(0.02 * i, Chunk(DOWN, b"x" * 300)) for i in range(10)]
    out = replay(fault, timeline, bind=False)
    assert [len(i.data) for _, i in out if isinstance(i, Chunk)] == sizes
    if mss == 65483:
        assert [t for t, _ in out] == [0.2]


def test_a_write_just_inside_the_window_joins_and_a_pause_starts_a_new_one() -> None:
    # A kernel cork's edge (haproxy-default: one RTO, 204 ms): a write 203 ms after the
    # first held byte leaves with it; nothing is held through a pause, and the first write
    # after it is held a whole window again, with what comes within it.
    fault = Coalescer(window=0.204)
    timeline: list[TimedItem] = [
        (0.0, Chunk(DOWN, b"head")),
        (0.203, Chunk(DOWN, b"f10")),
        (0.820, Chunk(DOWN, b"f11")),
        (0.840, Chunk(DOWN, b"f12")),
        (1.030, Chunk(DOWN, b"f21")),
    ]
    out = replay(fault, timeline)
    assert [(round(t, 3), i.data) for t, i in out if isinstance(i, Chunk)] == [
        (0.204, b"headf10"),
        (1.024, b"f11f12"),
        (1.234, b"f21"),
    ]


def test_segment_auto_without_a_known_link_falls_back_to_size() -> None:
    fault = _bound_with_mss(Coalescer(window=0.2, size=1000, segment="auto"), None)
    out = replay(fault, [(0.0, Chunk(DOWN, b"x" * 2500))], bind=False)
    assert [(t, len(i.data)) for t, i in out if isinstance(i, Chunk)] == [
        (0.0, 1000),
        (0.0, 1000),
        (0.2, 500),
    ]


def test_the_pipeline_hands_the_shells_mss_to_its_faults() -> None:
    from middlebox.core.fault import Pipeline

    fault = Coalescer(segment="auto")
    pipeline = Pipeline([fault])
    _bound_with_mss(pipeline, None)
    pipeline.set_client_mss(65483)
    assert fault.context.client_mss == 65483 and fault._segment == 65483
