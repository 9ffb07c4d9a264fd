"""The console's live model: recent connections and their streams, read as the proxy runs.

Fed by the relay's observer contract through the journal it already keeps per connection
(`observe.journal.ConnectionJournal`, the `RelayObserver` the control API's store hands the
relay): the console adds nothing to the relay's hot path. Each refresh (the console's server
calls it every FEED_INTERVAL) reads the records a connection's journal gained since the last
one (every chunk read or written with its time and stream offset, every end, every fault
decision) and, for the connections it frames, frames the bytes the journal captured since
then through the journal's own framer (`core.framed.LegRecord`, fed incrementally), so a
token and the terminal mark mean what the journal and the scorer say they mean
(`core.dialects.read`).

Framing costs about as much CPU as relaying, so at most MAX_FRAMED connections are framed at
a time: the newest ones, and the one a page opened (`stream`), from their first captured
byte.
The rest show their bytes, ends and faults; their tokens wait until a page opens them.

Bounded: the newest MAX_CONNECTIONS connections (the oldest closed one is forgotten first),
at most MAX_TIMES chunk and token times per side (past it every other one is dropped: a long
stream keeps its shape at half the resolution; counts stay exact), framed events forgotten
once read, the journal's own capture bound (bytes past it are counted, not framed), and every
series handed out cut to MAX_POINTS points. Times are the relay's clock; each connection
keeps the offset to the wall clock taken when it opened.
"""

from __future__ import annotations

import bisect
import itertools
from array import array
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, TypeVar

from middlebox.console.classify import (
    CLIENT_LEFT,
    CLOSED_TOWARD_CLIENT,
    Side,
    StreamFacts,
    classify,
    count_bursts,
    ending,
    largest_gap,
    ttft,
)
from middlebox.core.dialects import dialect_for, read
from middlebox.core.framed import FramedStream, LegRecord, is_event_stream
from middlebox.core.stream import Direction
from middlebox.observe.journal import ConnectionJournal
from middlebox.observe.requests import arrivals

T = TypeVar("T")

MAX_CONNECTIONS = 200
# Connections a listing carries (the newest): what a page shows at once; each costs a
# summary and ~450 bytes of JSON per update, ten updates a second.
LISTED = 60
MAX_FRAMED = 16
MAX_TIMES = 10_000
MAX_POINTS = 400
MAX_FAULT_MARKS = 200
# The sides of a stream the page draws: what the proxy read from the upstream, and what it
# wrote to the client (the journal's legs, toward the client).
SIDES = ("upstream", "client")
STATES = ("open", "stalled", "cut", "done")
DOWN, UP = Direction.DOWNSTREAM.value, Direction.UPSTREAM.value
# (op, leg, direction) of a journal record -> the side it draws (what crossed toward the client)
DRAWN = {("read", "upstream", DOWN): "upstream", ("wrote", "client", DOWN): "client"}
NOT_FRAMED = (
    "tokens not counted yet: the console frames the newest {n} streams at a time and any "
    "you open; open this one to see them"
)


class _LegFrames:
    """One leg framed as its bytes arrive (`LegRecord.from_bytes`, fed piece by piece)."""

    def __init__(self) -> None:
        self.requests = FramedStream(Direction.UPSTREAM)
        self.responses = FramedStream(Direction.DOWNSTREAM)
        self.requests.responses_to.append(self.responses)
        self.responses.tunnels.append(self.requests)
        # unlimited: the console empties it after each read (`LiveConnection._read_events`)
        self.record = LegRecord().listen(self.requests, self.responses)
        self.fed = {UP: 0, DOWN: 0}
        self.dialects: dict[int, Any] = {}
        self.streams: set[int] = set()


@dataclass
class _SideState:
    starts: array[int] = field(default_factory=lambda: array("q"))  # each chunk's offset
    times: array[float] = field(default_factory=lambda: array("d"))
    total: int = 0
    tokens: array[float] = field(default_factory=lambda: array("d"))
    token_count: int = 0
    # the bursts `tokens` form, counted as they come: a listing ten times a second reads
    # it instead of walking every token (`classify.Side.bursts`)
    bursts: int | None = 0
    done: bool = False
    status: int | None = None

    def chunk(self, offset: int, size: int, now: float) -> None:
        if len(self.starts) >= MAX_TIMES:
            del self.starts[1::2]
            del self.times[1::2]
        self.starts.append(offset)
        self.times.append(now)
        self.total = offset + size

    def token(self, at: float) -> None:
        if len(self.tokens) >= MAX_TIMES:
            del self.tokens[1::2]
            self.bursts = len(arrivals(self.tokens)) if self.bursts is not None else None
        self.bursts = count_bursts(self.bursts, self.tokens[-1] if self.tokens else None, at)
        self.tokens.append(at)
        self.token_count += 1

    def time_at(self, offset: int) -> float:
        position = max(bisect.bisect_right(self.starts, offset) - 1, 0)
        return self.times[position] if self.times else 0.0


@dataclass
class LiveConnection:
    """One connection as the console sees it, read from its journal."""

    connection_id: int
    scenario: str
    started: float  # relay clock
    clock_offset: float  # wall clock minus relay clock
    journal: ConnectionJournal | None = None
    sides: dict[str, _SideState] = field(default_factory=lambda: {s: _SideState() for s in SIDES})
    request_bytes: int = 0
    requests: int = 0
    ends: list[tuple[str, str, str, float]] = field(default_factory=list)
    faults: list[tuple[float, str, str]] = field(default_factory=list)
    frames: dict[str, _LegFrames] | None = None
    version: int = 0
    _records_read: int = 0
    _faults_read: int = 0
    _closed: bool = False  # both legs ended (read once per pull, asked per summary)
    # a closed connection's summary, kept while nothing it is made of moves: once both legs
    # ended its findings no longer depend on `now` (no stall, nothing held, the upstream's
    # end known), so a listing ten times a second does not re-classify the finished ones
    _summary: tuple[tuple[Any, ...], dict[str, Any]] | None = None
    summaries: int = 0  # summaries computed (not reused): what the cache saves is counted

    @property
    def closed(self) -> bool:
        return self._closed

    @property
    def framed(self) -> bool:
        return self.frames is not None

    @property
    def faults_counted(self) -> int:
        """Every fault decision, those past the journal's kept reports included."""
        if self.journal is None:
            return len(self.faults)
        return int(sum(count for count, _ in self.journal.fault_counts.values()))

    # ------------------------------------------------------------ reading the journal

    def pull(self) -> bool:
        """Read what the journal gained since the last pull; whether anything had."""
        journal = self.journal
        if journal is None:
            return False
        records, faults = journal.records, journal.faults
        if len(records) == self._records_read and len(faults) == self._faults_read:
            return False
        sides = self.sides
        for now, op, leg, direction, size, offset in records[self._records_read :]:
            drawn = DRAWN.get((op, leg, direction))
            if drawn is not None:
                sides[drawn].chunk(offset, size, now)
            elif op == "end":
                self.ends.append((leg, direction, size, now))
            elif op == "read" and leg == "client":
                self.request_bytes = offset + size
        self._records_read = len(records)
        self._closed = {leg for leg, _, _, _ in self.ends} == {"client", "upstream"}
        for report in faults[self._faults_read : self._faults_read + MAX_FAULT_MARKS]:
            if len(self.faults) < MAX_FAULT_MARKS:
                self.faults.append((report.time, report.fault, report.action))
        self._faults_read = len(faults)
        self.version += 1
        return True

    def frame(self) -> None:
        """Frame what the journal captured since the last call (starting framing now, from
        the first captured byte, if this connection was not framed yet)."""
        journal = self.journal
        if journal is None:
            return
        if self.frames is None:
            self.frames = {leg: _LegFrames() for leg in SIDES}
        for leg, frames in self.frames.items():
            for direction, target in ((UP, frames.requests), (DOWN, frames.responses)):
                captured = journal.captured.get((leg, direction))
                if captured is not None and len(captured) > frames.fed[direction]:
                    target.feed(bytes(captured[frames.fed[direction] :]))
                    frames.fed[direction] = len(captured)
            self._read_events(leg, frames)

    def _read_events(self, leg: str, frames: _LegFrames) -> None:
        """What was framed since the last read; then the record forgets it (read once)."""
        state = self.sides[leg]
        record = frames.record
        requests = record.heads[Direction.UPSTREAM]
        for message, _, _, head in requests:
            frames.dialects[message] = dialect_for(head.method or "", head.target or "")
        if leg == "client":
            self.requests += len(requests)
        for message, _, _, head in record.heads[Direction.DOWNSTREAM]:
            if not head.is_interim:
                state.status = head.status
            if is_event_stream(head):
                frames.streams.add(message)
        for message, offset, event in record.events[Direction.DOWNSTREAM]:
            meaning = read(event, frames.dialects.get(message))
            if meaning.token is not None:
                state.token(state.time_at(offset))
            if meaning.last:
                state.done = True
        for message, _ in record.ends[Direction.DOWNSTREAM]:
            if message not in frames.streams:
                state.done = True  # a whole non-streamed answer is complete at its end
            frames.dialects.pop(message, None)
            frames.streams.discard(message)
        for kept in (record.heads, record.events, record.ends):
            for direction in Direction:
                kept[direction].clear()
        record.request_bodies.clear()

    # ------------------------------------------------------------ facts and views

    def facts(self) -> StreamFacts:
        client_end = next(
            (
                (kind, at)
                for leg, _, kind, at in self.ends
                if leg == "client" and kind in CLOSED_TOWARD_CLIENT
            ),
            None,
        )
        left = next(
            (at for leg, _, kind, at in self.ends if leg == "client" and kind in CLIENT_LEFT),
            None,
        )
        upstream_closed = next((at for leg, _, _, at in self.ends if leg == "upstream"), None)
        return StreamFacts(
            self.started,
            upstream=self._side("upstream"),
            client=self._side("client"),
            client_end=client_end,
            client_left=left,
            upstream_closed=upstream_closed,
        )

    def _side(self, name: str) -> Side:
        state = self.sides[name]
        return Side(
            tokens=tuple(state.tokens),
            done=state.done,
            first_byte=state.times[0] if state.times else None,
            last_byte=state.times[-1] if state.times else None,
            bytes=state.total,
            bursts=state.bursts,
        )

    def summary(self, now: float) -> dict[str, Any]:
        up, client = self.sides["upstream"], self.sides["client"]
        key = (self.version, self.framed, up.token_count, client.token_count, up.done, client.done)
        if self._summary is not None and self._summary[0] == key:
            return self._summary[1]
        facts = self.facts()
        summary = self._summarise(facts, now)
        if self.closed and (facts.client_end is not None or facts.client_left is not None):
            self._summary = (key, summary)
        return summary

    def _summarise(self, facts: StreamFacts, now: float) -> dict[str, Any]:
        self.summaries += 1
        if self.framed:
            findings = classify(facts, now)
            kinds, words = [f.kind for f in findings], [f.words for f in findings]
            how = ending(facts)
        else:  # without framing no terminal mark is known: only what the ends say
            kinds, words = [], [NOT_FRAMED.format(n=MAX_FRAMED)]
            how = _unframed_ending(facts)
        if "cut" in kinds or how in ("RST", "truncated (FIN)", "write failed"):
            state = "cut"
        elif "stall" in kinds:
            state = "stalled"
        elif self.closed or how == "complete":
            state = "done"
        else:
            state = "open"
        up, client = self.sides["upstream"], self.sides["client"]
        return {
            "id": self.connection_id,
            "scenario": self.scenario,
            "started_at": self.started + self.clock_offset,
            "age": round((self.ends[-1][3] if self.closed else now) - self.started, 3),
            "state": state,
            "ending": how,
            "requests": self.requests,
            "status": client.status,
            "bytes": {"request": self.request_bytes, "upstream": up.total, "client": client.total},
            "framed": self.framed,
            "tokens": {"upstream": up.token_count, "client": client.token_count},
            "done": {"upstream": up.done, "client": client.done},
            "faults": self.faults_counted,
            "kinds": kinds,
            "words": words,
            "version": self.version,
        }

    def detail(self, now: float) -> dict[str, Any]:
        facts = self.facts()
        start = self.started
        return {
            **self.summary(now),
            "sides": {
                name: {
                    # thinned first: a long stream's thousands of times are not all rounded
                    "tokens": [round(t - start, 4) for t in _thin(self.sides[name].tokens)],
                    "bytes": [
                        [round(self.sides[name].times[i] - start, 4), self.sides[name].starts[i]]
                        for i in _thin(range(len(self.sides[name].starts)))
                    ],
                    "ttft": _rounded(ttft(side, start)),
                    "largest_gap": _rounded(largest_gap(side.tokens, start)),
                    "done": side.done,
                    "total_tokens": self.sides[name].token_count,
                }
                for name, side in (("upstream", facts.upstream), ("client", facts.client))
            },
            "ends": [
                {"leg": leg, "direction": d, "kind": kind, "at": round(at - start, 4)}
                for leg, d, kind, at in self.ends
            ],
            "fault_marks": [
                {"at": round(at - start, 4), "fault": fault, "action": action}
                for at, fault, action in self.faults
            ],
        }


def _unframed_ending(facts: StreamFacts) -> str | None:
    if facts.client_end is None:
        return "client left" if facts.client_left is not None else None
    return {"sent_rst": "RST", "write_failed": "write failed"}.get(facts.client_end[0], "FIN")


def _rounded(value: float | None) -> float | None:
    return None if value is None else round(value, 4)


def _thin(points: Sequence[T]) -> Sequence[T]:
    """At most MAX_POINTS of `points`, evenly picked, the last one always kept."""
    if len(points) <= MAX_POINTS:
        return points
    step = len(points) / (MAX_POINTS - 1)
    return [points[int(i * step)] for i in range(MAX_POINTS - 1)] + [points[-1]]


@dataclass
class ConsoleModel:
    """Recent connections, newest last; `version` moves whenever anything does."""

    max_connections: int = MAX_CONNECTIONS
    max_framed: int = MAX_FRAMED
    connections: dict[int, LiveConnection] = field(default_factory=dict)
    version: int = 0
    forgotten: int = 0
    opened: int | None = None  # the stream a page opened last: framed whatever its age

    def track(
        self,
        connection_id: int,
        scenario: str,
        journal: ConnectionJournal | None,
        now: float,
        clock_offset: float = 0.0,
    ) -> LiveConnection:
        """A new connection, read from `journal` (the relay's observer for it)."""
        connection = LiveConnection(connection_id, scenario, now, clock_offset, journal)
        self.connections[connection_id] = connection
        self.version += 1
        while len(self.connections) > self.max_connections:
            victim = next(
                (cid for cid, c in self.connections.items() if c.closed),
                next(iter(self.connections)),
            )
            del self.connections[victim]
            self.forgotten += 1
        return connection

    def refresh(self) -> None:
        """Read every connection's journal since the last refresh; frame the newest
        `max_framed` (and the one a page opened), and a framed one's last bytes."""
        framing = 0
        for connection in reversed(self.connections.values()):
            if connection.pull():
                self.version += 1
            if connection.connection_id == self.opened or framing < self.max_framed:
                framing += 1
                connection.frame()
            elif connection.framed and connection.closed:
                connection.frame()  # cheap once caught up: nothing new is captured

    def listing(self, now: float, limit: int | None = LISTED) -> dict[str, Any]:
        """The newest `limit` connections (None: every one held), newest first."""
        newest = reversed(self.connections.values())
        return {
            "version": self.version,
            "forgotten": self.forgotten,
            "held": len(self.connections),
            "connections": [c.summary(now) for c in itertools.islice(newest, limit)],
        }

    def stream(self, connection_id: int, now: float) -> dict[str, Any] | None:
        """One stream's two sides, framed from its first captured byte if it was not."""
        connection = self.connections.get(connection_id)
        if connection is None:
            return None
        self.opened = connection_id
        if connection.pull():
            self.version += 1  # the feed's next update carries what this pull read
        connection.frame()
        return connection.detail(now)
