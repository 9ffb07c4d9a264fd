"""rst_stream: one stream cancelled with its code, or the connection dropped."""

from __future__ import annotations

import pytest

from faults.rst_stream import RstStream
from middlebox.core.h2_faults import DropConnection, ResetStream
from tests.faults.h2replay import h2_replay

EVENT = b'data: {"choices":[{"delta":{"content":"hi"}}]}\n\n'


def test_the_second_stream_is_cancelled_after_three_events_and_the_others_go_on() -> None:
    fault = RstStream(stream=2, after_events=3, error_code="INTERNAL_ERROR")
    timeline = [(0.0, ("open", 1)), (0.0, ("open", 3)), (0.0, ("open", 5))]
    timeline += [(0.1 * i, ("data", sid, EVENT)) for i in range(1, 5) for sid in (1, 3, 5)]
    out = h2_replay(fault, timeline)  # type: ignore[arg-type]
    assert out == [(0.30000000000000004, ResetStream(3, 0x2))]
    report = fault.reports[0]
    assert (report.action, report.details["stream_id"], report.details["event"]) == (
        "reset_stream",
        3,
        3,
    )


def test_events_split_across_data_frames_are_counted_once_each() -> None:
    fault = RstStream(after_events=2)
    pieces = [EVENT[:10], EVENT[10:] + EVENT[:5], EVENT[5:]]
    out = h2_replay(
        fault, [(0.0, ("open", 1)), *[(1.0 + i, ("data", 1, p)) for i, p in enumerate(pieces)]]
    )  # type: ignore[list-item]
    assert out == [(3.0, ResetStream(1, 0x8))]


def test_after_bytes_fires_on_the_data_frame_that_reaches_them() -> None:
    fault = RstStream(after_bytes=100)
    out = h2_replay(
        fault, [(0.0, ("open", 1)), (0.1, ("data", 1, b"x" * 60)), (0.2, ("data", 1, b"x" * 60))]
    )
    assert out == [(0.2, ResetStream(1, 0x8))]


def test_at_a_time_counts_from_the_streams_own_open() -> None:
    fault = RstStream(stream=2, at=1.0)
    out = h2_replay(fault, [(0.0, ("open", 1)), (0.5, ("open", 3))])
    assert out == [(1.5, ResetStream(3, 0x8))]


def test_scope_connection_drops_every_stream_at_once() -> None:
    fault = RstStream(after_events=1, scope="connection")
    out = h2_replay(fault, [(0.0, ("open", 1)), (0.0, ("open", 3)), (0.2, ("data", 1, EVENT))])
    assert out == [(0.2, DropConnection("rst"))]
    assert fault.reports[0].action == "dropped_connection"


def test_a_stream_that_ended_before_the_trigger_is_left_alone() -> None:
    fault = RstStream(at=2.0)
    out = h2_replay(fault, [(0.0, ("open", 1)), (1.0, ("close", 1))])
    assert out == []


@pytest.mark.parametrize(
    "config",
    [
        {},
        {"at": 1.0, "after_bytes": 3},
        {"at": 1.0, "stream": 0},
        {"at": 1.0, "error_code": "NOPE"},
    ],
)
def test_a_bad_config_is_refused_at_load_time(config: dict[str, object]) -> None:
    with pytest.raises(ValueError):
        RstStream(**config)  # type: ignore[arg-type]
