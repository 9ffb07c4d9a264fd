"""The console's live model: recent connections and their streams, fed as the proxy runs.

Fed by the relay's observer contract (`observe.observer.RelayObserver`: read, wrote, ended per
leg and direction) and the fault sink, wrapped around the journal's own observer and sink
(`ConsoleModel.observer`/`sink`), so the journal records exactly what it did before. On the
hot path a call appends a chunk's offset and time and keeps its bytes for framing (bounded);
framing runs when the page's feed asks (`refresh`, at most its update rate), through the
journal's framer (`core.framed.LegRecord`, fed incrementally), so tokens and the terminal
mark mean what the journal and the scorer say they mean (`core.dialects.read`).

Bounded: the newest MAX_CONNECTIONS connections (the oldest closed one is forgotten first),
MAX_CHUNKS chunk times per side, MAX_PENDING unframed bytes per connection (past it framing
stops for that connection and it says so), and every series handed out is cut to
MAX_POINTS points. Times are the relay's clock; each connection keeps the offset to the wall
clock taken when it opened.
"""

from __future__ import annotations

import bisect
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from middlebox.console.classify import (
    CLIENT_LEFT,
    CLOSED_TOWARD_CLIENT,
    Side,
    StreamFacts,
    classify,
    ending,
    largest_gap,
    ttft,
)
from middlebox.core.dialects import dialect_for, read
from middlebox.core.fault import FaultReport
from middlebox.core.framed import FramedStream, LegRecord, is_event_stream
from middlebox.core.stream import Direction
from middlebox.observe.journal import MAX_BOUNDARIES
from middlebox.observe.observer import RelayObserver

MAX_CONNECTIONS = 200
MAX_CHUNKS = 50_000
MAX_PENDING = 4 * 1024 * 1024
MAX_POINTS = 400
MAX_FAULT_MARKS = 200
# The sides of a stream the page draws: what the proxy read from the upstream, and what it
# wrote to the client (the journal's legs, toward the client).
SIDES = ("upstream", "client")
STATES = ("open", "stalled", "cut", "done")


class _LegFrames:
    """One leg framed as its bytes arrive (`LegRecord.from_bytes`, fed piece by piece)."""

    def __init__(self) -> None:
        self.requests = FramedStream(Direction.UPSTREAM)
        self.responses = FramedStream(Direction.DOWNSTREAM)
        self.requests.responses_to.append(self.responses)
        self.responses.tunnels.append(self.requests)
        self.record = LegRecord(limit=MAX_BOUNDARIES).listen(self.requests, self.responses)
        self.events_read = 0
        self.ends_read = 0


@dataclass
class _SideState:
    starts: list[int] = field(default_factory=list)  # stream offset of each chunk
    times: list[float] = field(default_factory=list)
    total: int = 0
    tokens: list[float] = field(default_factory=list)
    done: bool = False
    status: int | None = None

    def time_at(self, offset: int) -> float:
        position = max(bisect.bisect_right(self.starts, offset) - 1, 0)
        return self.times[position] if self.times else 0.0


@dataclass
class LiveConnection:
    """One connection as the console sees it."""

    connection_id: int
    scenario: str
    started: float  # relay clock
    clock_offset: float  # wall clock minus relay clock
    peer: str = ""
    sides: dict[str, _SideState] = field(default_factory=lambda: {s: _SideState() for s in SIDES})
    request_bytes: int = 0
    requests: int = 0
    ends: list[tuple[str, str, str, float]] = field(default_factory=list)
    faults: list[tuple[float, str, str]] = field(default_factory=list)
    faults_more: int = 0
    pending: dict[tuple[str, str], bytearray] = field(default_factory=dict)
    framing_lost: bool = False
    frames: dict[str, _LegFrames] = field(default_factory=lambda: {s: _LegFrames() for s in SIDES})
    version: int = 0

    @property
    def closed(self) -> bool:
        legs = {(leg, kind[:4]) for leg, _, kind, _ in self.ends}
        return any(leg == "client" for leg, _ in legs) and any(leg == "upstream" for leg, _ in legs)

    def facts(self) -> StreamFacts:
        client_end = next(
            (
                (kind, at)
                for leg, d, kind, at in self.ends
                if leg == "client" and kind in CLOSED_TOWARD_CLIENT
            ),
            None,
        )
        left = next(
            (at for leg, d, kind, at in self.ends if leg == "client" and kind in CLIENT_LEFT),
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
        )

    # ------------------------------------------------------------ framing

    def frame(self) -> None:
        """Frame what arrived since the last call (off the hot path)."""
        if self.framing_lost:
            self.pending.clear()
            return
        for (leg, direction), data in self.pending.items():
            if not data:
                continue
            frames = self.frames[leg]
            target = frames.requests if direction == Direction.UPSTREAM.value else frames.responses
            target.feed(bytes(data))
            data.clear()
        for leg in SIDES:
            self._read_events(leg)

    def _read_events(self, leg: str) -> None:
        frames, state = self.frames[leg], self.sides[leg]
        record = frames.record
        dialects = {
            message: dialect_for(head.method or "", head.target or "")
            for message, _, _, head in record.heads[Direction.UPSTREAM]
        }
        if leg == "client":
            self.requests = len(record.heads[Direction.UPSTREAM])
        streams = set()
        for message, _, _, head in record.heads[Direction.DOWNSTREAM]:
            if not head.is_interim:
                state.status = head.status
            if is_event_stream(head):
                streams.add(message)
        events = record.events[Direction.DOWNSTREAM]
        for message, offset, event in events[frames.events_read :]:
            meaning = read(event, dialects.get(message))
            if meaning.token is not None:
                state.tokens.append(state.time_at(offset))
            if meaning.last:
                state.done = True
        frames.events_read = len(events)
        ends = record.ends[Direction.DOWNSTREAM]
        for message, _ in ends[frames.ends_read :]:
            if message not in streams:
                state.done = True  # a whole non-streamed answer is complete at its end
        frames.ends_read = len(ends)

    # ------------------------------------------------------------ the page's view

    def summary(self, now: float) -> dict[str, Any]:
        facts = self.facts()
        findings = classify(facts, now)
        kinds = [f.kind for f in findings]
        how = ending(facts)
        state = (
            "cut"
            if "cut" in kinds or how in ("RST", "truncated (FIN)", "write failed")
            else "stalled"
            if "stall" in kinds
            else "done"
            if self.closed or how == "complete"
            else "open"
        )
        up, client = self.sides["upstream"], self.sides["client"]
        return {
            "id": self.connection_id,
            "scenario": self.scenario,
            "peer": self.peer,
            "started_at": self.started + self.clock_offset,
            "age": round(now - self.started, 3),
            "state": state,
            "ending": how,
            "requests": self.requests,
            "status": client.status,
            "bytes": {
                "request": self.request_bytes,
                "upstream": up.total,
                "client": client.total,
            },
            "tokens": {"upstream": len(up.tokens), "client": len(client.tokens)},
            "done": {"upstream": up.done, "client": client.done},
            "faults": len(self.faults) + self.faults_more,
            "kinds": kinds,
            "words": [f.words for f in findings],
            "framing_lost": self.framing_lost,
            "version": self.version,
        }

    def detail(self, now: float) -> dict[str, Any]:
        facts = self.facts()
        start = self.started
        return {
            **self.summary(now),
            "sides": {
                name: {
                    "tokens": _thin([round(t - start, 4) for t in self.sides[name].tokens]),
                    "bytes": _thin(
                        [
                            [round(t - start, 4), offset]
                            for offset, t in zip(
                                self.sides[name].starts, self.sides[name].times, strict=True
                            )
                        ]
                    ),
                    "ttft": _rounded(ttft(side, start)),
                    "largest_gap": _rounded(largest_gap(side.tokens, start)),
                    "done": side.done,
                    "total_tokens": len(side.tokens),
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


def _rounded(value: float | None) -> float | None:
    return None if value is None else round(value, 4)


def _thin(points: list[Any]) -> list[Any]:
    """At most MAX_POINTS of `points`, evenly picked, the last one always kept."""
    if len(points) <= MAX_POINTS:
        return points
    step = len(points) / (MAX_POINTS - 1)
    return [points[int(i * step)] for i in range(MAX_POINTS - 1)] + [points[-1]]


class ConsoleObserver:
    """The relay's observer for one connection: the inner observer (the journal's) first,
    then the console's record of the same call."""

    __slots__ = ("connection", "inner", "model")

    def __init__(
        self, model: ConsoleModel, connection: LiveConnection, inner: RelayObserver | None
    ) -> None:
        self.model, self.connection, self.inner = model, connection, inner

    def _chunk(self, leg: str, direction: Direction, data: bytes, now: float) -> None:
        connection = self.connection
        connection.version += 1
        self.model.version += 1
        if direction is Direction.DOWNSTREAM:
            state = connection.sides[leg]
            if len(state.starts) < MAX_CHUNKS:
                state.starts.append(state.total)
                state.times.append(now)
            state.total += len(data)
        elif leg == "client":
            connection.request_bytes += len(data)
        self._pend(leg, direction, data)

    def _pend(self, leg: str, direction: Direction, data: bytes) -> None:
        connection = self.connection
        if connection.framing_lost:
            return
        buffer = connection.pending.setdefault((leg, direction.value), bytearray())
        buffer += data
        if len(buffer) > MAX_PENDING:
            connection.framing_lost = True  # nobody framed it for a long while
            connection.pending.clear()

    def read(self, leg: str, direction: Direction, data: bytes, now: float) -> None:
        if self.inner is not None:
            self.inner.read(leg, direction, data, now)
        # what the proxy read from the upstream, and the client's requests
        if (leg == "upstream") == (direction is Direction.DOWNSTREAM):
            self._chunk(leg, direction, data, now)

    def wrote(self, leg: str, direction: Direction, data: bytes, now: float) -> None:
        if self.inner is not None:
            self.inner.wrote(leg, direction, data, now)
        # what the proxy wrote to the client (the request it wrote upstream is the same
        # request the client sent, counted on read)
        if leg == "client" and direction is Direction.DOWNSTREAM:
            self._chunk(leg, direction, data, now)
        elif leg == "upstream":  # the upstream leg's requests, framed with its answers
            self._pend(leg, direction, data)

    def ended(self, leg: str, direction: Direction, kind: str, now: float) -> None:
        if self.inner is not None:
            self.inner.ended(leg, direction, kind, now)
        self.connection.ends.append((leg, direction.value, kind, now))
        self.connection.version += 1
        self.model.version += 1
        if leg == "upstream" or kind in CLOSED_TOWARD_CLIENT:
            self.model.ended(self.connection)

    def __getattr__(self, name: str) -> Any:
        # the journal's other duties (attach_framing ...) stay the journal's
        return getattr(self.inner, name)


@dataclass
class ConsoleModel:
    """Recent connections, newest last; `version` moves whenever anything does."""

    max_connections: int = MAX_CONNECTIONS
    connections: dict[int, LiveConnection] = field(default_factory=dict)
    version: int = 0
    forgotten: int = 0
    _closed: list[int] = field(default_factory=list)

    def observer(
        self,
        connection_id: int,
        scenario: str,
        inner: RelayObserver | None,
        now: float,
        clock_offset: float = 0.0,
    ) -> ConsoleObserver:
        connection = LiveConnection(connection_id, scenario, now, clock_offset)
        self.connections[connection_id] = connection
        self.version += 1
        self._bound()
        return ConsoleObserver(self, connection, inner)

    def sink(
        self, connection_id: int, inner: Callable[[FaultReport], None] | None
    ) -> Callable[[FaultReport], None]:
        def record(report: FaultReport) -> None:
            if inner is not None:
                inner(report)
            connection = self.connections.get(connection_id)
            if connection is None:
                return
            if len(connection.faults) < MAX_FAULT_MARKS:
                connection.faults.append((report.time, report.fault, report.action))
            else:
                connection.faults_more += 1
            connection.version += 1
            self.version += 1

        return record

    def ended(self, connection: LiveConnection) -> None:
        if connection.closed and connection.connection_id not in self._closed:
            self._closed.append(connection.connection_id)

    def _bound(self) -> None:
        while len(self.connections) > self.max_connections:
            victim = next(
                (cid for cid in self._closed if cid in self.connections),
                next(iter(self.connections)),
            )
            if victim in self._closed:
                self._closed.remove(victim)
            del self.connections[victim]
            self.forgotten += 1

    def refresh(self) -> None:
        """Frame what arrived since the last refresh (the feed's tick)."""
        for connection in self.connections.values():
            if connection.pending:
                connection.frame()

    def listing(self, now: float) -> dict[str, Any]:
        self.refresh()
        return {
            "version": self.version,
            "forgotten": self.forgotten,
            "connections": [c.summary(now) for c in reversed(self.connections.values())],
        }

    def stream(self, connection_id: int, now: float) -> dict[str, Any] | None:
        connection = self.connections.get(connection_id)
        if connection is None:
            return None
        connection.frame()
        return connection.detail(now)
