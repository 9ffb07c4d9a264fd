"""The items that flow through a connection's fault pipeline (pure).

A TCP connection carries two byte streams, each of which ends either with a FIN
(`Eof`) or an RST (`Reset`). Ends are items with a direction, so an RST crosses a
slow link after the bytes before it, like a packet. Chunk boundaries carry no
meaning (TCP is a byte stream); protocol boundaries come from the passive framers
in `middlebox.core.http1` and `middlebox.core.sse`.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass


class Direction(enum.Enum):
    """Which way an item travels: UPSTREAM is client → server, DOWNSTREAM is server → client."""

    UPSTREAM = "upstream"
    DOWNSTREAM = "downstream"

    # Enum's own __hash__ is a Python call (hash of the name) on every dict or set
    # lookup keyed by a direction: the pipeline's routing does several per item, and its
    # setup dozens per connection. Members are singletons compared by identity, so the
    # identity hash agrees with ==, at C speed.
    __hash__ = object.__hash__

    @property
    def opposite(self) -> Direction:
        return Direction.DOWNSTREAM if self is Direction.UPSTREAM else Direction.UPSTREAM


@dataclass(frozen=True, slots=True)
class Chunk:
    """Some bytes travelling in one direction."""

    direction: Direction
    data: bytes


@dataclass(frozen=True, slots=True)
class Eof:
    """A FIN: the sender will write no more in this direction (a half-close)."""

    direction: Direction


@dataclass(frozen=True, slots=True)
class Reset:
    """An RST: the connection is aborted; delivered toward `direction`'s receiver."""

    direction: Direction


Item = Chunk | Eof | Reset

UP = Direction.UPSTREAM
DOWN = Direction.DOWNSTREAM


def is_end(item: Item) -> bool:
    """True for the items after which nothing more travels in that direction."""
    return not isinstance(item, Chunk)
