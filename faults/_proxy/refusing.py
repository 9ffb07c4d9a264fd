"""The state both fail-closed stages share: the framer they watch and how they end.

`fail_closed` (requests) and `fail_closed_response` (responses) each watch one direction's
framing pass for `Http1Framer.refusal` and end the connection as nginx's `close()` does. Both
have the same three states before they look at a chunk: closed (nothing more goes anywhere),
discarding (nginx reads and drops bytes after a `Connection: close` message) and stepped aside
(no framer: nothing in the path is HTTP-aware, or the response fell back to HTTP/0.9).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from middlebox.core.fault import Fault
from middlebox.core.http1 import Http1Framer
from middlebox.core.stream import Chunk, Direction, Item


@dataclass
class RefusingStage(Fault):
    """A stage that answers what its direction's framer refuses and then closes."""

    connection_closed: bool = field(init=False, repr=False, default=False)
    _framer: Http1Framer | None = field(init=False, repr=False, default=None)
    _passed: int = field(init=False, repr=False, default=0)  # bytes of its direction passed on
    _discarding: bool = field(init=False, repr=False, default=False)

    @property
    def finished(self) -> bool:
        return self._framer is None and not self.connection_closed

    def settled(self, item: Item, watched: Direction) -> list[Item] | None:
        """What becomes of `item` before any refusal is looked at, or None to look.

        Closed: nothing. Another direction or no framer: the item as it came. Discarding: a
        chunk is dropped, an end goes on.
        """
        if self.connection_closed:
            return []  # closed as nginx closes: nothing more goes anywhere
        if item.direction is not watched or self._framer is None:
            return [item]
        if self._discarding:
            return [] if isinstance(item, Chunk) else [item]
        return None
