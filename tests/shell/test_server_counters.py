"""The server's counters (`ServerCounters`): each stage event counts where /metrics reads it."""

from __future__ import annotations

from typing import ClassVar

import pytest

from middlebox.core.fault import Fault, FaultContext, FaultReport, StageEvent
from middlebox.observe.metrics import SERVER_COUNTERS, Metrics, ServerCounters

COUNTED = {
    StageEvent.HEADER_TIMEOUT: "header_timeouts",
    StageEvent.REQUEST_TIMEOUT: "header_timeouts",
    StageEvent.READ_TIMEOUT: "read_timeouts",
    StageEvent.UNFRAMEABLE_REQUEST: "unframeable_requests",
    StageEvent.UNFRAMEABLE_RESPONSE: "unframeable_responses",
}


@pytest.mark.parametrize("event", list(StageEvent))
def test_a_stage_event_counts_in_its_counter_alone(event: StageEvent) -> None:
    counters = ServerCounters()
    counters.count_stage(event)
    counted = {name: value for name, value in counters.exported().items() if value}
    assert counted == {COUNTED[event]: 1}


def test_every_exported_counter_is_rendered_less_its_baseline() -> None:
    counters = ServerCounters()
    counters.read_timeouts = 5
    metrics = Metrics()
    metrics.reset(counters, None)
    counters.read_timeouts += 2
    text = metrics.render(counters, None)
    assert set(counters.exported()) == set(SERVER_COUNTERS)
    assert "middlebox_read_timeouts_total 2\n" in text
    assert "middlebox_client_header_timeouts_total 0\n" in text
    assert "middlebox_scenario_info" not in text  # no scenario: none named


class _Plain(Fault):
    name: ClassVar[str] = "plain"


class _Timeout(Fault):
    name: ClassVar[str] = "timeout_stage"
    stage_event: ClassVar[StageEvent | None] = StageEvent.READ_TIMEOUT


def test_a_stage_s_report_carries_its_event_and_a_scenario_fault_s_carries_none() -> None:
    heard: list[FaultReport] = []
    for fault in (_Plain(), _Timeout()):
        fault.bind(FaultContext(report=heard.append))
        fault.report(1.0, "closed")
    assert [report.stage_event for report in heard] == [None, StageEvent.READ_TIMEOUT]
    assert StageEvent.READ_TIMEOUT.leg == "upstream"
    assert StageEvent.READ_TIMEOUT.end == "read_timeout"
