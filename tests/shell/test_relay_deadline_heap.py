"""The read hub's one deadline heap (shell/hub.py ReadHub): callbacks run in the hub's
task at their trio time, in order, once; a cancelled entry never runs and holds no
callback; dead entries are swept once they are most of the heap; a faulted relay keeps
one entry while its deadline only moves later (idle_reaper), and the hub's sleep is
shortened when an earlier deadline arrives. All on trio's MockClock: no real time."""

from __future__ import annotations

import trio
from trio.testing import MockClock

from middlebox.shell.hub import ReadHub, acquire_read_hub, release_read_hub


def run_virtual(main: object) -> None:
    trio.run(main, clock=MockClock(autojump_threshold=0))  # type: ignore[arg-type]


def test_callbacks_run_at_their_times_in_order_and_cancelled_ones_never() -> None:
    fired: list[tuple[str, float]] = []

    async def main() -> None:
        hub = acquire_read_hub()
        start = trio.current_time()

        def note(name: str) -> object:
            return lambda: fired.append((name, trio.current_time() - start))

        hub.schedule(start + 3.0, note("c"))  # type: ignore[arg-type]
        hub.schedule(start + 1.0, note("a"))  # type: ignore[arg-type]
        dropped = hub.schedule(start + 2.0, note("dropped"))  # type: ignore[arg-type]
        hub.schedule(start + 2.5, note("b"))  # type: ignore[arg-type]
        hub.cancel(dropped)
        assert dropped not in hub.tickets
        await trio.sleep(10)
        release_read_hub(hub)

    run_virtual(main)
    assert fired == [("a", 1.0), ("b", 2.5), ("c", 3.0)]


def test_an_earlier_deadline_shortens_the_hubs_sleep() -> None:
    fired: list[float] = []

    async def main() -> None:
        hub = acquire_read_hub()
        start = trio.current_time()
        hub.schedule(start + 100.0, lambda: fired.append(trio.current_time() - start))
        await trio.sleep(1)  # the hub now sleeps until +100
        assert hub.waiting is not None and hub.waiting.deadline == start + 100.0
        hub.schedule(start + 2.0, lambda: fired.append(trio.current_time() - start))
        assert hub.waiting.deadline == start + 2.0
        await trio.sleep(200)
        release_read_hub(hub)

    run_virtual(main)
    assert fired == [2.0, 100.0]


def test_a_deadline_set_by_a_callback_for_now_runs_on_the_next_turn_not_in_a_loop() -> None:
    turns: list[float] = []

    async def main() -> None:
        hub = acquire_read_hub()
        start = trio.current_time()

        def again() -> None:
            turns.append(trio.current_time() - start)
            if len(turns) < 5:
                hub.schedule(trio.current_time(), again)  # "now" again: next turn

        hub.schedule(start + 1.0, again)
        await trio.sleep(5)
        release_read_hub(hub)

    run_virtual(main)
    assert turns == [1.0] * 5


def test_dead_entries_are_swept_once_they_are_most_of_the_heap() -> None:
    hub = ReadHub()
    try:
        tickets = [hub.schedule(600.0 + n, lambda: None) for n in range(1000)]
        for ticket in tickets[:990]:
            hub.cancel(ticket)
        # Never more than twice the live entries (plus the small floor) stay in the heap.
        assert len(hub.tickets) == 10
        assert len(hub.timers) <= max(64, 2 * len(hub.tickets)) + 1
        assert {ticket for _, ticket in hub.timers} >= set(tickets[990:])
        assert hub._earliest() == 600.0 + 990
    finally:
        hub.epoll.close()


def test_the_hub_module_keeps_no_callback_for_a_cancelled_entry() -> None:
    hub = ReadHub()
    try:
        ticket = hub.schedule(1.0, lambda: None)
        hub.cancel(ticket)
        assert hub.tickets == {} and all(len(entry) == 2 for entry in hub.timers)
    finally:
        hub.epoll.close()
