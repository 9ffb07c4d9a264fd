"""h2_window: a stream's (or the connection's) window stops or slows opening."""

from __future__ import annotations

import pytest

from faults.h2_window import H2Window
from faults.testing import bind_for_test


def test_after_the_budget_the_target_stream_gets_no_credit_and_the_others_are_free() -> None:
    fault = H2Window(stream=2, after_bytes=100)
    bind_for_test(fault)
    fault.on_stream_open(1, 0.0)
    fault.on_stream_open(3, 0.0)
    assert fault.send_credit(3, 0.0) == 100
    fault.on_stream_data(3, b"x" * 100, 0.1)
    assert fault.send_credit(3, 0.2) == 0
    assert fault.send_credit(3, 50.0) == 0  # a stall: it never reopens
    assert fault.h2_deadline() is None
    assert fault.send_credit(1, 0.2) is None
    assert [(r.time, r.action, r.details) for r in fault.reports] == [
        (0.2, "window_stalled", {"stream_id": 3, "byte": 100})
    ]


def test_with_a_rate_the_window_reopens_slowly_and_says_when() -> None:
    fault = H2Window(stream=1, after_bytes=10, rate=100.0)
    bind_for_test(fault)
    fault.on_stream_open(1, 0.0)
    fault.on_stream_data(1, b"x" * 10, 0.0)
    assert fault.send_credit(1, 1.0) == 0  # stalled at 1.0
    assert fault.h2_deadline() == pytest.approx(1.01)
    assert fault.send_credit(1, 1.5) == 50
    fault.on_stream_data(1, b"x" * 50, 1.5)
    assert fault.send_credit(1, 1.5) == 0
    assert fault.h2_deadline() == pytest.approx(1.51)  # the 61st byte


def test_the_connection_window_is_one_budget_for_every_stream() -> None:
    fault = H2Window(stream=None, after_bytes=30)
    bind_for_test(fault)
    fault.on_stream_open(1, 0.0)
    fault.on_stream_open(3, 0.0)
    fault.on_stream_data(1, b"x" * 20, 0.0)
    assert fault.send_credit(3, 0.0) == 10
    fault.on_stream_data(3, b"x" * 10, 0.0)
    assert (fault.send_credit(1, 0.1), fault.send_credit(3, 0.1)) == (0, 0)


@pytest.mark.parametrize("config", [{"stream": 0}, {"after_bytes": -1}, {"rate": 0.0}])
def test_a_bad_config_is_refused_at_load_time(config: dict[str, object]) -> None:
    with pytest.raises(ValueError):
        H2Window(**config)  # type: ignore[arg-type]
