"""client_vanish: the client goes away mid-stream, as far as the server can tell.

Imitates a user closing the tab, killing the app or pressing stop, to exercise the
server's abort path (does vLLM stop generating? how many tokens are wasted?). At
`at` seconds from open or after `after_bytes` response bytes the proxy ends the
upstream side as the client's OS would:

- `how: fin`: a half-close (`shutdown(SHUT_WR)`, or a `close()` whose FIN the server
  sees first); uvicorn and aiohttp report a disconnect when they read it.
- `how: rst`: an abortive close (SO_LINGER 0, or a killed process with unread data:
  Linux sends RST when a socket is closed with data still in its receive queue,
  RFC 2525 §2.17).
- `how: close`: a full close as a browser does it: FIN now, then, since the socket is
  gone, the client's kernel answers the next response segment with an RST
  (RFC 9293 §3.10.7.1), which is when a writing server learns for certain.

The client under test is gone from the story: nothing more reaches it. With
`client: silent` (default) it simply hears nothing more, like a phone that lost its
signal, and must time out on its own; `client: reset` sends it an RST so it ends at
once. What it still sends is dropped.

`connections: N` limits the fault to the first N connections of the scenario (counted
across connections in the fault's scenario-lifetime state), so a client that
reconnects after the stall can be seen to recover.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import ClassVar, Literal

from faults._lib.checks import check_choice
from faults._lib.triggers import Triggered
from middlebox.core.fault import Fault
from middlebox.core.scenario_state import increment
from middlebox.core.stream import DOWN, UP, Chunk, Eof, Item, Reset, is_end

How = Literal["fin", "rst", "close"]
ClientSide = Literal["silent", "reset"]
State = Literal["present", "gone", "closed"]


@dataclass
class ClientVanish(Triggered, Fault):
    """At `at` seconds or after `after_bytes` downstream bytes, end the upstream side."""

    name: ClassVar[str] = "client_vanish"

    how: How = "fin"
    client: ClientSide = "silent"
    connections: int | None = None

    _state: State = field(init=False, repr=False, default="present")

    def __post_init__(self) -> None:
        super().__post_init__()
        check_choice("how", self.how, How)
        check_choice("client", self.client, ClientSide)
        if self.connections is not None and self.connections < 1:
            raise ValueError(
                f"connections must be at least 1 (or null for all), got {self.connections}"
            )

    def on_open(self, now: float) -> list[Item]:
        opened = increment(self.context.shared, "connections_opened") - 1
        if self.connections is None or opened < self.connections:
            self.arm(now)
        return []

    def on_item(self, item: Item, now: float) -> list[Item]:
        out = self._vanish(now) if self.time_up(now) else []
        if self._state != "present":
            return out + self._after_vanishing(item, now)
        if item.direction is UP and is_end(item):
            self.disarm()  # the client left by itself first
        if isinstance(item, Chunk) and item.direction is UP:
            self.count_upstream(item)
        if isinstance(item, Chunk) and item.direction is DOWN:
            item, rest = self.split_downstream(item, now)
            if rest is not None:
                head = [item] if item.data else []
                return out + head + self._vanish(now) + self._after_vanishing(rest, now)
        return [*out, item]

    def deadline(self) -> float | None:
        return self.trigger_deadline()

    def on_deadline(self, now: float) -> list[Item]:
        return self._vanish(now) if self.time_up(now) else []

    def _vanish(self, now: float) -> list[Item]:
        self.disarm()
        self._state = "gone"
        self.report(
            now, "vanished", offset=self.downstream_bytes, event=self.downstream_events,
            how=self.how, client=self.client,
        )  # fmt: skip
        upstream: Item = Reset(UP) if self.how == "rst" else Eof(UP)
        return [upstream] + ([Reset(DOWN)] if self.client == "reset" else [])

    def _after_vanishing(self, item: Item, now: float) -> list[Item]:
        """Drop everything; with `how: close`, the first response bytes draw an RST."""
        closing = self.how == "close" and self._state == "gone"
        if closing and isinstance(item, Chunk) and item.direction is DOWN and item.data:
            self._state = "closed"
            self.report(now, "reset_by_closed_socket", offset=self.downstream_bytes)
            return [Reset(UP)]
        return []
