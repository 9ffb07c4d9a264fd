"""link: a named access network (wifi, lte, 3g, edge, satellite, loopback).

Imitates the last mile a phone or laptop streams over: a one-way delay of RTT/2 with
jitter, a bottleneck rate per direction, and packet loss. The numbers follow the
connectivity profiles of WebPageTest (`connectivity.ini.sample`: LTE 12 Mbps 70 ms,
3G 1.6 Mbps/768 Kbps 300 ms, Edge 240/200 Kbps 840 ms); Wi-Fi and geostationary
satellite (about 600 ms RTT: four 35 786 km legs take 480 ms, plus processing) are typical
values; the loss rates are illustrative (WebPageTest uses none).

Loss is modelled in user space as TCP repairs it for a thin stream such as SSE: a lost
segment arrives one retransmission timeout (RTO) late. RFC 6298 §2 computes
RTO = SRTT + 4·RTTVAR (here RTT + 4·jitter) with a 1 s floor; Linux uses a 200 ms
floor instead (TCP_RTO_MIN, include/net/tcp.h). Token streams write small pieces with
little behind them, so the three duplicate ACKs that fast retransmit needs (RFC 5681
§3.2) rarely come and the timer is what recovers. Since TCP delivers in order
(RFC 9293 §3.10.7.4), everything behind the lost segment waits too: head-of-line
blocking.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import ClassVar, Literal, get_args

from faults._lib.checks import check_choice, check_positive
from faults._lib.items import item_size
from faults._lib.timing import MSS, Queued, Serializer, Shaped
from middlebox.core.fault import Bytes, Fault, Seconds
from middlebox.core.stream import Direction, Item

ProfileName = Literal["wifi", "lte", "3g", "edge", "satellite", "loopback"]

TCP_RTO_MIN = 0.2
"""Linux's minimum retransmission timeout (TCP_RTO_MIN = HZ/5), below RFC 6298's 1 s."""


@dataclass(frozen=True)
class Profile:
    """One access network: RTT, one-way jitter (±), rates in bytes/s (0: unlimited), loss."""

    rtt: float
    jitter: float
    downstream_rate: int
    upstream_rate: int
    loss: float

    @property
    def rto(self) -> float:
        """RFC 6298 §2.3 with SRTT = rtt and RTTVAR = jitter, floored at Linux's 200 ms."""
        return max(TCP_RTO_MIN, self.rtt + 4 * self.jitter)

    def rate(self, direction: Direction) -> int:
        return self.downstream_rate if direction is Direction.DOWNSTREAM else self.upstream_rate


_MBIT = 1_000_000 // 8
PROFILES: dict[str, Profile] = {
    "wifi": Profile(0.020, 0.005, 30 * _MBIT, 15 * _MBIT, 0.001),
    "lte": Profile(0.070, 0.015, 12 * _MBIT, 12 * _MBIT, 0.005),
    "3g": Profile(0.300, 0.050, 1_600_000 // 8, 768_000 // 8, 0.01),
    "edge": Profile(0.840, 0.100, 240_000 // 8, 200_000 // 8, 0.02),
    "satellite": Profile(0.600, 0.030, 10 * _MBIT, 2 * _MBIT, 0.005),
    "loopback": Profile(0.0, 0.0, 0, 0, 0.0),
}
assert set(PROFILES) == set(get_args(ProfileName))


@dataclass
class Link(Shaped, Queued, Fault):
    """A named access network; any field set overrides the profile's number."""

    name: ClassVar[str] = "link"

    profile: ProfileName = "wifi"
    rtt: Seconds | None = None
    jitter: Seconds | None = None
    downstream_rate: Bytes | None = None
    upstream_rate: Bytes | None = None
    loss: float | None = None
    rto: Seconds | None = None
    segment: Bytes = MSS
    max_backlog: Bytes = 1024 * 1024

    effective: Profile = field(init=False, repr=False)
    _rto: float = field(init=False, repr=False)
    _serializer: Serializer = field(init=False, repr=False, default_factory=Serializer)

    def __post_init__(self) -> None:
        super().__post_init__()
        check_choice("profile", self.profile, ProfileName)
        base = PROFILES[self.profile]
        self.effective = Profile(
            rtt=base.rtt if self.rtt is None else self.rtt,
            jitter=base.jitter if self.jitter is None else self.jitter,
            downstream_rate=(
                base.downstream_rate if self.downstream_rate is None else self.downstream_rate
            ),
            upstream_rate=base.upstream_rate if self.upstream_rate is None else self.upstream_rate,
            loss=base.loss if self.loss is None else self.loss,
        )
        for name in ("rtt", "jitter", "downstream_rate", "upstream_rate"):
            check_positive(name, getattr(self.effective, name), allow_zero=True)
        if not 0.0 <= self.effective.loss <= 1.0:
            raise ValueError(f"loss is a fraction of segments in [0, 1], got {self.loss!r}")
        if self.rto is not None:
            check_positive("rto", self.rto)
        check_positive("segment", self.segment)
        self._rto = self.effective.rto if self.rto is None else self.rto

    def on_open(self, now: float) -> list[Item]:
        super().on_open(now)
        self.report(now, "link", profile=self.profile, rto=self._rto, **vars(self.effective))
        return []

    def on_item(self, item: Item, now: float) -> list[Item]:
        offset = self.count(item)
        direction = item.direction
        if not self.active(direction, now):
            return self.send(item, now, now)
        link = self.effective
        out: list[Item] = []
        for piece, finish in self._serializer.schedule(
            item, now, link.rate(direction), self.segment
        ):
            wobble = self.rng.uniform(-link.jitter, link.jitter) if link.jitter else 0.0
            release = finish + max(link.rtt / 2 + wobble, 0.0)
            if link.loss and self.rng.random() < link.loss:
                release += self._rto
                self.report(now, "loss", direction=direction.value, offset=offset, stall=self._rto)
            offset += item_size(piece)
            out.extend(self.send(piece, release, now))
        return out
