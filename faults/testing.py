"""Virtual-clock replay of a fault or pipeline, for tests (pure).

`replay(fault, [(t, item), ...])` feeds the timeline in time order, waking the
fault at each deadline that falls before the next input, and returns what came out
with the virtual time it came out at. No real time passes.
"""

from __future__ import annotations

import random
from collections.abc import Iterable

from middlebox.core.fault import Fault, FaultContext
from middlebox.core.stream import Chunk, Direction, Item

TimedItem = tuple[float, Item]


def bind_for_test(fault: Fault, seed: int = 0, connection_id: int = 0) -> Fault:
    """Bind a fault with a seeded rng, as the proxy would for one connection."""
    fault.bind(FaultContext(connection_id=connection_id, rng=random.Random(seed)))
    return fault


def replay(
    fault: Fault,
    timeline: Iterable[TimedItem],
    *,
    until: float | None = None,
    seed: int = 0,
    start: float = 0.0,
    max_wakeups: int = 100_000,
    bind: bool = True,
) -> list[TimedItem]:
    """Run `fault` over `timeline` on a virtual clock and return the timed output.

    Deadlines due at or before an input's time fire before that input. After the
    last input, deadlines keep firing until none is left or the next is past `until`.
    `max_wakeups` bounds a fault that keeps asking to be woken.
    """
    if bind:
        bind_for_test(fault, seed)
    out: list[TimedItem] = [(start, item) for item in fault.on_open(start)]
    wakeups = 0

    def fire_until(limit: float | None) -> None:
        nonlocal wakeups
        while True:
            due = fault.deadline()
            if due is None or (limit is not None and due > limit):
                return
            wakeups += 1
            if wakeups > max_wakeups:
                raise RuntimeError(f"{fault!r} asked for more than {max_wakeups} wake-ups")
            now = max(due, start)
            out.extend((now, item) for item in fault.on_deadline(now))

    for time, item in sorted(timeline, key=lambda pair: pair[0]):
        fire_until(time)
        out.extend((time, emitted) for emitted in fault.on_item(item, time))
    fire_until(until)
    return out


def joined(output: Iterable[TimedItem], direction: Direction) -> bytes:
    """All bytes that came out in one direction, concatenated."""
    return b"".join(
        item.data for _, item in output if isinstance(item, Chunk) and item.direction is direction
    )
