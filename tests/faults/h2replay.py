"""A virtual-clock driver for HTTP/2 connection-level faults (core/h2_faults.py): a timeline
of (time, event) in, the actions with their times out, deadlines fired in between."""

from __future__ import annotations

from collections.abc import Iterable

from faults.testing import bind_for_test
from middlebox.core.fault import Fault
from middlebox.core.h2_faults import H2Action, H2Fault

# ("open", stream_id), ("data", stream_id, bytes), ("close", stream_id)
H2Event = tuple[str, int] | tuple[str, int, bytes]


def h2_replay(
    fault: H2Fault, timeline: Iterable[tuple[float, H2Event]], *, until: float = 100.0
) -> list[tuple[float, H2Action]]:
    assert isinstance(fault, Fault)
    bind_for_test(fault)
    out: list[tuple[float, H2Action]] = [(0.0, a) for a in fault.on_connection_open(0.0)]

    def fire_until(limit: float) -> None:
        for _ in range(10_000):
            due = fault.h2_deadline()
            if due is None or due > limit:
                return
            actions = fault.on_h2_deadline(due)
            out.extend((due, a) for a in actions)
            if not actions and fault.h2_deadline() == due:
                return

    for now, event in timeline:
        fire_until(now)
        if event[0] == "open":
            actions = fault.on_stream_open(event[1], now)
        elif event[0] == "data":
            assert len(event) == 3
            actions = fault.on_stream_data(event[1], event[2], now)
        else:
            actions = fault.on_stream_close(event[1], now)
        out.extend((now, a) for a in actions)
    fire_until(until)
    return out
