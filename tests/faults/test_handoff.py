"""handoff: both directions go dark, then reset, blackhole or resume; device-wide, once."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from faults.handoff import Handoff
from faults.testing import TimedItem, replay
from middlebox.core.stream import DOWN, UP, Chunk, Eof, Reset
from tests.faults.netprops import assert_deterministic, assert_preserved, bind_scripted, timelines


def connection(
    fault: Handoff,
    timeline: list[TimedItem],
    shared: dict[str, Any],
    opened: float,
    draws: list[float] | None = None,
) -> list[TimedItem]:
    """One connection of a scenario whose handoff state is `shared`, opened at `opened`."""
    bind_scripted(fault, draws or [], shared)
    return replay(fault, timeline, start=opened, bind=False)


def test_traffic_during_the_outage_is_held_and_resumes_in_one_burst() -> None:
    fault = Handoff(at=1.0, outage=2.0, outcome="resume")
    out = replay(
        fault,
        [
            (0.5, Chunk(DOWN, b"a")),
            (1.5, Chunk(DOWN, b"b")),
            (2.0, Chunk(UP, b"q")),
            (2.5, Chunk(DOWN, b"c")),
            (3.5, Chunk(DOWN, b"d")),
        ],
    )
    assert out == [
        (0.5, Chunk(DOWN, b"a")),
        (3.0, Chunk(DOWN, b"b")),
        (3.0, Chunk(UP, b"q")),
        (3.0, Chunk(DOWN, b"c")),
        (3.5, Chunk(DOWN, b"d")),
    ]
    assert [(r.time, r.action) for r in fault.reports] == [(1.0, "outage"), (3.0, "resume")]
    assert fault.reports[1].details == {"held_items": 3, "held_bytes": 3}


def test_after_n_bytes_the_rest_of_the_write_is_held_and_reset_ends_both_sides() -> None:
    fault = Handoff(after_bytes=4, outage=1.0, outcome="reset")
    out = replay(
        fault,
        [(0.0, Chunk(DOWN, b"abcdef")), (0.5, Chunk(UP, b"q")), (2.0, Chunk(DOWN, b"late"))],
    )
    assert out == [(0.0, Chunk(DOWN, b"abcd")), (1.0, Reset(UP)), (1.0, Reset(DOWN))]
    assert fault.reports[0].details["offset"] == 4
    assert fault.reports[1].action == "reset"
    assert fault.reports[1].details["held_bytes"] == 3


HEAD = b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nTransfer-Encoding: chunked\r\n\r\n"


def frame(text: bytes) -> bytes:
    event = b"data: " + text + b"\n\n"
    return b"%x\r\n%s\r\n" % (len(event), event)


def test_after_n_events_the_outage_starts_right_after_the_nth_event() -> None:
    fault = Handoff(after_events=2, outage=1.0, outcome="reset")
    out = replay(
        fault,
        [
            (0.0, Chunk(DOWN, HEAD + frame(b"one"))),
            # the second event arrives split across two writes: the trigger waits for it
            (0.2, Chunk(DOWN, frame(b"two")[:7])),
            (0.3, Chunk(DOWN, frame(b"two")[7:] + frame(b"three"))),
            (0.4, Chunk(DOWN, frame(b"four"))),
        ],
    )
    assert out == [
        (0.0, Chunk(DOWN, HEAD + frame(b"one"))),
        (0.2, Chunk(DOWN, frame(b"two")[:7])),
        # the write that completed event 2 also carried event 3: split after event 2's
        # chunk (its blank line and the chunk's CRLF); the rest waits out the outage
        (0.3, Chunk(DOWN, frame(b"two")[7:])),
        (1.3, Reset(UP)),
        (1.3, Reset(DOWN)),
    ]
    assert fault.reports[0].action == "outage"
    assert fault.reports[0].details["event"] == 2


def test_a_trigger_needs_a_time_a_byte_count_or_an_event_count() -> None:
    with pytest.raises(ValueError, match="after_events"):
        Handoff(outage=1.0)
    with pytest.raises(ValueError, match="after_events must be at least 1"):
        Handoff(after_events=0)


def test_a_blackhole_swallows_everything_forever_and_stops_reading_both_sides() -> None:
    fault = Handoff(at=1.0, outage=1.0, outcome="blackhole")
    out = replay(
        fault,
        [(0.5, Chunk(DOWN, b"a")), (1.5, Chunk(DOWN, b"b")), (5.0, Eof(DOWN)), (6.0, Eof(UP))],
        until=100.0,
    )
    assert out == [(0.5, Chunk(DOWN, b"a"))]
    assert fault.deadline() == 2.0 + 924.6  # when Linux's tcp_retries2 gives up
    assert fault.reading_paused(UP) and fault.reading_paused(DOWN)
    assert [(r.time, r.action) for r in fault.reports] == [(1.0, "outage"), (2.0, "blackhole")]


def test_after_a_blackhole_both_sides_are_reset_when_the_kernels_give_up() -> None:
    fault = Handoff(at=1.0, outage=1.0, outcome="blackhole", give_up=10.0)
    out = replay(fault, [(1.5, Chunk(DOWN, b"b")), (5.0, Eof(UP))])
    assert out == [(12.0, Reset(UP)), (12.0, Reset(DOWN))]
    assert fault.reports[-1].action == "gave_up"
    assert not fault.reading_paused(DOWN)


def test_new_connections_during_the_outage_stall_until_it_ends() -> None:
    shared: dict[str, Any] = {}
    connection(Handoff(at=1.0, outage=2.0), [(1.5, Chunk(DOWN, b"x"))], shared, opened=0.0)
    assert shared["outage"] == {"start": 1.0, "end": 3.0, "outcome": "resume"}
    late = Handoff(at=1.0, outage=2.0, outcome="reset")
    out = connection(late, [(2.0, Chunk(UP, b"GET")), (2.5, Chunk(DOWN, b"200"))], shared, 1.5)
    assert out == [(3.0, Chunk(UP, b"GET")), (3.0, Chunk(DOWN, b"200"))]
    assert [(r.time, r.action) for r in late.reports] == [(1.5, "stalled"), (3.0, "resume")]


def test_new_connections_during_the_outage_can_be_refused_at_once() -> None:
    shared: dict[str, Any] = {"outage": {"start": 1.0, "end": 3.0, "outcome": "reset"}}
    fault = Handoff(at=1.0, new_connections="refuse")
    out = connection(fault, [(2.5, Chunk(UP, b"GET"))], shared, opened=2.0)
    assert out == [(2.0, Reset(DOWN)), (2.0, Reset(UP))]


def test_the_handoff_happens_once_so_later_connections_start_on_the_new_network() -> None:
    shared: dict[str, Any] = {"outage": {"start": 1.0, "end": 3.0, "outcome": "reset"}}
    fault = Handoff(at=1.0, after_link="satellite")
    # Satellite: RTT 600 ms; draws 0.5 (no jitter) and 0.9 (no loss) for the one segment.
    out = connection(fault, [(4.5, Chunk(DOWN, b"x"))], shared, opened=4.0, draws=[0.5, 0.9])
    assert [item for _, item in out] == [Chunk(DOWN, b"x")]
    assert out[0][0] == pytest.approx(4.5 + 0.3 + 1 / 1_250_000)
    assert [r.action for r in fault.reports] == ["after_link.link"]


def test_an_open_connection_goes_dark_with_another_connections_outage() -> None:
    shared: dict[str, Any] = {"outage": {"start": 1.0, "end": 3.0, "outcome": "resume"}}
    fault = Handoff(at=10.0)
    out = connection(fault, [(0.5, Chunk(DOWN, b"a")), (2.0, Chunk(DOWN, b"b"))], shared, 0.0)
    assert out == [(0.5, Chunk(DOWN, b"a")), (3.0, Chunk(DOWN, b"b"))]
    assert "outage" not in [r.action for r in fault.reports]  # it did not start its own


def test_a_connection_idle_through_a_reset_outage_is_reset_at_its_next_item() -> None:
    shared: dict[str, Any] = {"outage": {"start": 1.0, "end": 3.0, "outcome": "reset"}}
    out = connection(Handoff(at=10.0), [(4.0, Chunk(DOWN, b"late"))], shared, opened=0.0)
    assert out == [(4.0, Reset(UP)), (4.0, Reset(DOWN))]


def test_bytes_in_flight_on_the_old_link_are_held_with_the_rest() -> None:
    fault = Handoff(at=1.0, outage=2.0, before_link="satellite")
    # Two segments, each drawing jitter 0.5 (none) then loss 0.9 (not lost): 300 ms one way.
    out = connection(
        fault, [(0.0, Chunk(DOWN, b"a")), (0.9, Chunk(DOWN, b"b"))], {}, 0.0, [0.5, 0.9] * 2
    )
    assert [(round(t, 3), item) for t, item in out] == [
        (0.3, Chunk(DOWN, b"a")),
        (3.0, Chunk(DOWN, b"b")),
    ]


@pytest.mark.parametrize(
    ("config", "message"),
    [
        ({}, "needs a trigger"),
        ({"at": 1.0, "outcome": "explode"}, "outcome must be one of"),
        ({"at": 1.0, "after_link": "5g"}, "after_link must be one of"),
        ({"at": 1.0, "outage": -1.0}, "outage must be >= 0"),
    ],
)
def test_bad_config_is_refused_with_a_clear_message(config: dict[str, Any], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        Handoff(**config)


@given(timelines(), st.floats(0, 2), st.floats(0, 2))
def test_with_resume_bytes_ends_and_order_are_preserved(
    timeline: list[TimedItem], at: float, outage: float
) -> None:
    out = replay(Handoff(at=at, outage=outage, outcome="resume"), timeline)
    assert_preserved(timeline, out)


@settings(max_examples=30)
@given(timelines(), st.integers(0, 40), st.integers(0, 2**32))
def test_the_same_seed_gives_the_same_outage_and_link_decisions(
    timeline: list[TimedItem], after_bytes: int, seed: int
) -> None:
    make = lambda: Handoff(after_bytes=after_bytes, before_link="3g", after_link="edge")  # noqa: E731
    assert_deterministic(make, timeline, seed)
