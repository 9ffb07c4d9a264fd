"""handoff: the device moves from one network to another mid-stream (Wi-Fi to LTE, back).

Imitates a phone leaving Wi-Fi: for `outage` seconds nothing crosses in either
direction (the old interface is gone, the new one is still attaching), and since no
segment is acknowledged the senders' windows close, so the proxy stops reading both
sides. What happens to the open TCP connection then depends on the path:

- `reset`: the connection was bound to the old address, so it dies: the OS or a
  carrier NAT answers the next segment with an RST (RFC 9293 §3.10.7.1), both ways.
- `blackhole`: packets to the old address are silently dropped forever (a NAT entry
  or firewall state that vanished): nothing arrives again and each side only learns
  of it by its own timeout, so a client without a read timeout hangs. The kernels
  give up after `give_up` seconds (Linux: tcp_retries2 = 15 retransmissions, 924.6 s
  per Documentation/networking/ip-sysctl.rst; RFC 1122 §4.2.3.5's R2), and then both
  sides are reset so the proxy can let go of the connection.
- `resume`: the address survived (same Wi-Fi, or a mobile network that keeps the IP),
  so TCP retransmits and what was held arrives in one burst.

Connections opened during the outage stall until it ends (`stall`: the SYN is
retransmitted, RFC 6298 §5) or are refused at once (`refuse`: the OS reports the
network unreachable). The outage is device-wide: its window is kept in the scenario's
shared state, so other connections open at the time go dark too (they notice at their
next item) and later connections start on the new network. It happens once per
scenario. Traffic before and after can take a `link` profile (`before_link`,
`after_link`), reusing `faults.link`'s numbers.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, ClassVar, Literal

from faults._lib.checks import check_choice, check_positive
from faults._lib.items import item_size
from faults._lib.triggers import Triggered
from faults.link import Link, ProfileName
from middlebox.core.fault import Fault, FaultContext, FaultReport, Seconds
from middlebox.core.stream import DOWN, UP, Chunk, Direction, Item, Reset

Outcome = Literal["reset", "blackhole", "resume"]
NewConnections = Literal["stall", "refuse"]
Phase = Literal["before", "dark", "after", "blackhole", "dead"]

TCP_GIVE_UP = 924.6
"""Seconds until Linux abandons an unacknowledged connection (tcp_retries2 = 15)."""


@dataclass
class Handoff(Triggered, Fault):
    """At `at` seconds from open or after `after_bytes` downstream bytes, go dark for `outage`."""

    name: ClassVar[str] = "handoff"

    outage: Seconds = 2.0
    outcome: Outcome = "resume"
    new_connections: NewConnections = "stall"
    before_link: ProfileName | None = None
    after_link: ProfileName | None = None
    give_up: Seconds | None = TCP_GIVE_UP

    _phase: Phase = field(init=False, repr=False, default="before")
    _dark_until: float = field(init=False, repr=False, default=0.0)
    _ending: Outcome = field(init=False, repr=False, default="resume")
    _give_up_at: float | None = field(init=False, repr=False, default=None)
    _held: list[Item] = field(init=False, repr=False, default_factory=list)
    _link: Link | None = field(init=False, repr=False, default=None)
    _seen_window: dict[str, Any] | None = field(init=False, repr=False, default=None)

    def __post_init__(self) -> None:
        super().__post_init__()
        check_positive("outage", self.outage, allow_zero=True)
        if self.give_up is not None:
            check_positive("give_up", self.give_up)
        check_choice("outcome", self.outcome, Outcome)
        check_choice("new_connections", self.new_connections, NewConnections)
        for name in ("before_link", "after_link"):
            if getattr(self, name) is not None:
                check_choice(name, getattr(self, name), ProfileName)

    # ------------------------------------------------------------------ hooks

    def on_open(self, now: float) -> list[Item]:
        window = self._window()
        if window is not None and window["start"] <= now < window["end"]:
            if self.new_connections == "refuse":
                self.report(now, "refused", until=window["end"])
                self._phase = "dead"
                return [Reset(DOWN), Reset(UP)]
            self.report(now, "stalled", until=window["end"])
            self._go_dark(window["end"], "resume")
        elif window is not None and now >= window["end"]:
            self._use_link(self.after_link, "after_link", now)
            self._phase = "after"
        else:
            self._use_link(self.before_link, "before_link", now)
            self.arm(now)
        return []

    def on_item(self, item: Item, now: float) -> list[Item]:
        out = self._catch_up(now)
        if self._phase == "before" and self.time_up(now):
            self._trigger(now)
        if self._phase == "before" and isinstance(item, Chunk) and item.direction is UP:
            self.count_upstream(item)
        if self._phase == "before" and isinstance(item, Chunk) and item.direction is DOWN:
            item, tail = self.split_downstream(item, now)
            if item.data:
                out.extend(self._through_link(item, now))
            if tail is not None:
                self._trigger(now)
                if tail.data:
                    self._held.append(tail)
            return out
        if self._phase == "dark":
            self._held.append(item)
        elif self._phase in ("before", "after"):
            out.extend(self._through_link(item, now))
        return out

    def deadline(self) -> float | None:
        if self._phase == "dark":
            return self._dark_until
        if self._phase == "blackhole":
            return self._give_up_at
        due: list[float | None] = [] if self._link is None else [self._link.deadline()]
        if self._phase == "before":
            due.append(self.trigger_deadline())
        times = [t for t in due if t is not None]
        return min(times) if times else None

    def on_deadline(self, now: float) -> list[Item]:
        out = self._catch_up(now)
        if self._link is not None and self._phase in ("before", "after"):
            due = self._link.deadline()
            if due is not None and due <= now:
                out.extend(self._link.on_deadline(now))
        if self._phase == "before" and self.time_up(now):
            self._trigger(now)
        if self._phase == "dark" and now >= self._dark_until:
            out.extend(self._end_outage(now))
        if self._phase == "blackhole" and self._give_up_at is not None and now >= self._give_up_at:
            self.report(now, "gave_up", after=self.give_up)
            self._phase = "dead"
            out.extend([Reset(UP), Reset(DOWN)])
        return out

    def reading_paused(self, source: Direction) -> bool:
        if self._phase in ("dark", "blackhole"):
            return True  # nothing is acknowledged, so the sender's window closes
        return self._link is not None and self._link.reading_paused(source)

    # ---------------------------------------------------------------- phases

    def _window(self) -> dict[str, Any] | None:
        """The scenario's outage, once one is stored. It is stored once (`setdefault`) and
        never changed, so a window read is kept for the connection: with `--state redis://`
        every read is a round trip, and a stream would otherwise pay one per item."""
        if self._seen_window is None:
            self._seen_window = self.context.shared.get("outage")
        return self._seen_window

    def _catch_up(self, now: float) -> list[Item]:
        """Join an outage another connection started (or apply its outcome if it is over)."""
        if self._phase != "before":
            return []  # in or past the outage: nothing to join, no store read
        window = self._window()
        if window is None or now < window["start"]:
            return []
        self.report(now, "outage_seen", start=window["start"], end=window["end"])
        self._go_dark(window["end"], window["outcome"])
        return self._end_outage(now) if now >= window["end"] else []

    def _trigger(self, now: float) -> None:
        end = now + self.outage
        self.report(
            now, "outage", offset=self.downstream_bytes, event=self.downstream_events,
            until=end, outcome=self.outcome,
        )  # fmt: skip
        window: dict[str, Any] = {"start": now, "end": end, "outcome": self.outcome}
        # setdefault, one atomic step: when two connections (maybe in two workers) trigger
        # at once, both follow the outage that was stored first, as one network does.
        stored: dict[str, Any] = self.context.shared.setdefault("outage", window)
        if stored != window:
            self._go_dark(stored["end"], stored["outcome"])
            return
        self._go_dark(end, self.outcome)

    def _go_dark(self, until: float, ending: Outcome) -> None:
        if self._link is not None:
            self._held.extend(self._link.drain())  # still in flight on the old network
        self._phase = "dark"
        self._dark_until = until
        self._ending = ending
        self.disarm()

    def _end_outage(self, now: float) -> list[Item]:
        held, self._held = self._held, []
        size = sum(item_size(item) for item in held)
        self.report(now, self._ending, held_items=len(held), held_bytes=size)
        if self._ending != "resume":
            self._link = None
            if self._ending == "reset":
                self._phase = "dead"
                return [Reset(UP), Reset(DOWN)]
            self._phase = "blackhole"
            self._give_up_at = None if self.give_up is None else now + self.give_up
            return []
        self._phase = "after"
        self._use_link(self.after_link, "after_link", now)
        out: list[Item] = []
        for item in held:
            out.extend(self._through_link(item, now))
        return out

    # ---------------------------------------------------------------- helpers

    def _use_link(self, profile: ProfileName | None, label: str, now: float) -> None:
        if profile is None:
            self._link = None
            return
        link = Link(profile=profile)

        def relay(entry: FaultReport) -> None:
            self.report(entry.time, f"{label}.{entry.action}", **entry.details)

        # The link shares this fault's rng, so one seed fixes both one's decisions.
        link.bind(FaultContext(self.context.connection_id, self.rng, relay, {}))
        link.on_open(now)
        self._link = link

    def _through_link(self, item: Item, now: float) -> list[Item]:
        return [item] if self._link is None else self._link.on_item(item, now)
