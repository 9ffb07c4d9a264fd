"""The fault contract and the per-connection pipeline (pure).

A fault is a small per-connection state machine in the sans-IO style of h11 and
toxiproxy's toxics: `on_open(now)`, `on_item(item, now)` and `on_deadline(now)` each
return the items to pass on, and `deadline()` says when it next wants to be woken.
It never sleeps, reads a clock, touches a socket or uses the global `random`: time
comes in as `now` (seconds, float) and randomness from the seeded `random.Random`
injected by `bind`. That makes every fault testable on a virtual clock in
microseconds and every run replayable from its seed.

Configuration is dataclass fields (durations `Seconds`, sizes `Bytes`); per-connection
state fields are `field(init=False, repr=False)` so `repr()` shows the config only.

A `Pipeline` is a fault made of faults in path order, client side first. An item a
fault emits travels on from that fault's position in the item's own direction:
UPSTREAM items towards the last fault and then the server, DOWNSTREAM items towards
the first fault and then the client. So a fault can answer the client itself (a 503
before the request reaches the server) or reset both sides at once.

The shell drives a pipeline through `open`, `feed` and `wake`, each answering with the
`Effects` of the call: what the connection must do (the items to write, when to wake it
next, which sides to stop reading, whether the path went empty or a stage ended the
connection). It never polls the pipeline or its faults between calls.
"""

from __future__ import annotations

import enum
import random
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Annotated, Any, ClassVar, Protocol, TypeVar, cast

from middlebox.core.framed import (
    BodyLane,
    FramedStream,
    FramingLayout,
    ItemPass,
    PathFraming,
    Position,
)
from middlebox.core.scenario_state import SharedState, for_fault
from middlebox.core.stream import Chunk, Direction, Item


class Unit:
    """Markers for `Annotated` config fields, so YAML may write `800ms` or `4KiB`."""

    SECONDS = "seconds"
    BYTES = "bytes"


Seconds = Annotated[float, Unit.SECONDS]
"""A duration in seconds; YAML accepts a number of seconds or `250ms`, `2s`, `1.5min`."""

Bytes = Annotated[int, Unit.BYTES]
"""A size in bytes; YAML accepts an integer or `512B`, `4KiB`, `1MiB`."""


class StageEvent(enum.Enum):
    """What one of the proxy's own stages (faults/_proxy) did when it reports: the server
    counts it (`ServerCounters.count_stage`) and journals it as how one side of the
    connection ended: the leg, the direction of the items that side produced, and the end
    kind (docs/observability.md's end kinds)."""

    HEADER_TIMEOUT = ("client", Direction.UPSTREAM, "header_timeout")
    REQUEST_TIMEOUT = ("client", Direction.UPSTREAM, "request_timeout")
    READ_TIMEOUT = ("upstream", Direction.DOWNSTREAM, "read_timeout")
    UNFRAMEABLE_REQUEST = ("client", Direction.UPSTREAM, "unframeable")
    UNFRAMEABLE_RESPONSE = ("upstream", Direction.DOWNSTREAM, "unframeable")

    @property
    def leg(self) -> str:
        return self.value[0]

    @property
    def direction(self) -> Direction:
        return self.value[1]

    @property
    def end(self) -> str:
        return self.value[2]


@dataclass(frozen=True, slots=True)
class FaultReport:
    """What a fault did, for the journal: `fired` proves a declared fault took effect."""

    fault: str
    time: float
    action: str
    details: dict[str, Any]
    stage_event: StageEvent | None = None
    """Set when one of the proxy's own stages reports (`Fault.stage_event`)."""


ReportSink = Callable[[FaultReport], None]


REPORTS_KEPT = 100
"""The reports a fault keeps per action on one connection (`Fault.reports`); past them it
counts (`Fault.reports_more`). A fault that decides per item (a `coalescer` flush, a
`slicer` slice) reports once per item: a day-long stream would otherwise hold millions
(2.5 million flushes, 700 MiB, in 3.6 GB through `coalescer`). A hundred show the pattern
in tests, the journal and the pcap comments; the journal keeps the same and says how many
more (`fault_more` lines, docs/observability.md). The sink (`FaultContext.report`) still
hears every report, so `/metrics` counts them all."""

_T = TypeVar("_T")


class FaultRandom(Protocol):
    """The draws a fault makes from its seeded generator (`self.rng`): what faults/ calls
    (`random`, `uniform`, `randint`, `choice`, `getrandbits`), so mypy checks every draw
    against both generators a fault may hold: a `random.Random` (a fault bound on its
    own, `faults.testing`) and the pipeline's `LazyRandom`."""

    def random(self) -> float: ...

    def uniform(self, a: float, b: float) -> float: ...

    def randint(self, a: int, b: int) -> int: ...

    def choice(self, seq: Sequence[_T]) -> _T: ...

    def getrandbits(self, k: int, /) -> int: ...


# FaultRandom's methods: a LazyRandom keeps its generator's own bound methods for these.
_DRAWS = ("random", "uniform", "randint", "choice", "getrandbits")


class LazyRandom:
    """A `random.Random(seed)` made on its first use: until then it is the seed.

    Seeding costs about 6 µs (624 words of state), and a connection's pipeline binds
    every fault with its own generator while most faults never draw one number (a
    header rewrite, a timeout, a zero-delay latency): setup paid that for nothing. And a
    `random.Random` carries that state inline, 2.5 KiB allocated with the object whether
    seeded or not: five of them were 12.5 KiB of a three-fault connection's 42 (tracemalloc
    of a bound pipeline after 20 SSE frames). So this is not a `Random` but stands for
    one (faults only call its methods): the generator is made on the first attribute it
    is asked for, and its methods are then kept on this object, so later draws call the
    generator's own C methods directly. The seed is drawn at bind time in path order, so
    a fault draws exactly the numbers `random.Random(seed)` would: replays unchanged.
    """

    def __init__(self, seed: int | str | SeedAt) -> None:
        self._seed_later: int | str | SeedAt | None = seed
        self._generator: random.Random | None = None

    def _generate(self) -> random.Random:
        generator = self._generator
        if generator is None:
            seed = self._seed_later
            if isinstance(seed, tuple):  # SeedAt: no generator takes a tuple as its seed
                seed = seed[0].seed_at(seed[1])
            generator = self._generator = random.Random(seed)
            self._seed_later = None
            # The draws' bound methods on this object: an instance attribute comes before
            # the class's methods below, so later draws call the generator's C methods.
            for name in _DRAWS:
                self.__dict__[name] = getattr(generator, name)
        return generator

    # FaultRandom's methods, typed; each is called at most once (it seeds the generator).
    def random(self) -> float:
        return self._generate().random()

    def uniform(self, a: float, b: float) -> float:
        return self._generate().uniform(a, b)

    def randint(self, a: int, b: int) -> int:
        return self._generate().randint(a, b)

    def choice(self, seq: Sequence[_T]) -> _T:
        return self._generate().choice(seq)

    def getrandbits(self, k: int, /) -> int:
        return self._generate().getrandbits(k)

    def __getattr__(self, name: str) -> Any:
        # Reached only for names this object does not have: the generator's others
        # (`seed`, `gauss`, `getstate`...), which no fault calls today.
        if name.startswith("__"):
            raise AttributeError(name)  # copy and pickle probes: not the generator's
        value = getattr(self._generate(), name)
        if callable(value):
            self.__dict__[name] = value  # the bound method: found directly from now on
        return value


class ConnectionRandom(LazyRandom):
    """A connection's generator, `random.Random(seed)`, made on its first use like any
    `LazyRandom`; `Pipeline.bind` takes from it each fault's seed, its next 64-bit draw,
    without making it (`fault_random`). A pass-through connection's faults (the proxy's
    own stages) never draw, so setup no longer seeds the 624-word state for each one
    (about 4% of a connection's CPU under `loadc connect`). When it is made, it draws the
    seeds it handed out first, in order: each fault, and any draw from this generator
    itself afterwards, gets the number an eager `random.Random(seed)` would have given."""

    def __init__(self, seed: int | str) -> None:
        super().__init__(seed)
        self._drawn: list[int] = []
        self._handed = 0

    def fault_random(self) -> LazyRandom:
        """A generator seeded by this one's next 64-bit draw, made when the fault draws."""
        index = self._handed
        self._handed += 1
        if self._generator is not None:
            self._drawn.append(self._generator.getrandbits(64))
            return LazyRandom(self._drawn[index])
        return LazyRandom((self, index))

    def seed_at(self, index: int) -> int:
        self._generate()
        return self._drawn[index]

    def _generate(self) -> random.Random:
        generator = super()._generate()
        drawn = self._drawn
        while len(drawn) < self._handed:
            drawn.append(generator.getrandbits(64))
        return generator


SeedAt = tuple[ConnectionRandom, int]
"""The `index`-th seed a `ConnectionRandom` handed out, drawn when it is needed: a plain
tuple, made in C (a frozen dataclass's `__init__` was 1 µs a fault, per connection)."""


@dataclass(slots=True)
class FaultContext:
    """What the shell hands each fault of a new connection.

    `shared` is one mapping per fault position in the scenario, kept for the scenario's
    lifetime, for decisions that span connections ("the first three requests get a
    429"): a dict in one proxy process (driven from one thread, so it needs no lock) or
    a store shared by workers and proxies (`middlebox.core.scenario_state`); counters go
    through `scenario_state.increment`, which is atomic on both.
    """

    connection_id: int = 0
    rng: FaultRandom = field(default_factory=lambda: random.Random(0))
    report: ReportSink | None = None
    shared: SharedState = field(default_factory=dict)
    framing: Position | None = None
    """The framed streams at this fault's place in the path (`middlebox.core.framed`),
    set by the `Pipeline` when a fault in it reads HTTP; None for a fault on its own,
    which then frames what it sees itself."""
    client_mss: int | None = None
    """The path MSS the proxy has toward the client (TCP_MAXSEG on the accepted socket:
    65,483 on loopback, 1,448 on Ethernet), set by the shell; None when unknown."""


@dataclass
class Fault:
    """Base class: passes everything through and never wants a deadline.

    Subclasses set `name` (the YAML name, equal to the module name) and override the
    hooks they need. Hooks return lists; an empty list swallows the item.
    """

    name: ClassVar[str] = "passthrough"
    stage_event: ClassVar[StageEvent | None] = None
    """Set by the proxy's own stages (faults/_proxy): what each of its reports means to
    the server (`StageEvent`); None for a scenario's fault."""
    shared_in_process: ClassVar[bool] = False
    """True for a fault whose `shared` values are changed in place (a list appended to):
    the shell then gives it a dict of its process rather than a store shared by workers
    and proxies, whose values are copies (`middlebox.core.scenario_state`)."""

    rng: FaultRandom = field(init=False, repr=False, compare=False)
    context: FaultContext = field(init=False, repr=False, compare=False)
    reports: list[FaultReport] = field(init=False, repr=False, compare=False)
    """The first `REPORTS_KEPT` reports of each action on this connection."""
    report_counts: dict[str, int] = field(init=False, repr=False, compare=False)
    """Every report's action, counted (kept or not): `reports_more` is what is past."""
    aside: frozenset[Direction] = field(init=False, repr=False, compare=False, default=frozenset())
    """The directions this fault steps aside for, now: set by the fault itself (in a hook)
    when it would hand every item of such a direction on unchanged and needs to see
    none of them (a zero delay that has reported, a rewriter with nothing left to
    decide). The pipeline then passes those items over it without calling `on_item`, as
    if it had passed them on; it sets `aside` again when that stops. Not for a direction
    whose framed pieces it reads (`HttpMatched.observe`) or publishes: its place's
    reader or stream would fall behind (that is `body_aside`)."""
    body_aside: ItemPass | None = field(init=False, repr=False, compare=False, default=None)
    """Set by a fault that reads a direction's framing but needs to see only its heads and
    message ends (a head rewriter): its place in that direction's framed stream. The
    pipeline then passes over it every item of `body_aside.direction` whose bytes are all
    body of the message under way there, without calling `on_item`: it advances the
    fault's reader over them and publishes their pieces for it (`BodyPass.passes`), so
    the next head, a message's end or anything the framer holds reaches `on_item` with
    the fault's framing exactly where a call per item would have left it. The fault
    sets it back to None to see every item again, in one of its hooks (as it sets
    `aside`): between calls, the pipeline may have passed it over for reads it is told of
    only when the next call comes (`BodyLane`). Another `ItemPass` may pass over it
    other items whose `on_item` would only hand them on (a stage that watches a framer's
    refusal: a read framed whole with none)."""

    def bind(self, context: FaultContext) -> None:
        """Attach the per-connection context; called once, before `on_open`."""
        self.context = context
        self.rng = context.rng
        self.reports = []
        self.report_counts = {}

    def on_open(self, now: float) -> list[Item]:
        return []

    def on_item(self, item: Item, now: float) -> list[Item]:
        return [item]

    def on_deadline(self, now: float) -> list[Item]:
        return []

    def deadline(self) -> float | None:
        return None

    def reading_paused(self, source: Direction) -> bool:
        """True to stop reading the socket that produces `source` items, for now.

        This is how a fault exerts backpressure (a slow reader, a full bandwidth
        backlog): the shell stops reading, the kernel buffers fill and TCP's window
        closes on the sender, as with a real slow hop. Re-checked after every hook.
        """
        return False

    def reads_http(self) -> bool:
        """True when this fault reads the HTTP/SSE framing of what passes (the pipeline
        then frames each stream once for every such fault, `middlebox.core.framed`)."""
        return False

    def reads_sse(self) -> bool:
        """True when this fault also reads the SSE lines of event-stream bodies (framed
        only when some fault reads them)."""
        return False

    def reads_client_mss(self) -> bool:
        """True when this fault reads `context.client_mss`: the shell asks the accepted
        socket for it (a `getsockopt`) only for a path with such a fault."""
        return False

    def changes(self) -> frozenset[Direction]:
        """The directions in which this fault may emit bytes it did not receive in that
        order (rewrite, inject, drop mid-stream). Faults past it read a new stream."""
        return frozenset()

    def publishes(self) -> frozenset[Direction]:
        """Of `changes()`, the directions whose output pieces this fault publishes itself
        to `context.framing.publish[direction]` (it knows what it wrote); the pipeline
        frames the output of the others once."""
        return frozenset()

    def leave(self) -> None:
        """This fault was taken out of a live pipeline (a stage that stepped aside)."""

    def socket_buffers(self) -> dict[str, int]:
        """Socket buffer sizes to set (SO_RCVBUF/SO_SNDBUF) on this connection's sockets.

        Keys: `client_rcvbuf`, `client_sndbuf`, `upstream_rcvbuf`, `upstream_sndbuf`.
        Small buffers make backpressure reach the peer quickly (a slow mobile reader).
        """
        return {}

    def report(self, now: float, action: str, **details: Any) -> None:
        """Record a decision ("fired at byte N / event K / time T") for the journal."""
        entry = FaultReport(self.name, now, action, details, self.stage_event)
        counts = self.report_counts
        seen = counts.get(action, 0)
        counts[action] = seen + 1
        if seen < REPORTS_KEPT:
            self.reports.append(entry)
        if self.context.report is not None:
            self.context.report(entry)

    @property
    def reports_more(self) -> dict[str, int]:
        """Per action, the reports counted past the first `REPORTS_KEPT` (not kept)."""
        return {
            action: count - REPORTS_KEPT
            for action, count in self.report_counts.items()
            if count > REPORTS_KEPT
        }

    @property
    def fired(self) -> bool:
        return bool(self.reports)


class ProxyStage(Protocol):
    """A stage of the proxy's own behaviour in the pipeline (faults/_proxy), as the pipeline
    sees it: two flags, read after each call that reaches a stage (never per byte)."""

    @property
    def finished(self) -> bool:
        """It passes everything through from now on and never wants a deadline."""
        ...

    @property
    def connection_closed(self) -> bool:
        """It ended the connection (FINs or RSTs both ways) and wants no more of it."""
        ...


_STAGE_ATTRIBUTES = ("finished", "connection_closed")
_IS_STAGE: dict[type, bool] = {}


def proxy_stages(faults: Sequence[Fault]) -> list[ProxyStage]:
    """The faults that are `ProxyStage`s, decided once per class: a runtime Protocol
    check (`isinstance` against a `runtime_checkable` Protocol) walks the protocol's
    attributes every time, about 50-80 µs per fault on this machine, for every
    connection; the attributes are the class's properties, so the class decides."""
    found: list[ProxyStage] = []
    for fault in faults:
        kind = type(fault)
        known = _IS_STAGE.get(kind)
        if known is None:
            known = _IS_STAGE[kind] = all(hasattr(kind, name) for name in _STAGE_ATTRIBUTES)
        if known:
            found.append(cast(ProxyStage, fault))
    return found


@dataclass(frozen=True, slots=True)
class ResetStream:
    """RST_STREAM with `error_code` toward the client; the stream's relay is reset upstream."""

    stream_id: int
    error_code: int


@dataclass(frozen=True, slots=True)
class SendGoaway:
    """GOAWAY naming the last stream served (RFC 9113 §6.8): newer streams are refused with
    REFUSED_STREAM, the connection closes once the streams up to it have ended."""

    last_stream_id: int
    error_code: int = 0


@dataclass(frozen=True, slots=True)
class DropConnection:
    """The TCP connection goes (`how: rst` an RST, `fin` a close without GOAWAY): every
    multiplexed stream dies at once, each relay is reset upstream."""

    how: str = "rst"


Command = ResetStream | SendGoaway | DropConnection
"""What a connection carrying multiplexed streams must do (HTTP/2's connection-level faults,
core/h2_faults.py), carried in `Effects.commands`."""


_NOT_PAUSED: frozenset[Direction] = frozenset()
_PAUSED = {
    (False, False): _NOT_PAUSED,
    (True, False): frozenset({Direction.UPSTREAM}),
    (False, True): frozenset({Direction.DOWNSTREAM}),
    (True, True): frozenset(Direction),
}


@dataclass(slots=True)
class Effects:
    """What a pipeline call asks of the connection, all of it (the shell's `apply`)."""

    items: list[Item]
    """To write, in order, each toward the peer its direction goes to."""
    wake: float | None = None
    """When to call `Pipeline.wake` next, at the latest (`Pipeline.feed` may keep an earlier
    one: that wake finds nothing due); None: no fault wants waking."""
    paused: frozenset[Direction] = _NOT_PAUSED
    """The sources whose socket to stop reading now (`Fault.reading_paused`); reading
    resumes when a later call's effects leave a source out."""
    passthrough: bool = False
    """The path is empty now (every stage stepped aside for the rest of the connection):
    what is read may go straight to the other side, unframed and unrouted."""
    ended: bool = False
    """A stage ended the connection (`ProxyStage.connection_closed`): close it once the
    items are written, without waiting for the peers' FINs (nginx's `close()`)."""
    commands: tuple[Command, ...] = ()
    """What the HTTP/2 connection carrying the streams must do, in order (`H2Faults`): an
    RST_STREAM, a GOAWAY, the connection dropped."""


class Pipeline(Fault):
    """Faults in path order (client side first), driven as one fault.

    Routing is depth-first, so items keep their order within each direction.
    The pipeline's deadline is the earliest of its faults' deadlines.
    """

    name: ClassVar[str] = "pipeline"

    def __init__(self, faults: Iterable[Fault] = ()) -> None:
        self._faults: list[Fault] = list(faults)
        # Tuples: the empty one is shared, so a pass-through pipeline holds none of its own.
        self._timed: tuple[Fault, ...] = ()
        self._pausing: tuple[Fault, ...] = ()
        self._overrides()
        # The proxy's own stages in it (`ProxyStage`), told by the shell (`set_stages`).
        self.stages: tuple[ProxyStage, ...] = ()
        self.framing: PathFraming | None = None
        self.layout: PipelineLayout | None = None  # what `bind` bound it with
        # (id of a fault, direction) -> the stream its output there is framed into
        self._fed_after: dict[tuple[int, Direction], FramedStream] = {}
        # The last call's effects but its items (wake, paused, passthrough, ended: not the
        # items, whose bytes it would keep alive), and whether this call reached a fault's
        # hook: a call that only passed items over faults stepping aside keeps them (`feed`).
        self._kept: tuple[float | None, frozenset[Direction], bool, bool] | None = None
        self._reached = False
        # Responses' body reads passed over every fault at once (`BodyLane`), while open;
        # `_lanes`: whether the framing's shape allows one at all (`PipelineLayout`).
        self._lane: BodyLane | None = None
        self._lanes = False
        self._response_streams: list[FramedStream] | None = None  # made on the first try
        # The faults refused a lane since a hook last ran: only a hook changes their asides,
        # so the reads passed over until then are not asked again (`_open_lane`).
        self._lane_refused = False

    @property
    def faults(self) -> list[Fault]:
        return self._faults

    @faults.setter
    def faults(self, faults: list[Fault]) -> None:
        """The shell takes a stage that stepped aside out of a live pipeline; it lets go
        of its place in the framing (its readers would hold the streams' pieces)."""
        if self._lane is not None:
            self._close_lane()
        kept = {id(fault) for fault in faults}
        for fault in self._faults:
            if id(fault) not in kept:
                fault.leave()
        self._faults = list(faults)
        self._kept = None
        self._overrides()

    def _overrides(self) -> None:
        """The faults whose class has a deadline or pauses reading at all: the others
        answer None and False always, so `deadline` and the effects skip them."""
        timed: list[Fault] = []
        pausing: list[Fault] = []
        for fault in self._faults:
            kind = type(fault)
            if kind.deadline is not Fault.deadline:
                timed.append(fault)
            if kind.reading_paused is not Fault.reading_paused:
                pausing.append(fault)
        self._timed = tuple(timed) if timed else ()
        self._pausing = tuple(pausing) if pausing else ()

    def set_stages(self, stages: Sequence[ProxyStage]) -> None:
        """Which of its faults are the proxy's own stages (`ProxyStage`): a stage that has
        `finished` leaves the pipeline, one that has `connection_closed` ends the
        connection (`Effects`)."""
        if self._lane is not None:
            self._close_lane()
        self.stages = tuple(stages)
        self._kept = None

    # ------------------------------------------------------------- the shell's calls

    def open(self, now: float) -> Effects:
        """`on_open`, and what the connection must do."""
        return self.effects(self.on_open(now))

    def _close_lane(self) -> None:
        """Tell the faults what passed them in the lane, before anything else reaches them."""
        lane = self._lane
        if lane is not None:
            self._lane = None
            lane.close()

    def _open_lane(self) -> None:
        """A lane for the next response body reads, if every fault and stream allows one
        (`BodyLane.open`); called after a read passed over all of them."""
        framing = self.framing
        assert framing is not None
        entry = framing.down_at[framing.size]
        if not entry.skips_body():
            return  # the cheap test first (a read that ended inside a chunk: the next may do)
        faults = self._faults
        places = []
        for index in range(len(faults) - 1, -1, -1):  # the order a response reaches them
            fault = faults[index]
            if Direction.DOWNSTREAM not in fault.aside:
                if fault.body_aside is None:
                    self._lane_refused = True
                    return
                places.append(fault.body_aside)
        streams = self._response_streams
        if streams is None:
            streams = list({id(stream): stream for stream in framing.down_at}.values())
            self._response_streams = streams
        self._lane = BodyLane.open(entry, streams, places)
        self._lane_refused = self._lane is None

    def feed(self, item: Item, now: float) -> Effects:
        """`on_item`, and what the connection must do.

        When the item only passed over faults stepping aside (`Fault.aside`, an
        `ItemPass`: nearly every body read of a stream), no hook ran, so no stage
        finished or closed, no fault started or stopped pausing and no deadline came
        nearer (a pass may only move one later, a read timer re-armed, or clear it, a
        response's end passed over): the last call's effects hold, with these items.
        Their wake may then be earlier than the faults' deadline now, or stand where
        none is left; `wake` at that time finds nothing due and answers what is, as a
        lazy timer does. An end of stream always gets fresh effects: the connection may
        be over, and a stale wake would hold it open until that time.

        After such a response read, the next ones that are all body of the same message
        (whole chunks: an SSE stream's frames) go through a `BodyLane` where the faults
        allow it: out as they came, with those effects, and the faults told the sums
        before any other call reaches them."""
        lane = self._lane
        if lane is not None:
            kept = self._kept  # set whenever a lane is open
            if (
                kept is not None
                and type(item) is Chunk
                and item.direction is Direction.DOWNSTREAM
                and lane.take(item.data, now)
            ):
                return Effects([item], *kept)
            self._close_lane()
        self._reached = False
        items = self.on_item(item, now)
        kept = self._kept
        if self._reached or kept is None or type(item) is not Chunk:
            return self.effects(items)
        if self._lanes and not self._lane_refused and item.direction is Direction.DOWNSTREAM:
            self._open_lane()
        return Effects(items, *kept)

    def wake(self, now: float) -> Effects:
        """`on_deadline` if a fault is due by `now`, and what the connection must do."""
        if self._lane is not None:
            self._close_lane()
        due = self.deadline()
        return self.effects(self.on_deadline(now) if due is not None and due <= now else [])

    def effects(self, items: list[Item]) -> Effects:
        """`items` and the state after the call that made them: a stage that has finished
        steps aside (leaves the pipeline) for the rest of the connection. Loops rather
        than generator expressions: this runs after every call, on every connection."""
        self._lane_refused = False  # a hook may have run: the faults may allow a lane now
        ended = False
        stages = self.stages
        if stages:
            for stage in stages:
                if stage.finished:
                    gone = {id(each) for each in stages if each.finished}
                    self.stages = stages = tuple(s for s in stages if id(s) not in gone)
                    self.faults = [fault for fault in self._faults if id(fault) not in gone]
                    break
            for stage in stages:
                if stage.connection_closed:
                    ended = True
                    break
        paused = _NOT_PAUSED
        pausing = self._pausing
        if pausing:
            up = down = False
            for fault in pausing:
                up = up or fault.reading_paused(Direction.UPSTREAM)
                down = down or fault.reading_paused(Direction.DOWNSTREAM)
            paused = _PAUSED[up, down]
        wake = self.deadline() if self._timed else None
        passthrough = not self._faults
        self._kept = (wake, paused, passthrough, ended)
        return Effects(items, wake, paused, passthrough, ended)

    def __repr__(self) -> str:
        return f"Pipeline({self.faults!r})"

    def bind(
        self,
        context: FaultContext,
        shared: Sequence[SharedState] | None = None,
        layout: PipelineLayout | None = None,
    ) -> None:
        """Bind every fault with its own rng drawn from the connection's, in path order.

        `shared` gives each fault position its scenario-lifetime state (the server keeps
        them); without it the faults share the connection context's. `layout` is what
        binding works out from the faults' classes and config alone (`PipelineLayout.of`
        on faults built from the same config: the server computes it once per scenario);
        without it, it is worked out here.
        """
        faults = self._faults
        if layout is None or not layout.fits(faults):
            layout = PipelineLayout.of(faults)
        self.layout = layout
        self.context = context
        self.rng = context.rng
        self.reports = []
        self.report_counts = {}
        framing = None
        if layout.framing is not None:
            # Frame once: each stream of the path is framed by one pass that
            # every HTTP-aware fault here reads.
            framing = PathFraming.from_layout(layout.framing)
            self._fed_after = {
                (id(faults[index]), direction): stream
                for (index, direction), stream in framing.fed_after.items()
            }
        self.framing = framing
        self._lanes = layout.response_lanes
        connection_id, report, mss = context.connection_id, context.report, context.client_mss
        rng = context.rng
        if isinstance(rng, ConnectionRandom):
            seeded = rng.fault_random  # each seed drawn when that fault first draws
        else:
            draw = rng.getrandbits
            seeded = lambda: LazyRandom(draw(64))  # noqa: E731
        for index, fault in enumerate(faults):
            fault.bind(
                FaultContext(
                    connection_id,
                    seeded(),
                    report,
                    for_fault(
                        shared[index] if shared is not None else context.shared,
                        layout.shared_in_process[index],
                    ),
                    framing.position(index) if framing is not None else None,
                    mss,
                )
            )

    def on_open(self, now: float) -> list[Item]:
        if self._lane is not None:
            self._close_lane()
        out: list[Item] = []
        for index, fault in enumerate(self.faults):
            for item in fault.on_open(now):
                self._route(index, item, now, out)
        return out

    def on_item(self, item: Item, now: float) -> list[Item]:
        if self._lane is not None:
            self._close_lane()
        faults = self._faults
        if not faults:
            return [item]
        out: list[Item] = []
        framing = self.framing
        upstream = item.direction is Direction.UPSTREAM
        if framing is not None:
            # the stream what enters the path in this direction is framed into (`entry`)
            stream = framing.up_at[0] if upstream else framing.down_at[framing.size]
            if isinstance(item, Chunk):
                stream.feed(item.data)
            else:
                stream.feed_eof()
        self._onward(0 if upstream else len(faults) - 1, item, now, out)
        return out

    def on_deadline(self, now: float) -> list[Item]:
        if self._lane is not None:
            self._close_lane()
        out: list[Item] = []
        for index, fault in enumerate(self.faults):
            due = fault.deadline()
            if due is not None and due <= now:
                for item in fault.on_deadline(now):
                    self._route(index, item, now, out)
        return out

    def deadline(self) -> float | None:
        if self._lane is not None:
            self._close_lane()
        earliest: float | None = None
        for fault in self._timed:
            due = fault.deadline()
            if due is not None and (earliest is None or due < earliest):
                earliest = due
        return earliest

    def reading_paused(self, source: Direction) -> bool:
        if self._lane is not None:
            self._close_lane()
        return any(fault.reading_paused(source) for fault in self._pausing)

    def between_messages(self) -> bool:
        """No message under way (the path's framing says) and no fault but the proxy's
        own stages wants waking (holds anything). Unframed, it cannot say: False."""
        if self._lane is not None:
            self._close_lane()
        framing = self.framing
        if framing is None:
            return False
        stages = {id(stage) for stage in self.stages}
        held = any(f.deadline() is not None for f in self._timed if id(f) not in stages)
        return not held and framing.between_messages()

    def release(self) -> None:
        """The connection is over (the shell closed it): let go of what ties its faults
        and framed streams into cycles (each fault's body pass refers back to it, each
        reader to its stream), so all of it is freed by reference counting with the
        relay, not by the cyclic collector. Nothing is called on it after this."""
        self._lane = None
        self._response_streams = None
        for fault in self._faults:
            fault.body_aside = None
        if self.framing is not None:
            self.framing.release()

    def reads_client_mss(self) -> bool:
        layout = self.layout
        if layout is not None:
            return layout.reads_client_mss
        return any(fault.reads_client_mss() for fault in self._faults)

    def set_client_mss(self, mss: int | None) -> None:
        """The shell's fact about the client link (`FaultContext.client_mss`), once the
        accepted socket is known, for every fault bound to this connection."""
        self.context.client_mss = mss
        for fault in self.faults:
            fault.context.client_mss = mss

    def socket_buffers(self) -> dict[str, int]:
        merged: dict[str, int] = {}
        for fault in self.faults:
            for key, size in fault.socket_buffers().items():
                merged[key] = min(size, merged.get(key, size))
        return merged

    @property
    def fired(self) -> bool:
        return any(fault.fired for fault in self.faults)

    def _deliver(self, index: int, item: Item, now: float, out: list[Item]) -> None:
        """Hand `item` to the fault at `index` and what it emits on along the path.

        A loop rather than a call per stage: an item that a fault passes on as one item
        in its own direction (nearly every item) goes on to the next stage in this same
        frame, and a fault that steps aside for the item's direction (`Fault.aside`) is
        passed over without a call, as if it had handed the item on unchanged; so is one
        that steps aside for a body (`Fault.body_aside`) when the item's bytes are all
        body at its place, its framing kept in step for it."""
        faults = self._faults
        count = len(faults)
        fed_after = self._fed_after
        self._reached = True
        while True:
            fault = faults[index]
            emitted = fault.on_item(item, now)
            if len(emitted) != 1:
                for each in emitted:
                    self._route(index, each, now, out)
                return
            item = emitted[0]
            direction = item.direction
            if fed_after:
                stream = fed_after.get((id(fault), direction))
                if stream is not None:
                    _feed(stream, item)  # this fault may have changed the bytes
            step = 1 if direction is Direction.UPSTREAM else -1
            index += step
            while 0 <= index < count:
                fault = faults[index]
                if direction not in fault.aside:
                    passing = fault.body_aside
                    if passing is None or not passing.passes(item, now):
                        break
                    # passed over for a body: its reader and what it publishes kept up
                if fed_after:
                    stream = fed_after.get((id(fault), direction))
                    if stream is not None:
                        _feed(stream, item)  # it passed the bytes on as they came
                index += step
            else:
                out.append(item)
                return

    def _route(self, index: int, item: Item, now: float, out: list[Item]) -> None:
        """`item`, emitted by the fault at `index`, on to the next stage that takes it."""
        if self._fed_after:
            stream = self._fed_after.get((id(self._faults[index]), item.direction))
            if stream is not None:
                _feed(stream, item)  # this fault may have changed the bytes: a new stream
        self._onward(index + (1 if item.direction is Direction.UPSTREAM else -1), item, now, out)

    def _onward(self, index: int, item: Item, now: float, out: list[Item]) -> None:
        """`item` to the fault at `index` or, past the faults stepping aside for its
        direction, the next one; past the last, out."""
        faults = self._faults
        count = len(faults)
        fed_after = self._fed_after
        direction = item.direction
        step = 1 if direction is Direction.UPSTREAM else -1
        while 0 <= index < count:
            fault = faults[index]
            if direction not in fault.aside:
                passing = fault.body_aside
                if passing is None or not passing.passes(item, now):
                    self._deliver(index, item, now, out)
                    return
                # passed over for a body: its reader and what it publishes kept up
            if fed_after:
                stream = fed_after.get((id(fault), direction))
                if stream is not None:
                    _feed(stream, item)  # it passed the bytes on as they came
            index += step
        out.append(item)


@dataclass(frozen=True, slots=True)
class PipelineLayout:
    """What binding a pipeline works out from its faults' classes and config alone: which
    faults (their classes, in path order), whether the path is framed and the framing's
    shape (`FramingLayout`: which stages frame or publish which direction, the streams'
    wiring), and which faults keep their shared state in process. Faults built from one
    scenario's config answer `reads_http`, `changes` and the rest the same on every
    connection, so the server works this out once per scenario and each connection
    only makes its own state (the faults, their streams, contexts and generators)."""

    kinds: tuple[type[Fault], ...]
    framing: FramingLayout | None
    shared_in_process: tuple[bool, ...]
    reads_client_mss: bool = False
    response_lanes: bool = False
    """Framed, with no response stream fed by the pipeline after a fault: a response body
    may pass in a `BodyLane` (`Pipeline.feed`)."""

    @classmethod
    def of(cls, faults: Sequence[Fault]) -> PipelineLayout:
        framing = None
        if any(fault.reads_http() for fault in faults):
            changes = [fault.changes() for fault in faults]
            framing = FramingLayout.of(
                changes,
                [
                    _within(fault.publishes(), changed)
                    for fault, changed in zip(faults, changes, strict=True)
                ],
                sse=any(fault.reads_sse() for fault in faults),
            )
        return cls(
            tuple(type(fault) for fault in faults),
            framing,
            tuple(fault.shared_in_process for fault in faults),
            any(fault.reads_client_mss() for fault in faults),
            framing is not None
            and all(direction is not Direction.DOWNSTREAM for _, direction, _ in framing.fed_after),
        )

    def fits(self, faults: Sequence[Fault]) -> bool:
        """Whether these faults are of the classes it was worked out for, in order (a
        cheap guard: the caller vouches that they were built from the same config)."""
        return tuple(map(type, faults)) == self.kinds  # one pass in C, per connection


def _within(published: frozenset[Direction], changed: frozenset[Direction]) -> frozenset[Direction]:
    """`published & changed`, without a new set when `published` is already within: the
    framing keeps these per connection, and each new frozenset is 216 bytes."""
    return published if published <= changed else published & changed


def _feed(stream: FramedStream, item: Item) -> None:
    if isinstance(item, Chunk):
        stream.feed(item.data)
    else:
        stream.feed_eof()
