"""Cross-connection fault state: the small store a fault position keeps for a scenario (pure).

A fault decides some things across connections ("the first three requests get a 429",
`every: 5`, one handoff outage per scenario). It keeps them in `FaultContext.shared`, a
mapping scoped to its position in the scenario. Faults see only this interface; where the
values live is the shell's choice, injected like the rng:

- a plain `dict` (the default): one proxy process. The proxy drives every pipeline from one
  thread, so a read-modify-write of a dict is already atomic;
- a `SharedStore` (`middlebox.shell.state`): memory shared by the `--workers` processes, or a
  Redis server several proxy processes share (`--state redis://...`). Each call is one
  atomic operation on the store (Redis INCR, SET NX), so counts stay exact across processes.

Values are JSON-shaped (numbers, strings, lists, dicts), so any store can hold them. Times
are the proxy's clock (`now`): comparable across processes on one host (the workers and a
`--state` proxy run on CLOCK_MONOTONIC), not across hosts.
"""

from __future__ import annotations

from abc import abstractmethod
from collections.abc import MutableMapping
from typing import Any

SharedState = MutableMapping[str, Any]
"""What a fault position's `shared` is: a plain dict or a `SharedStore`."""


class SharedStore(MutableMapping[str, Any]):
    """A mapping whose single operations are atomic across every process using the store.

    `MutableMapping`'s own `setdefault` reads then writes (two operations); a store
    overrides it with one atomic operation, and adds `increment`. `process_local` is a
    plain dict beside it for a fault that changes its values in place
    (`Fault.shared_in_process`): that state stays per process."""

    process_local: dict[str, Any]

    def __init__(self) -> None:
        self.process_local = {}

    @abstractmethod
    def increment(self, key: str, by: int = 1) -> int:
        """Add `by` to the integer at `key` (0 when missing); the value after adding."""

    @abstractmethod
    def setdefault(self, key: str, default: Any = None) -> Any:
        """The value at `key`, first setting it to `default` when missing, atomically."""


def for_fault(shared: SharedState, in_process: bool) -> SharedState:
    """The state a fault gets: the store, or for an in-place fault its process's dict."""
    return shared.process_local if in_process and isinstance(shared, SharedStore) else shared


def increment(shared: SharedState, key: str, by: int = 1) -> int:
    """Atomically add `by` to `shared[key]` (0 when missing) and return the new value.

    A store does it in one operation; a plain dict is only ever touched by the proxy's one
    thread, so its read-modify-write cannot interleave with another connection's."""
    if isinstance(shared, SharedStore):
        return shared.increment(key, by)
    value: int = shared.get(key, 0) + by
    shared[key] = value
    return value
