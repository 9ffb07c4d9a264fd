"""max_concurrent_streams: the SETTINGS value announced, the limit reported once reached."""

from __future__ import annotations

import pytest

from faults.max_concurrent_streams import MaxConcurrentStreams
from middlebox.core.h2_faults import SETTINGS_MAX_CONCURRENT_STREAMS
from tests.faults.h2replay import h2_replay


def test_the_limit_is_announced_and_reported_when_the_client_fills_it() -> None:
    fault = MaxConcurrentStreams(limit=2)
    assert fault.h2_settings() == {SETTINGS_MAX_CONCURRENT_STREAMS: 2}
    out = h2_replay(
        fault, [(0.1, ("open", 1)), (0.2, ("close", 1)), (0.3, ("open", 3)), (0.4, ("open", 5))]
    )
    assert out == []
    assert [(r.time, r.action) for r in fault.reports] == [
        (0.0, "announced"),
        (0.4, "limit_reached"),
    ]
    assert fault.reports[1].details == {"streams": [3, 5]}


def test_a_limit_below_one_is_refused() -> None:
    with pytest.raises(ValueError):
        MaxConcurrentStreams(limit=0)
