"""goaway: GOAWAY after N streams or at a time; in-flight streams finish or are cut."""

from __future__ import annotations

import pytest

from faults.goaway import Goaway
from middlebox.core.h2_faults import DropConnection, SendGoaway
from tests.faults.h2replay import h2_replay


def test_after_two_streams_the_goaway_names_the_second_and_the_streams_finish() -> None:
    fault = Goaway(after_streams=2)
    out = h2_replay(
        fault,
        [(0.1, ("open", 1)), (0.2, ("open", 3)), (0.3, ("open", 5)), (1.0, ("close", 1))],
    )
    assert out == [(0.2, SendGoaway(3, 0))]
    assert [(r.time, r.action, r.details) for r in fault.reports] == [
        (0.2, "goaway", {"last_stream_id": 3, "error_code": "NO_ERROR"})
    ]


def test_at_a_time_it_names_the_highest_stream_opened_so_far() -> None:
    fault = Goaway(at=0.5, error_code="ENHANCE_YOUR_CALM")
    out = h2_replay(fault, [(0.1, ("open", 1)), (0.2, ("open", 3)), (0.7, ("open", 5))])
    assert out == [(0.5, SendGoaway(3, 0xB))]


def test_streams_still_open_after_the_grace_are_cut_with_the_connection() -> None:
    fault = Goaway(after_streams=1, grace=2.0)
    out = h2_replay(fault, [(0.0, ("open", 1)), (0.5, ("data", 1, b"data: x\n\n"))])
    assert out == [(0.0, SendGoaway(1, 0)), (2.0, DropConnection("fin"))]
    assert fault.reports[-1].action == "cut_after_grace"


def test_a_stream_that_ends_inside_the_grace_is_not_cut() -> None:
    fault = Goaway(after_streams=1, grace=2.0)
    out = h2_replay(fault, [(0.0, ("open", 1)), (1.5, ("close", 1))])
    assert out == [(0.0, SendGoaway(1, 0))]


@pytest.mark.parametrize(
    "config", [{}, {"after_streams": 1, "at": 1.0}, {"after_streams": 0}, {"at": -1.0}]
)
def test_a_bad_config_is_refused_at_load_time(config: dict[str, float]) -> None:
    with pytest.raises(ValueError):
        Goaway(**config)  # type: ignore[arg-type]
