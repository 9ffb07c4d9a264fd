"""The contract between the relay and what records a connection (pure typing).

The shell's relay calls these for every read, write and end; the journal and the metrics
implement them. It lives here, not in the shell, so observe depends on nothing above it.
"""

from __future__ import annotations

from typing import Protocol

from middlebox.core.stream import Direction


class RelayObserver(Protocol):
    """What the relay tells the journal; every call is cheap and never blocks."""

    def read(self, leg: str, direction: Direction, data: bytes, now: float) -> None: ...

    def wrote(self, leg: str, direction: Direction, data: bytes, now: float) -> None: ...

    def ended(self, leg: str, direction: Direction, kind: str, now: float) -> None: ...
