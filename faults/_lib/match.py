"""Which requests an HTTP fault affects, and its place's view of the HTTP flow (pure).

- `RequestInfo`: what matching needs from one request (method, path, `model` from a
  complete JSON body), parsed by `request_info`.
- `RequestMatch`: the `match:` config block of an HTTP fault, e.g.
  `match: {method: POST, path: /v1/chat/completions, model: "Qwen/*", requests: [0, 2],
  every: 3, probability: 0.5, after: 2s, before: 10s}`, and `decide`, which says whether
  one exchange is affected. Indices count across connections through the fault
  position's scenario-lifetime `context.shared` dict, so "the first three requests get a
  429" holds however the client spreads them over keep-alive and new connections.
- `HttpFlow`: one place's view of the connection's framed streams
  (`middlebox.core.framed`: framed once for the whole path, read here through a
  `Reader` per direction) plus which requests are complete. A fault used on its own,
  outside a pipeline, frames what it sees itself.
- `HttpMatched`: mixin (`class X(HttpMatched, Fault)`) that adds the `match` field,
  reads the flow and decides each request once, when it is complete (or when its
  response starts, whichever comes first), so request- and response-side logic agree;
  a fault that publishes its output's pieces uses `forwarded`/`wrote`.
"""

from __future__ import annotations

import fnmatch
import json
import urllib.parse
from dataclasses import dataclass, field
from typing import Any, cast

from middlebox.core.fault import Fault, FaultContext, FaultRandom, Seconds
from middlebox.core.framed import Framed, FramedStream, Position, frame_new
from middlebox.core.http1 import (
    REQUEST_BODY_KEEP,
    Head,
    Piece,
    PieceKind,
)
from middlebox.core.scenario_state import SharedState, increment
from middlebox.core.stream import Chunk, Direction, Item


@dataclass(frozen=True, slots=True)
class RequestInfo:
    """One request as matching sees it. `message` is its index on its connection;
    `model` is None unless the body is complete JSON with a string `model`."""

    message: int
    method: str
    path: str
    target: str
    model: str | None
    complete: bool
    head: Head


def request_path(target: str) -> str:
    """The path of a request target: origin-form minus the query, or the path of an
    absolute-form target (RFC 9112 §3.2.2, what a client sends to a forward proxy)."""
    if "://" in target:
        rest = target.split("://", 1)[1]
        slash = rest.find("/")
        target = rest[slash:] if slash >= 0 else "/"
    return normalised_path(target.split("?", 1)[0].split("#", 1)[0] or "/")


def normalised_path(path: str) -> str:
    """The path as nginx matches locations against it (ngx_http_parse_complex_uri):
    percent-decoded, `//` merged (merge_slashes on), `.` and `..` segments resolved
    (RFC 3986 §5.2.4), so `/v1/chat/%63ompletions` and `/v1/./chat//completions` are
    `/v1/chat/completions`, as the upstream routes them. A `..` above the root stays at
    the root (nginx refuses such a request with 400 before any location)."""
    if "%" in path:
        path = urllib.parse.unquote(path, encoding="latin-1")
    if "//" not in path and "/." not in path:
        return path  # the usual case: nothing to resolve
    segments: list[str] = []
    parts = path.split("/")
    for index, segment in enumerate(parts[1:], 1):
        last = index == len(parts) - 1
        if segment == "..":
            if segments:
                segments.pop()
            if last:
                segments.append("")
        elif segment == ".":
            if last:
                segments.append("")
        elif segment or last:
            segments.append(segment)
    return "/" + "/".join(segments)


def body_model(body: bytes) -> str | None:
    """The `model` of an OpenAI-style JSON body, or None when it is not one."""
    try:
        parsed = json.loads(body)
    except (UnicodeDecodeError, ValueError):
        return None
    model = parsed.get("model") if isinstance(parsed, dict) else None
    return model if isinstance(model, str) else None


def request_info(message: int, head: Head, body: bytes, complete: bool) -> RequestInfo:
    """Parse what matching needs. The model is read only from a complete body that
    `Http1Exchange` kept whole (it keeps the first REQUEST_BODY_KEEP bytes)."""
    whole = complete and len(body) < REQUEST_BODY_KEEP
    return RequestInfo(
        message=message,
        method=(head.method or "").upper(),
        path=request_path(head.target or "/"),
        target=head.target or "",
        model=body_model(body) if whole and body else None,
        complete=complete,
        head=head,
    )


@dataclass
class RequestMatch:
    """Which requests an HTTP fault affects; every condition given must hold.

    - `method` (case-insensitive), `path` (a glob on the path without the query, e.g.
      `/v1/*`, percent-decoded and dot-segment-normalised as nginx matches locations),
      `model` (a glob on the JSON body's `model`; a request whose body is not
      complete JSON never matches a `model`): the filters.
    - `after`/`before`: seconds since this fault position first saw a connection open
      (the scenario's first client), a window `[after, before)` on the request's time.
    - Requests that pass the filters and the window are numbered from 0 across all
      connections (the index). `requests` lists chosen indices, `first: N` takes
      indices below N, `every: N` takes every Nth (indices N-1, 2N-1, ...).
    - `probability`: then a coin from the fault's seeded rng, so a seed replays.
    """

    method: str | None = None
    path: str | None = None
    model: str | None = None
    requests: list[int] | None = None
    first: int | None = None
    every: int | None = None
    probability: float = 1.0
    after: Seconds = 0.0
    before: Seconds | None = None

    def __post_init__(self) -> None:
        if self.method is not None and (not self.method or not self.method.isalpha()):
            raise ValueError(
                f"match.method must be an HTTP method such as POST, not {self.method!r}"
            )
        if self.path is not None and not self.path.startswith(("/", "*")):
            raise ValueError(
                f"match.path must start with / (a glob such as /v1/*), not {self.path!r}"
            )
        if self.requests is not None and any(index < 0 for index in self.requests):
            raise ValueError(f"match.requests are indices from 0, got {self.requests!r}")
        if self.first is not None and self.first < 0:
            raise ValueError(f"match.first must be >= 0, got {self.first!r}")
        if self.every is not None and self.every < 1:
            raise ValueError(f"match.every must be >= 1, got {self.every!r}")
        if not 0.0 <= self.probability <= 1.0:
            raise ValueError(f"match.probability must be in [0, 1], got {self.probability!r}")
        if self.after < 0:
            raise ValueError(f"match.after must be >= 0, got {self.after!r}")
        if self.before is not None and self.before <= self.after:
            raise ValueError(
                f"match.before ({self.before}) must be after match.after ({self.after})"
            )

    @property
    def needs_body(self) -> bool:
        """True when deciding needs the complete body (a `model` filter)."""
        return self.model is not None

    def accepts(self, request: RequestInfo) -> bool:
        """The method, path and model filters."""
        if self.method is not None and request.method != self.method.upper():
            return False
        if self.path is not None and not fnmatch.fnmatchcase(request.path, self.path):
            return False
        return self.model is None or (
            request.model is not None and fnmatch.fnmatchcase(request.model, self.model)
        )

    @property
    def windowed(self) -> bool:
        """Whether `after`/`before` restrict the request's time (then the epoch matters)."""
        return self.after > 0 or self.before is not None

    def within(self, elapsed: float) -> bool:
        """The time window, in seconds since the epoch (see `start`)."""
        return elapsed >= self.after and (self.before is None or elapsed < self.before)

    def chooses(self, index: int, rng: FaultRandom) -> bool:
        """The index conditions, then the seeded coin (drawn only when reached)."""
        if self.requests is not None and index not in self.requests:
            return False
        if self.first is not None and index >= self.first:
            return False
        if self.every is not None and index % self.every != self.every - 1:
            return False
        return self.probability >= 1.0 or rng.random() < self.probability

    @staticmethod
    def start(shared: SharedState, now: float, key: str = "match") -> float:
        """Note a connection opening: the first one sets the epoch of the window (a
        store round trip with `--state redis://`: call it only for a `windowed` match).
        Returns the epoch, which never changes once set: a connection may keep it."""
        epoch: float = shared.setdefault(f"{key}.epoch", now)
        return epoch

    def decide(
        self,
        request: RequestInfo,
        now: float,
        rng: FaultRandom,
        shared: SharedState,
        key: str = "match",
        epoch: float | None = None,
    ) -> int | None:
        """The request's cross-connection index if this exchange is affected, else None.

        Call once per request: a request that passes the filters and the window takes
        the next index from `shared[key + ".count"]`. `epoch`: the window's epoch as
        `start` returned it, so the store is not asked again.
        """
        if not self.accepts(request):
            return None
        return self.take(now, rng, shared, key, epoch)

    @property
    def filters(self) -> bool:
        """Whether a filter (method, path, model) reads the request: without one, every
        request is accepted and `take` decides alone, with no `RequestInfo` made."""
        return self.method is not None or self.path is not None or self.model is not None

    def take(
        self,
        now: float,
        rng: FaultRandom,
        shared: SharedState,
        key: str = "match",
        epoch: float | None = None,
    ) -> int | None:
        """`decide` for a request the filters accept: the window, the index, the coin."""
        if self.windowed:
            # Only a window needs the epoch: without one, no store round trip for it.
            if epoch is None:
                epoch = self.start(shared, now, key)
            if not self.within(now - epoch):
                return None
        # One atomic increment, so "first: 3" stays three across workers and proxies that
        # share a store (a get then a set could hand two requests the same index).
        index = increment(shared, f"{key}.count") - 1
        return index if self.chooses(index, rng) else None


RESPONSES = frozenset({Direction.DOWNSTREAM})
"""`changes()`/`publishes()` of a fault that changes only what the server sends."""

REQUESTS = frozenset({Direction.UPSTREAM})
DECISIONS_KEPT = 64  # requests whose decision a fault keeps (`HttpMatched.decide`)
"""... only what the client sends."""


class HttpFlow:
    """One place's view of a connection's HTTP exchange, advanced with pipeline items.

    `feed` returns the pieces an item completes here (an end, FIN or RST, flushes what
    was held as OPAQUE); `framed` keeps them with their SSE lines. `complete` holds the
    indices of requests whose last piece has arrived here. With a `Position` from the
    pipeline the streams are shared (framed once for the path); without one this flow
    frames the items itself."""

    def __init__(self, position: Position | None = None) -> None:
        self.own = position is None
        if position is None:
            up, down = FramedStream(Direction.UPSTREAM), FramedStream(Direction.DOWNSTREAM)
            up.responses_to.append(down)
            down.tunnels.append(up)
            position = Position(up, down)
        self.position = position
        self.requests = position.up.reader()
        self.responses = position.down.reader()
        self.complete: set[int] = set()
        self.framed: list[Framed] = []

    def reader(self, direction: Direction) -> Any:
        return self.requests if direction is Direction.UPSTREAM else self.responses

    def feed(self, item: Item) -> list[Piece]:
        up = item.direction is Direction.UPSTREAM
        reader = self.requests if up else self.responses
        if isinstance(item, Chunk):
            if self.own:
                reader.stream.feed(item.data)
            framed = reader.advance(len(item.data))
        else:
            if self.own:
                reader.stream.feed_eof()
            framed = reader.end()
        self.framed = framed
        pieces = [entry.piece for entry in framed]
        if up:
            for piece in pieces:
                if piece.end_of_message:
                    # The request stream keeps the last 64 requests; so do we.
                    self.complete.add(piece.message)
                    self.complete.discard(piece.message - 64)
        return pieces

    def request(self, message: int) -> RequestInfo | None:
        """Request `message` as known so far, or None if its head has not arrived."""
        stream = self.position.up
        head = stream.request_heads.get(message)
        if head is None:
            return None
        body = bytes(stream.request_bodies.get(message, b""))
        return request_info(message, head, body, message in self.complete)


def waits_for_body(head: Head) -> bool:
    """False when the client waits for us before sending the body (RFC 9110 §10.1.1
    `Expect: 100-continue`): holding the head for the body would stall both sides."""
    return "100-continue" not in head.tokens("expect")


@dataclass
class HttpMatched:
    """Mixin for HTTP faults: `class X(HttpMatched, Fault)` gets a `match` field, a
    per-connection `HttpFlow` (`observe` feeds it) and one decision per request.

    A request is decided when its last piece arrives, or when its head arrives if
    `match` needs no body, or when its response starts, whichever comes first;
    `selected(message)` gives the decision: the request's cross-connection index when
    the exchange is affected, else None.
    """

    match: RequestMatch = field(default_factory=RequestMatch)

    _flow: HttpFlow = field(init=False, repr=False, compare=False)
    _decisions: dict[int, int | None] = field(
        init=False, repr=False, compare=False, default_factory=dict
    )
    _held: list[Framed] = field(init=False, repr=False, compare=False, default_factory=list)
    _epoch: float | None = field(init=False, repr=False, compare=False, default=None)

    @property
    def _fault(self) -> Fault:
        return cast(Fault, self)

    @property
    def _key(self) -> str:
        return f"{self._fault.name}.match"

    def bind(self, context: FaultContext) -> None:
        super().bind(context)  # type: ignore[misc]
        self._flow = HttpFlow(context.framing)

    def reads_http(self) -> bool:
        return True

    def leave(self) -> None:
        self._flow.requests.close()
        self._flow.responses.close()

    def on_open(self, now: float) -> list[Item]:
        if self.match.windowed:  # the window's epoch: the scenario's first connection
            self._epoch = RequestMatch.start(self._fault.context.shared, now, self._key)
        return []

    def publish(self, direction: Direction, framed: list[Framed]) -> None:
        """Hand the pieces of what this fault forwards in `direction` to the faults past
        it (for a fault that `publishes` that direction)."""
        framing = self._fault.context.framing
        if framing is not None and direction in framing.publish:
            framing.publish[direction].publish(framed)

    def forwarded(self, item: Item) -> Item:
        """`item` goes on unchanged: its pieces (just observed) go to the faults past."""
        framing = self._fault.context.framing
        if framing is not None and framing.publish:
            stream = framing.publish.get(item.direction)
            if stream is not None:
                stream.publish(self._flow.framed)
                if not isinstance(item, Chunk):
                    self.publish_end(item.direction)
        return item

    def wrote(self, items: list[Item]) -> list[Item]:
        """`items` are this fault's own writes (an answer, an end): published as such."""
        published = self._fault.publishes()
        for item in items:
            if item.direction in published:
                if isinstance(item, Chunk):
                    self.publish_written(item.direction, item.data)
                else:
                    self.publish_end(item.direction)
        return items

    def publish_written(self, direction: Direction, data: bytes) -> None:
        """Publish the pieces of bytes this fault writes itself in `direction` (its
        reader's place: after everything it forwarded)."""
        framing = self._fault.context.framing
        if framing is not None and direction in framing.publish:
            reader = self._flow.reader(direction)
            stream = framing.publish[direction]
            stream.publish(frame_new(direction, data, reader.message, stream.received))

    def publish_end(self, direction: Direction) -> None:
        """This fault ends `direction` itself: what its reader holds goes out as it came."""
        framing = self._fault.context.framing
        if framing is not None and direction in framing.publish:
            stream = framing.publish[direction]
            if not stream.ended:
                stream.publish(self._flow.reader(direction).end())
                stream.publish_end()

    def observe(self, item: Item, now: float) -> list[Piece]:
        """Feed `item` to the flow and decide the requests it makes decidable."""
        pieces = self._flow.feed(item)
        for piece in pieces:
            if item.direction is Direction.UPSTREAM:
                if (
                    piece.end_of_message
                    or piece.kind is PieceKind.OPAQUE  # malformed or a tunnel: no more to learn
                    or (
                        piece.head is not None
                        and (not self.match.needs_body or not waits_for_body(piece.head))
                    )
                ):
                    self.decide(piece.message, now)
            elif piece.kind is PieceKind.HEAD:
                self.decide(piece.message, now)
        if not isinstance(item, Chunk) and item.direction is Direction.UPSTREAM:
            # The client's FIN or RST: nothing more will arrive, so a half-sent request is
            # decided with what is known.
            self.decide(self._flow.requests.message, now)
        return pieces

    def gate(self, pieces: list[Piece]) -> list[Piece]:
        """Request pieces in order, each held until its request is decided (call with the
        pieces `observe` returned for UPSTREAM items). A request is held from its head
        until decided, so a fault can still rewrite or swallow it."""
        return [entry.piece for entry in self.gate_framed(self._flow.framed)]

    def gate_framed(self, framed: list[Framed]) -> list[Framed]:
        """`gate` for the framed pieces (`self._flow.framed` after `observe`)."""
        held = self._held
        held.extend(framed)
        ready = 0
        while ready < len(held) and (
            held[ready].piece.kind is PieceKind.OPAQUE
            or held[ready].piece.message in self._decisions
        ):
            ready += 1
        out = held[:ready]
        del held[:ready]
        return out

    def decide(self, message: int, now: float) -> int | None:
        """Decide request `message` now if not yet decided (None if it has no head)."""
        decisions = self._decisions
        if message in decisions:
            return decisions[message]
        match = self.match
        fault = self._fault
        if match.filters:
            request = self._flow.request(message)
            if request is None:
                return None
            decision = match.decide(
                request, now, fault.rng, fault.context.shared, self._key, self._epoch
            )
        elif message in self._flow.position.up.request_heads:
            # nothing to read from the request but that its head arrived
            decision = match.take(now, fault.rng, fault.context.shared, self._key, self._epoch)
        else:
            return None
        decisions[message] = decision
        # The last DECISIONS_KEPT requests' decisions: a keep-alive connection may carry
        # millions of requests, and the framing keeps as many of their heads (the 64 of
        # `FramedStream.request_heads`) as any response still in flight can need.
        decisions.pop(message - DECISIONS_KEPT, None)
        return decision

    def selected(self, message: int) -> int | None:
        """The decision for request `message` (None when undecided or not affected)."""
        return self._decisions.get(message)

    def decided(self, message: int) -> bool:
        return message in self._decisions

    def request(self, message: int) -> RequestInfo | None:
        return self._flow.request(message)
