"""Takes: a take that fails is taken again (up to three takes), and the least disturbed
take counts. Against a real server every failed take is; against the emulator, one that
failed only on a bound judged by the wall clock (`suite.clocked_failure`).

Against the emulator a scenario's text and shape are a function of its seed, but its
pace is the machine's: the emulator makes each token when it is due, and a process that
waited for a core makes every token due meanwhile at once, before it reads the FIN that
came in that time (client-vanishes beside three busy loops: two tokens, made 0.2 ms
before the disconnect was read, after a 33 ms wait). So a take that failed only on a
wall-clock bound is taken again, alone, against a fresh emulator with the same seed.
Against a real vLLM on shared cores nothing is a function of the seed: vLLM's API server
falls behind its engine for hundreds of milliseconds at a time (a 479 ms gap between two
token chunks, then 29 of them in one read, right after the client of
abandon-through-haproxy-default had left: a proxy that learns of the
leave from a failed write learns it at the server's next write, so the waste is the
server's stall), and the proxy's own process can be woken late (client-vanishes/raw: a
vanish's FIN toward vLLM went out 486 ms after the fault fired, 0.4-3 ms in every other
run). Neither is what a scenario tests. So the rule `make calibrate` uses for real
proxies (docs/calibration.md) is used here too: a failed take (a check not met, or a
declared fault that never fired) is taken again, until one holds or three were taken, and
the take whose machine ran closest to schedule counts, pass or fail. A take's disturbance
is measured on the machine's side, where nothing a fault holds can show:

- `server_stall`: the longest gap between two token chunks the server sent the proxy
  (the journal's upstream leg; the prefill before the first token is not in it). A
  fault that holds bytes holds them downstream of that leg; one that stops reading
  (backpressure) stops the same way in every take.
- `loop_lag`: the longest the run's own event loop, which the proxies run in, was woken
  late by a timer (`LoopLag`).

A proxy's or a client's own behaviour shows in every take; so does a model gap. The
report keeps every take's disturbance and verdict (`takes` in report.json), and the
tables mark a re-taken run.
"""

from __future__ import annotations

import gc
import time
from collections.abc import AsyncIterator, Callable, Iterable, Sequence
from contextlib import asynccontextmanager
from dataclasses import dataclass
from itertools import pairwise
from typing import Any, TypeVar

import trio

# Up to three takes: `make calibrate` re-takes a grid shape once, but a real vLLM on these
# shared cores stalls more often than the emulator does there (the whole library at load
# 5-12: 10 of 150 runs re-taken, and in 3 of them the second take as disturbed as the
# first, 224-456 ms of loop lag, each failing a bound of 3-4 tokens by 3-4).
REAL_SERVER_TAKES = 3
# How often the loop watcher wakes: fine enough for the hundreds of milliseconds a
# starved process loses, coarse enough to cost nothing beside the proxy.
LAG_TICK = 0.01

T = TypeVar("T")


@dataclass(frozen=True)
class Disturbance:
    """How far the machine ran off schedule during one take (seconds)."""

    server_stall: float = 0.0
    loop_lag: float = 0.0
    # part of loop_lag's cause, shown beside it and not added: the longest collection
    gc_pause: float = 0.0

    @property
    def total(self) -> float:
        return self.server_stall + self.loop_lag

    def to_json(self) -> dict[str, float]:
        return {
            "server_stall_ms": round(self.server_stall * 1000, 1),
            "loop_lag_ms": round(self.loop_lag * 1000, 1),
            "gc_pause_ms": round(self.gc_pause * 1000, 1),
        }


def server_stall(token_times: Iterable[Sequence[float]]) -> float:
    """The longest gap between consecutive token chunks of any one response (seconds),
    0 when none had two."""
    return max(
        (later - earlier for times in token_times for earlier, later in pairwise(times)),
        default=0.0,
    )


class LoopLag:
    """The longest a timer of this trio loop fired late while `watch` ran: a process the
    machine did not schedule (or a loop kept busy) wakes its sleepers late, the proxy's
    among them. `gc_worst` is the longest garbage collection in that time, one cause
    that is this process's own (it stops every thread, the loop's too)."""

    def __init__(self, tick: float = LAG_TICK) -> None:
        self.tick = tick
        self.worst = 0.0
        self.gc_worst = 0.0
        self._gc_began: float | None = None

    def collecting(self, phase: str, info: dict[str, int]) -> None:
        """A `gc.callbacks` entry: time each collection."""
        if phase == "start":
            self._gc_began = time.perf_counter()
        elif self._gc_began is not None:
            self.gc_worst = max(self.gc_worst, time.perf_counter() - self._gc_began)
            self._gc_began = None

    def woke(self, asked: float, slept: float) -> None:
        self.worst = max(self.worst, slept - asked)

    async def watch(self) -> None:
        while True:
            began = trio.current_time()
            await trio.sleep(self.tick)
            self.woke(self.tick, trio.current_time() - began)


@asynccontextmanager
async def watching_loop_lag(tick: float = LAG_TICK) -> AsyncIterator[LoopLag]:
    """A `LoopLag` watching this loop for the body of the `async with`."""
    lag = LoopLag(tick)
    gc.callbacks.append(lag.collecting)
    try:
        async with trio.open_nursery() as nursery:
            nursery.start_soon(lag.watch)
            try:
                yield lag
            finally:
                nursery.cancel_scope.cancel()
    finally:
        gc.callbacks.remove(lag.collecting)


@dataclass
class Take:
    """One take of one client: what it produced, whether it held, how disturbed it was."""

    run: Any
    held: bool
    disturbance: Disturbance
    why: str = ""
    # taking it again cannot change it (an upstream that answered only errors)
    final: bool = False

    def to_json(self, number: int, kept: bool) -> dict[str, Any]:
        return {
            "take": number,
            "held": self.held,
            "kept": kept,
            **self.disturbance.to_json(),
            **({"why_not": self.why} if self.why else {}),
        }


def least_disturbed(takes: Sequence[Take]) -> Take:
    """The take whose machine ran closest to schedule (the earlier one on a tie)."""
    return min(takes, key=lambda take: take.disturbance.total)


async def taken(
    take_once: Callable[[int], Any],
    takes: int = REAL_SERVER_TAKES,
) -> tuple[Take, list[Take]]:
    """Take (`await take_once(number)` -> Take) until one holds, is final, or `takes` were
    taken; the kept take and all of them, in order."""
    done: list[Take] = []
    for number in range(1, takes + 1):
        take: Take = await take_once(number)
        done.append(take)
        if take.held or take.final:
            break
    return least_disturbed(done), done
