"""One framing pass per byte stream of a connection, shared by every reader (pure).

The framers (`middlebox.core.http1`, `middlebox.core.sse`) turn bytes into labelled
pieces. Running them once per HTTP-aware fault frames the same bytes once per fault;
this module frames each stream of the path once and lets every fault read the result.

- `Framed`: one HTTP/1.1 `Piece` plus the SSE lines (`SsePiece`) its body bytes
  complete, and where the piece starts in its message body. Event-stream bodies are
  framed as SSE unless a `Content-Encoding` other than identity makes them opaque (a
  gzip fault nearer the server hides the events from an SSE-aware fault nearer the
  client, as in the real network).
- `FramedStream`: one direction of one stretch of the path, framed once. It is fed
  either bytes (`feed`/`feed_eof`: the one framing pass) or, by a fault that rewrote
  the bytes and knows what it wrote, the `Framed` pieces of its output (`publish`): no
  framer runs then. Faults read it through a `Reader` each; a listener (`LegRecord`)
  gets every piece.
- `Reader`: a cursor in a `FramedStream` for one place in the path. A fault advances it
  by the bytes of each chunk it receives (`advance(n)`) and gets the pieces those bytes
  complete: whole structural pieces (heads, chunk lines) once all their bytes have
  reached it, body bytes split at its own chunk boundaries. So a slicer or a delay
  line in front of it changes nothing, as with its own framer.
- `PathFraming`: the streams of one connection's pipeline. Each direction starts as
  one stream (what enters from the client, or from the server); a fault that may
  change the bytes of a direction (`Fault.changes`) starts a new stream after it, fed
  by its output. The client leg and the upstream leg are the streams at the two ends,
  so with no rewriting fault both legs share one framing pass.
- `LegRecord`: what the journal, the scorer, `record` and the timeline need from one
  leg (heads, SSE events and comments, message ends, request bodies, optionally every
  piece), from its captured bytes in one pass (`LegRecord.from_bytes`), or by listening
  to that leg's streams.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

from middlebox.core.http1 import (
    LAST_CHUNK_BYTES,
    REQUEST_BODY_KEEP,
    Head,
    Http1Framer,
    Piece,
    PieceKind,
    Role,
    moved_piece,
)
from middlebox.core.sse import SseEvent, SseFramer, SseKind, SseLimits, SsePiece
from middlebox.core.stream import Chunk, Direction, Item

__all__ = [
    "BodyLane",
    "BodyPass",
    "BodyRun",
    "Framed",
    "FramedStream",
    "FramingLayout",
    "ItemPass",
    "LegRecord",
    "PathFraming",
    "Reader",
    "frame_new",
    "is_event_stream",
    "shifted",
]

_NO_LINES: tuple[SsePiece, ...] = ()
_LIMITS = SseLimits()
_SPLITTABLE = (PieceKind.BODY, PieceKind.OPAQUE)


def is_event_stream(head: Head) -> bool:
    """A `text/event-stream` body whose bytes are the events (no content coding)."""
    if "text/event-stream" not in (head.header("content-type") or "").lower():
        return False
    codings = [c for c in head.tokens("content-encoding") if c != "identity"]
    return not codings


@dataclass(slots=True)
class Framed:
    """A piece and the SSE lines it completes (`lines`: body offsets of its message);
    `body_offset` is where a BODY piece starts in its message's body."""

    piece: Piece
    lines: tuple[SsePiece, ...] = _NO_LINES
    body_offset: int = 0


Listener = Callable[[Framed], None]


class FramedStream:
    """One direction's bytes at one stretch of the path, framed once (see the module
    docstring). `passes` counts the streams that ran a framer, for tests."""

    passes = 0  # class-wide: framing passes started (a stream fed its first bytes)

    def __init__(
        self,
        direction: Direction,
        *,
        frames: bool = True,
        sse: bool = True,
        sse_limits: SseLimits = _LIMITS,
    ) -> None:
        self.direction = direction
        self.sse = sse  # frame event-stream bodies as SSE (someone reads their lines)
        # How much of an SSE line or event is held before the body's SSE framing stops
        # (an OVERFLOW piece: `middlebox.core.sse`), so a peer cannot grow it unbounded.
        self.sse_limits = sse_limits
        self.emitted = 0  # stream offset after the last piece out
        role: Role = "request" if direction is Direction.UPSTREAM else "response"
        self.http: Http1Framer | None = Http1Framer(role) if frames else None
        self.received = 0
        self.ended = False
        # A list, not a deque: a deque allocates a 64-slot block up front (~0.7 KiB a
        # stream, up to four streams a faulted connection), and the log is short (the
        # readers take it whole; it is trimmed past 16 entries)
        self._log: list[Framed] = []
        self._base = 0  # sequence number of _log[0]
        self._eof_at: int | None = None  # sequence number of the first piece of the end
        self._readers: list[Reader] = []
        self._listeners: list[Listener] = []
        self._sse: dict[int, SseFramer] = {}
        self._body: dict[int, int] = {}
        self._counted = False
        # The last stretch checked for a body pass (`BodyPass.passes`), kept so the next
        # place in step with it (or the stream a place published it to) is not scanned again
        self._body_run: BodyRun | None = None
        # pairing (Http1Exchange's job across the two directions)
        self.responses_to: list[FramedStream] = []  # request stream -> response streams
        self.tunnels: list[FramedStream] = []  # response stream -> request streams
        # what the requests of this stream were (a request stream keeps the last 64)
        self.request_heads: dict[int, Head] = {}
        self.request_bodies: dict[int, bytearray] = {}

    # -- writing -------------------------------------------------------------------

    def feed(self, data: bytes) -> None:
        if self.http is None or not data:
            return
        if not self._counted:
            self._counted = True
            FramedStream.passes += 1
        self.received += len(data)
        self._add(self.http.feed(data))

    def feed_eof(self) -> None:
        if self.ended:
            return
        self.ended = True
        self._eof_at = self._base + len(self._log)
        if self.http is not None:
            self._add(self.http.feed_eof())

    def publish(self, framed: list[Framed], bodies: bool = False) -> None:
        """Pieces a fault constructed for bytes it wrote (their offsets in this stream).
        What the framer would have learnt from them is learnt here too: a request's head
        and body (the faults past read them to decide), the method its response answers
        (a HEAD's has no body) and a 101's tunnel. `bodies`: they are all a response's
        body pieces, which teach nothing."""
        if not framed:
            return
        if not bodies:
            for entry in framed:
                piece = entry.piece
                if piece.head is not None:
                    self._head(piece.message, piece.head)
                elif piece.kind is PieceKind.BODY and self.direction is Direction.UPSTREAM:
                    self._keep_body(piece)
        if self._listeners:
            for entry in framed:
                self._append(entry)
        else:
            if self._readers:
                self._log.extend(framed)
            else:
                self._base += len(framed)
            last = framed[-1].piece
            self.emitted = last.offset + len(last.data)
        self.received = max(self.received, self.emitted)

    @property
    def read(self) -> bool:
        """Whether anyone takes this stream's pieces (a reader or a listener)."""
        return bool(self._readers or self._listeners)

    def pass_unread(self, count: int, end: int) -> None:
        """What `publish` does with `count` pieces ending at stream offset `end` when
        nobody reads them (see `read`), without the pieces being made."""
        self._base += count
        self.emitted = end
        self.received = max(self.received, end)

    def skips_body(self) -> bool:
        """Whether `skip_body` may take the next bytes (see there)."""
        http = self.http
        return (
            http is not None
            and http.skips_body
            and not (self._listeners or self._sse)
            and self._eof_at is None
        )

    def skip_body(self, data: bytes) -> int:
        """Take `data` as body of the message under way without framing pieces of it
        (`Http1Framer.skip_body`): the payload bytes in it, or -1 with nothing done. Only
        for a stream nobody listens to and no event stream is framed on: the pipeline's
        `BodyLane` asks, and moves its readers on itself."""
        if self.http is None or self._listeners or self._sse or self._eof_at is not None:
            return -1
        body = self.http.skip_body(data)
        if body >= 0:
            self.received += len(data)
            self.emitted += len(data)
            self._body_run = None
        return body

    def skip(self, size: int) -> None:
        """`size` more bytes published here as they came, all body, with no piece made:
        what `publish_passed` would have done for them with nobody listening."""
        self.emitted += size
        self.received = max(self.received, self.emitted)
        self._body_run = None

    def publish_end(self) -> None:
        if not self.ended:
            self.ended = True
            self._eof_at = self._base + len(self._log)

    def held(self) -> bytes:
        """Bytes fed but not yet out in a piece (an unfinished head or chunk line)."""
        return self.http.held if self.http is not None else b""

    # -- reading -------------------------------------------------------------------

    def reader(self) -> Reader:
        reader = Reader(self, self._base)  # readers are made before the bytes flow
        self._readers.append(reader)
        return reader

    def listen(self, listener: Listener) -> None:
        """Call `listener` with every piece from now on."""
        self._listeners.append(listener)

    def _add(self, pieces: list[Piece]) -> None:
        frame = self._frame
        if self._listeners:
            for piece in pieces:
                self._append(frame(piece))
            return
        if not pieces:
            return
        if self.direction is Direction.UPSTREAM:
            framed = [frame(piece) for piece in pieces]
        else:
            # with no event stream open (a head may open one) a body piece gains nothing
            sse = self._sse
            framed = [
                Framed(piece) if piece.head is None and not sse else frame(piece)
                for piece in pieces
            ]
        if self._readers:
            self._log.extend(framed)
        else:
            self._base += len(framed)
        last = pieces[-1]
        self.emitted = last.offset + len(last.data)

    def _frame(self, piece: Piece) -> Framed:
        kind = piece.kind
        message = piece.message
        if piece.head is None and not self._sse and self.direction is Direction.DOWNSTREAM:
            return Framed(piece)  # no event stream open: nothing to add to the piece
        if piece.head is not None:
            head = piece.head
            self._head(message, head)
            if (
                self.sse
                and not head.is_request
                and not head.is_interim
                and not piece.end_of_message
                and is_event_stream(head)
            ):
                self._sse[message] = SseFramer(self.sse_limits)
                self._body[message] = 0
            return Framed(piece)
        if kind is PieceKind.BODY:
            body = self._body.get(message)
            if self.direction is Direction.UPSTREAM:
                self._keep_body(piece)
            if body is None:
                return Framed(piece)
            self._body[message] = body + len(piece.data)
            sse = self._sse[message]
            lines = sse.feed(piece.data) if piece.data else []
            if piece.end_of_message:
                lines += sse.feed_eof()
                self._done(message)
            return Framed(piece, tuple(lines) if lines else _NO_LINES, body)
        if message in self._sse and kind in (PieceKind.LAST_CHUNK, PieceKind.OPAQUE):
            lines = self._sse[message].feed_eof()
            self._done(message)
            return Framed(piece, tuple(lines) if lines else _NO_LINES, 0)
        return Framed(piece)

    def _head(self, message: int, head: Head) -> None:
        """What a head tells the streams paired with this one: a request's method to its
        response stream's framer, a tunnel (a 101, a 2xx to CONNECT) to the requests'."""
        if head.is_request:
            self._request_head(message, head)
            for other in self.responses_to:
                if other.http is not None:
                    other.http.expect_response_to(head.method or "GET")
        elif self.http.tunnel if self.http is not None else head.status == 101:
            # A published head has no framer behind it: a 101 is the tunnel then (a CONNECT
            # never gets one: the request framer refuses it, as nginx does).
            for other in self.tunnels:
                if other.http is not None:
                    other.http.start_tunnel()

    def _keep_body(self, piece: Piece) -> None:
        kept = self.request_bodies.get(piece.message)
        if kept is not None and len(kept) < REQUEST_BODY_KEEP:
            kept += piece.data[: REQUEST_BODY_KEEP - len(kept)]

    def _done(self, message: int) -> None:
        self._sse.pop(message, None)
        self._body.pop(message, None)

    def _request_head(self, message: int, head: Head) -> None:
        self.request_heads[message] = head
        self.request_bodies[message] = bytearray()
        self.request_heads.pop(message - 64, None)
        self.request_bodies.pop(message - 64, None)

    def _append(self, entry: Framed) -> None:
        piece = entry.piece
        self.emitted = piece.offset + len(piece.data)
        if self._readers:
            self._log.append(entry)
        else:
            self._base += 1  # nobody reads this stream: keep nothing
        for listener in self._listeners:
            listener(entry)

    def _trim(self) -> None:
        low = min((reader.index for reader in self._readers), default=self._base + len(self._log))
        drop = min(low - self._base, len(self._log))
        if drop > 0:
            del self._log[:drop]
            self._base += drop

    def release(self) -> None:
        """The connection is over: let go of the readers and the paired streams, which
        refer back to this one (`PathFraming.release`)."""
        self._readers.clear()
        self.responses_to.clear()
        self.tunnels.clear()


class Reader:
    """One place's cursor in a `FramedStream` (see the module docstring)."""

    def __init__(self, stream: FramedStream, index: int) -> None:
        self.stream = stream
        self.index = index  # sequence number of the next piece to hand out
        self.partial = 0  # bytes of that piece already handed out (a split body)
        self.cursor = 0  # bytes that reached this place
        self.delivered = 0  # bytes handed out in pieces
        self.message = 0  # the message in progress here (or the next one)

    def close(self) -> None:
        """This place reads no more (its fault left the path): keep nothing for it."""
        if self in self.stream._readers:
            self.stream._readers.remove(self)
            self.stream._trim()

    @property
    def held(self) -> int:
        """Bytes that reached this place but wait inside an unfinished structural piece."""
        return self.cursor - self.delivered

    def advance(self, size: int) -> list[Framed]:
        """The pieces completed by `size` more bytes reaching this place."""
        self.cursor += size
        return self._take(self.cursor, final=False)

    def end(self) -> list[Framed]:
        """This place saw its stream end (FIN or RST): what is left up to its bytes."""
        stream = self.stream
        if stream.ended and stream.received == self.cursor:
            return self._take(self.cursor, final=True)
        out = self._take(self.cursor, final=False)
        rest = self.cursor - self.delivered
        if rest > 0:
            # The stream ends early here (a fault ended it): what is held goes out as it
            # came, as a framer does at EOF.
            data = self._pending_bytes(rest)
            piece = Piece(PieceKind.OPAQUE, data, self.message, self.delivered)
            self.delivered += rest
            out.append(Framed(piece))
        return out

    def _pending_bytes(self, size: int) -> bytes:
        stream = self.stream
        position = self.index - stream._base
        if position < len(stream._log):
            piece = stream._log[position].piece
            return piece.data[self.partial : self.partial + size]
        return stream.held()[:size]

    def _take(self, limit: int, final: bool) -> list[Framed]:
        stream = self.stream
        log = stream._log
        position = self.index - stream._base
        if (
            not self.partial
            and limit >= stream.emitted
            and (final or stream._eof_at is None)
            and position < len(log)
        ):
            # In step with the stream (the usual case: this place got the bytes just
            # framed): everything logged since is this place's, whole.
            out = log[position:]
            last = out[-1].piece
            self.index = stream._base + len(log)
            self.delivered = last.offset + len(last.data)
            self.message = last.message + 1 if last.end_of_message else last.message
            if len(stream._readers) == 1:
                stream._base = self.index  # the only reader is past everything kept
                log.clear()
            elif len(log) > 16:
                stream._trim()
            return out
        out = []
        stop = stream._eof_at if not final and stream._eof_at is not None else None
        while position < len(log):
            if stop is not None and self.index >= stop:
                break
            entry = log[position]
            piece = entry.piece
            start = piece.offset + self.partial
            end = piece.offset + len(piece.data)
            if end <= limit and (end > start or self.partial == 0):
                if self.partial:
                    entry = _slice(entry, self.partial, len(piece.data))
                out.append(entry)
                self.delivered = end
                self.partial = 0
                self.index += 1
                position += 1
                self.message = piece.message + 1 if piece.end_of_message else piece.message
                continue
            if piece.kind in _SPLITTABLE and start < limit:
                cut = limit - piece.offset
                out.append(_slice(entry, self.partial, cut))
                self.partial = cut
                self.delivered = limit
                self.message = piece.message
            break
        if len(log) > 64:
            stream._trim()
        return out


class BodyRun:
    """One stretch of a framed stream checked for a body pass: the log's pieces from
    sequence number `index` that start before stream offset `end`, read from offset
    `start` by a place in message `message`. `body` is the stretch's body bytes (chunk
    data, not chunk lines), or -1 when it is not all body of that message (a head, the
    message's end other than by a body piece, another message, a chunk line cut at
    `end`); `whole_chunks` says it ends after a chunk's CRLF; `ends` that a body piece in
    it ends the message (a Content-Length body's last bytes: only a place whose pass does
    all its fault does at a message's end takes it, `BodyPass.ends`). The log's piece at
    a sequence number never changes, so a verdict holds for every place that reaches the
    same stretch in the same state: the pipeline's places in step on one stream share it,
    and a place that passes the bytes on as they came hands it to the stream it publishes
    to (moved by its shift)."""

    __slots__ = ("body", "end", "ends", "index", "message", "start", "whole_chunks")

    def __init__(
        self,
        index: int,
        start: int,
        end: int,
        message: int,
        body: int,
        whole_chunks: bool,
        ends: bool = False,
    ) -> None:
        self.index = index
        self.start = start
        self.end = end
        self.message = message
        self.body = body
        self.whole_chunks = whole_chunks
        self.ends = ends

    @classmethod
    def scan(cls, stream: FramedStream, index: int, start: int, end: int, message: int) -> BodyRun:
        """The verdict on the stretch, from the log (RFC 9112 §7.1: data and the chunk
        lines around it are body; a last chunk or trailers end the message)."""
        body_kind, header = PieceKind.BODY, PieceKind.CHUNK_HEADER
        crlf = PieceKind.CHUNK_TRAILER_CRLF
        log = stream._log
        body = 0
        kind = None
        ends = False
        for position in range(index - stream._base, len(log)):
            piece = log[position].piece
            if piece.offset >= end:
                break
            kind = piece.kind
            if kind is body_kind:
                if piece.message != message:
                    return cls(index, start, end, message, -1, False)
                ends = ends or piece.end_of_message
                # the part of it in the stretch (a read may end, or have started, inside it)
                body += min(end, piece.offset + len(piece.data)) - max(start, piece.offset)
            elif (
                (kind is not header and kind is not crlf)
                or piece.end_of_message
                or piece.message != message
                or piece.offset + len(piece.data) > end
            ):
                return cls(index, start, end, message, -1, False)
        return cls(index, start, end, message, body, kind is crlf, ends)


class ItemPass:
    """What a fault that steps aside for some items does with one the pipeline passes it
    over for (`Fault.body_aside`): `passes(item, now)` does for `item` what the fault's
    `on_item` would have done when that hands the item on unchanged, and answers True;
    for any other item it does nothing and answers False, and the fault is called. One
    method, not a call per check: it runs for every item that reaches such a fault.
    What it does may move the fault's deadline later (a read timer re-armed) or clear
    it (a response's end passed over), never earlier or from none, and changes nothing
    else the pipeline's effects read
    (pausing, a stage's flags): those stay as the last hook left them (`Pipeline.feed`).
    `BodyPass` is the one for a message's body bytes."""

    __slots__ = ()

    def passes(self, item: Item, now: float) -> bool:
        return False

    def skips(self, direction: Direction) -> bool:
        """Whether the pipeline may pass this place over for a run of body reads in
        `direction` and tell it once, after the run (`skipped`), instead of read by read
        (`BodyLane`): only where what `passes` does for each read adds up, and while this
        place is in step with the bytes that passed it. False unless a subclass says."""
        return False

    def skipped(self, size: int, body: int, whole_chunks: bool, now: float) -> None:
        """What `passes` would have done for reads adding up to `size` bytes, all body of
        the message under way and none its end (`body` of them payload; `whole_chunks`:
        they ended after a chunk's CRLF), the last of them at `now`."""


class BodyPass(ItemPass):
    """A fault's place in one direction's framed stream, kept in step while the pipeline
    passes that fault over for the rest of a message's body (`Fault.body_aside`).

    `passes(item, now)` does what such a fault does with an item whose bytes are all body
    of the message under way at its place: its reader advances over them, and the
    pieces they complete go on to the stream it publishes to (`publish`), moved by
    `shift` (how much its earlier writes, a rewritten head, changed the stream's
    length). For anything else it does nothing and answers False, so the fault is given
    the item itself, with its reader exactly where it left it.

    `ends`: the body piece that ends a message may pass too (a Content-Length body's last
    bytes, RFC 9112 §6.3; a 64 KiB response's body is often one read), for a fault whose
    `passed` does all it does at a message's end; a last chunk and trailers still reach
    it."""

    __slots__ = ("direction", "ends", "publish", "reader", "shift")

    def __init__(
        self,
        direction: Direction,
        reader: Reader,
        publish: FramedStream | None,
        ends: bool = False,
    ) -> None:
        self.direction = direction
        self.reader = reader
        self.publish = publish
        self.shift = 0
        self.ends = ends

    def passes(self, item: Item, now: float) -> bool:
        """Pass the fault over for `item` if its bytes are all body of the message under
        way here, framed whole with nothing held before or after them (`BodyRun`).
        False, with nothing done, for another direction, an end of stream, a head, the
        message's end (but its last body piece with `ends`), bytes the framer holds, or a
        chunk line cut at either edge. The verdict on the stretch is made once: a place in
        step with one that asked before (or fed by one that passed the same bytes on)
        reuses it."""
        if item.direction is not self.direction or type(item) is not Chunk:
            return False
        reader = self.reader
        start = reader.cursor
        if start != reader.delivered:
            return False  # an unfinished chunk line waits here: the fault reads it whole
        stream = reader.stream
        size = len(item.data)
        limit = start + size
        if limit > stream.emitted or stream._eof_at is not None:
            return False  # the framer holds part of these bytes, or the stream is ending
        index = reader.index
        message = reader.message
        run = stream._body_run
        if (
            run is None
            or run.index != index
            or run.start != start
            or run.end != limit
            or run.message != message
        ):
            run = stream._body_run = BodyRun.scan(stream, index, start, limit, message)
        if run.body < 0 or (run.ends and not self.ends):
            return False
        reader.cursor = limit  # `advance(size)`, a call fewer
        self.passed(reader._take(limit, False), run, now)
        return True

    def passed(self, framed: list[Framed], run: BodyRun, now: float) -> None:
        """What the fault does with the body bytes of `run` reaching it at `now`, passed
        on as they came: publish their pieces (`publish_passed`). A fault that also keeps
        count of them (a read timer) extends this; it runs once per item passed over."""
        self.publish_passed(framed, run)

    def skips(self, direction: Direction) -> bool:
        """In step in `direction` with nobody reading what it publishes piece by piece;
        a subclass that extends `passed` must extend `skipped` too, and one that changes
        `passes` or `publish_passed` is asked read by read."""
        kind = type(self)
        if kind.passed is not BodyPass.passed and kind.skipped is BodyPass.skipped:
            return False
        if kind.passes is not BodyPass.passes or kind.publish_passed is not BodyPass.publish_passed:
            return False
        reader = self.reader
        publish = self.publish
        return (
            direction is self.direction
            and not reader.partial
            and reader.cursor == reader.delivered == reader.stream.emitted
            and (publish is None or not (publish._listeners or publish._sse))
        )

    def skipped(self, size: int, body: int, whole_chunks: bool, now: float) -> None:
        """The reader moved past the bytes, and the stream after it told of them."""
        reader = self.reader
        reader.cursor += size
        reader.delivered += size
        if self.publish is not None:
            self.publish.skip(size)

    def publish_passed(self, framed: list[Framed], run: BodyRun | None = None) -> None:
        """Body pieces this place passes on as they came: to the stream after it, moved
        by `shift`; counted without being made when nobody reads that stream. With the
        stretch's verdict (`run`), the stream after it gets it too, moved the same way."""
        stream = self.publish
        if stream is None or not framed:
            return
        shift = self.shift
        responses = self.direction is Direction.DOWNSTREAM
        if responses and not (stream._readers or stream._listeners):  # nobody reads it
            # what `publish` does with response body pieces nobody reads: count them
            last = framed[-1].piece
            stream.pass_unread(len(framed), last.offset + len(last.data) + shift)
            return
        index = stream._base + len(stream._log)
        stream.publish(
            [shifted(entry, shift) for entry in framed] if shift else framed, bodies=responses
        )
        if run is not None:
            first = framed[0].piece.offset + shift
            stream._body_run = BodyRun(
                index, first, run.end + shift, run.message, run.body, run.whole_chunks, run.ends
            )


class BodyLane:
    """A response body passed over every fault at once, read after read, and each place
    told once when the run ends (`ItemPass.skipped`), instead of read by read.

    It opens after a read passed over every fault of its direction (each stepped aside
    for it or passed it as body: no hook ran) when every place that passed it can be
    told later (`ItemPass.skips`), nobody listens to the direction's streams and no
    event stream is framed on them. Each next read is checked against
    the framer at the path's server end (`FramedStream.skip_body`: whole chunks, or a
    body's bytes short of its end) and goes out as it came: a read that passes every
    fault as body of the message under way leaves each exactly as the same reads passed
    one by one would have, so telling them the sums later is the same (the reads' sizes,
    payload, and the time of the last, which is what a read timer re-arms from). Any
    other read, and any other call on the pipeline, closes it first (`close`)."""

    __slots__ = ("body", "entry", "last", "places", "size", "whole_chunks")

    def __init__(self, entry: FramedStream, places: list[ItemPass], whole_chunks: bool) -> None:
        self.entry = entry
        self.places = places  # in the order the direction's bytes reach them
        self.whole_chunks = whole_chunks
        self.size = 0
        self.body = 0
        self.last = 0.0

    @classmethod
    def open(
        cls, entry: FramedStream, streams: list[FramedStream], places: list[ItemPass]
    ) -> BodyLane | None:
        """The lane on `entry` (the direction's stream at the path's end where its bytes
        come in) for `places`, if `streams` (all of that direction's) and they allow."""
        readers = []
        direction = entry.direction
        for place in places:
            if not place.skips(direction):
                return None
            if isinstance(place, BodyPass):
                readers.append(place.reader)
        for stream in streams:
            if stream._listeners or stream._sse or stream._eof_at is not None:
                return None
            for reader in stream._readers:
                if reader not in readers:
                    return None  # a place stepping aside would miss the pieces it keeps
        http = entry.http
        if http is None or not entry.skips_body():
            return None
        return cls(entry, places, http.in_chunks)

    def take(self, data: bytes, now: float) -> bool:
        """`data`, the next read in the lane's direction, passed over every place as body
        (True), or not taken, with nothing changed (False: close the lane and feed it)."""
        body = self.entry.skip_body(data)
        if body < 0:
            return False
        self.size += len(data)
        self.body += body
        self.last = now
        return True

    def close(self) -> None:
        """Tell each place what passed it since the lane opened."""
        size = self.size
        if size:
            body, whole_chunks, last = self.body, self.whole_chunks, self.last
            for place in self.places:
                place.skipped(size, body, whole_chunks, last)


def shifted(entry: Framed, shift: int) -> Framed:
    """`entry` at `shift` bytes further into the stream (a head before it changed size)."""
    return Framed(moved_piece(entry.piece, shift), entry.lines, entry.body_offset)


def _slice(entry: Framed, begin: int, end: int) -> Framed:
    """Part of a BODY/OPAQUE piece; its SSE lines go with the part in which they end."""
    piece = entry.piece
    last = end == len(piece.data)
    part = Piece(
        piece.kind,
        piece.data[begin:end],
        piece.message,
        piece.offset + begin,
        None,
        piece.end_of_message and last,
    )
    low = entry.body_offset + begin
    high = entry.body_offset + end
    lines = tuple(
        line
        for line in entry.lines
        if (begin == 0 or line.offset + len(line.data) > low)
        and (last or line.offset + len(line.data) <= high)
    )
    return Framed(part, lines, low)


def frame_new(direction: Direction, data: bytes, message: int, offset: int) -> list[Framed]:
    """The pieces of bytes a fault writes itself (an error page it answers with),
    numbered from `message` at stream `offset`: framing new bytes, which nobody else
    framed. The last chunk of a chunked body it completes is built directly."""
    if data == LAST_CHUNK_BYTES:
        return [
            Framed(Piece(PieceKind.LAST_CHUNK, data[:3], message, offset)),
            Framed(Piece(PieceKind.TRAILERS, data[3:], message, offset + 3, None, True)),
        ]
    framer = Http1Framer("request" if direction is Direction.UPSTREAM else "response")
    return [
        Framed(
            Piece(p.kind, p.data, p.message + message, p.offset + offset, p.head, p.end_of_message)
        )
        for p in framer.feed(data)
    ]


# -- one connection's path -------------------------------------------------------------


@dataclass
class Position:
    """What the fault at one place in the path reads: the streams of both directions
    there, and the streams after it that it publishes to (None unless it publishes)."""

    up: FramedStream
    down: FramedStream
    publish: dict[Direction, FramedStream] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class FramingLayout:
    """The shape of a pipeline's framing, worked out from its faults' `changes` and
    `publishes` alone: how many streams each direction has and whether each runs a
    framer, which stream every place reads, whose output feeds which stream, and how
    request and response streams pair. The same for every connection of a scenario, so
    the server computes it once and each connection only makes the streams
    (`PathFraming.from_layout`). Streams are numbered per direction from where the
    direction enters the path (client side for UPSTREAM, server side for DOWNSTREAM)."""

    size: int
    up_frames: tuple[bool, ...]  # per upstream stream: whether a framer runs on it
    down_frames: tuple[bool, ...]
    up_at: tuple[int, ...]  # the upstream stream at place p (between faults p-1 and p)
    down_at: tuple[int, ...]
    fed_after: tuple[tuple[int, Direction, int], ...]  # (fault, direction, stream it feeds)
    responses_to: tuple[tuple[int, int], ...]  # (request stream, response stream)
    tunnels: tuple[tuple[int, int], ...]  # (response stream, request stream)
    streams: tuple[tuple[Direction, int], ...]  # every stream once, in place order
    publishes: tuple[frozenset[Direction], ...]
    sse: bool
    sse_limits: SseLimits = _LIMITS

    @classmethod
    def of(
        cls,
        changes: list[frozenset[Direction]],
        publishes: list[frozenset[Direction]],
        sse: bool = True,
        sse_limits: SseLimits = _LIMITS,
    ) -> FramingLayout:
        size = len(changes)
        up, down = Direction.UPSTREAM, Direction.DOWNSTREAM
        fed_after: list[tuple[int, Direction, int]] = []
        up_frames, up_at = [True], [0]
        for index in range(size):
            if up in changes[index]:
                up_frames.append(up not in publishes[index])
                if up not in publishes[index]:
                    fed_after.append((index, up, len(up_frames) - 1))
            up_at.append(len(up_frames) - 1)
        # Built server side first, then put in place order.
        down_frames, down_from_server = [True], [0]
        for index in reversed(range(size)):
            if down in changes[index]:
                down_frames.append(down not in publishes[index])
                if down not in publishes[index]:
                    fed_after.append((index, down, len(down_frames) - 1))
            down_from_server.append(len(down_frames) - 1)
        down_at = down_from_server[::-1]
        # A response stream takes its request methods from the request stream where it
        # enters (its server-most place); a request stream its tunnel from the response
        # stream where it enters (its client-most place).
        responses_to: list[tuple[int, int]] = []
        tunnels: list[tuple[int, int]] = []
        for place in range(size + 1):
            request, response = up_at[place], down_at[place]
            entering_down = place == size or down_at[place + 1] != response
            if entering_down and (request, response) not in responses_to:
                responses_to.append((request, response))
            entering_up = place == 0 or up_at[place - 1] != request
            if entering_up and (response, request) not in tunnels:
                tunnels.append((response, request))
        streams = dict.fromkeys([*((up, n) for n in up_at), *((down, n) for n in down_at)])
        return cls(
            size,
            tuple(up_frames),
            tuple(down_frames),
            tuple(up_at),
            tuple(down_at),
            tuple(fed_after),
            tuple(responses_to),
            tuple(tunnels),
            tuple(streams),
            tuple(publishes),
            sse,
            sse_limits,
        )


class PathFraming:
    """The framed streams of one connection's pipeline of `size` faults.

    `changes[i]` holds the directions in which fault i may change bytes and
    `publishes[i]` those in which it publishes the pieces of its output itself; for
    the others the pipeline feeds its output to `after(i, direction)`. The layout of
    the streams is a `FramingLayout`; `from_layout` makes a connection's streams from
    one computed before (once per scenario).
    """

    def __init__(
        self,
        changes: list[frozenset[Direction]],
        publishes: list[frozenset[Direction]],
        sse: bool = True,
    ) -> None:
        self._build(FramingLayout.of(changes, publishes, sse))

    @classmethod
    def from_layout(cls, layout: FramingLayout) -> PathFraming:
        framing = cls.__new__(cls)
        framing._build(layout)
        return framing

    def _build(self, layout: FramingLayout) -> None:
        up, down = Direction.UPSTREAM, Direction.DOWNSTREAM
        sse, limits = layout.sse, layout.sse_limits
        ups = [
            FramedStream(up, frames=frames, sse=sse, sse_limits=limits)
            for frames in layout.up_frames
        ]
        downs = [
            FramedStream(down, frames=frames, sse=sse, sse_limits=limits)
            for frames in layout.down_frames
        ]
        self.layout = layout
        self.size = layout.size
        # up_at[p] / down_at[p]: the stream at place p (between faults p-1 and p).
        self.up_at: list[FramedStream] = [ups[n] for n in layout.up_at]
        self.down_at: list[FramedStream] = [downs[n] for n in layout.down_at]
        self.fed_after: dict[tuple[int, Direction], FramedStream] = {
            (index, direction): (ups if direction is up else downs)[n]
            for index, direction, n in layout.fed_after
        }
        for request, response in layout.responses_to:
            ups[request].responses_to.append(downs[response])
        for response, request in layout.tunnels:
            downs[response].tunnels.append(ups[request])
        self.publishes = layout.publishes
        self.streams = [(ups if direction is up else downs)[n] for direction, n in layout.streams]

    def release(self) -> None:
        """The connection is over: each stream lets go of its readers, which refer back to
        it (a cycle per place), and of its pair in the other direction (a request stream
        and its responses' refer to each other), so the streams go with their last
        reference."""
        for stream in self.streams:
            stream.release()

    def entry(self, direction: Direction) -> FramedStream:
        """The stream that what enters the path in `direction` is fed to."""
        return self.up_at[0] if direction is Direction.UPSTREAM else self.down_at[self.size]

    def position(self, index: int) -> Position:
        """What fault `index` reads (the stream of each direction as it reaches it)."""
        up, down = Direction.UPSTREAM, Direction.DOWNSTREAM
        publish: dict[Direction, FramedStream] = {}
        if up in self.publishes[index]:
            publish[up] = self.up_at[index + 1]
        if down in self.publishes[index]:
            publish[down] = self.down_at[index]
        return Position(self.up_at[index], self.down_at[index + 1], publish)

    def between_messages(self) -> bool:
        """No message is under way anywhere on the path: every framed stream is between
        messages (no byte of a next one, no tunnel, nothing unframeable) and on each leg
        every request has had its whole response. nginx's idle keep-alive connection,
        which its graceful shutdown closes at once (`ngx_close_idle_connections`); what
        the faults still hold is for the caller to ask (their deadlines)."""
        for stream in self.streams:
            framer = stream.http
            if framer is None:
                continue  # a fault publishes this stream's pieces: the legs' ends say
            if framer.tunnel or framer.degraded is not None or not framer.message_complete:
                return False
        for name in ("client", "upstream"):
            requests, responses = (stream.http for stream in self.leg(name))
            if (
                requests is not None
                and responses is not None
                and (responses.message < requests.message)
            ):
                return False  # a request still waits for (the rest of) its answer
        return True

    def leg(self, name: str) -> tuple[FramedStream, FramedStream]:
        """The (request, response) streams of the `client` or `upstream` leg."""
        if name == "client":
            return self.up_at[0], self.down_at[0]
        return self.up_at[self.size], self.down_at[self.size]


# -- what the observers keep of a leg ----------------------------------------------------

REQUEST_BODIES_KEPT = 8 * 1024 * 1024
"""Request body bytes a limited LegRecord keeps in all (the journal's capture per leg and
direction is the same 8 MiB, `observe.journal.MAX_CAPTURE_BYTES`)."""


@dataclass
class LegRecord:
    """One leg as the journal, scorer and recorder read it: every head, SSE event,
    comment line and message end with its stream offset, the request bodies (first
    REQUEST_BODY_KEEP bytes), and with `keep_pieces` every piece of both directions.

    With a `limit` (the journal's records) nothing grows with the connection's age:
    heads, events, ends and per-response comment counts share the limit, and the request
    bodies kept total at most REQUEST_BODIES_KEPT bytes, the oldest dropped first (a
    keep-alive client sending request after request must not grow the proxy)."""

    keep_pieces: bool = False
    limit: int | None = None  # most heads + events + ends kept; the rest are counted
    dropped: int = 0
    heads: dict[Direction, list[tuple[int, int, int, Head]]] = field(
        default_factory=lambda: {d: [] for d in Direction}
    )  # (message, offset, size, head)
    events: dict[Direction, list[tuple[int, int, SseEvent]]] = field(
        default_factory=lambda: {d: [] for d in Direction}
    )  # (message, stream offset of the event's first byte, event)
    comments: dict[int, int] = field(default_factory=dict)  # response message -> comments
    ends: dict[Direction, list[tuple[int, int]]] = field(
        default_factory=lambda: {d: [] for d in Direction}
    )  # (message, stream offset after its last byte)
    request_bodies: dict[int, bytearray] = field(default_factory=dict)
    pieces: dict[Direction, list[Framed]] = field(
        default_factory=lambda: {d: [] for d in Direction}
    )
    _segments: dict[int, list[tuple[int, int]]] = field(default_factory=dict, repr=False)
    _kept: int = field(default=0, repr=False)
    _body_bytes: int = field(default=0, repr=False)

    def listen(self, requests: FramedStream, responses: FramedStream) -> LegRecord:
        requests.listen(lambda framed: self.add(Direction.UPSTREAM, framed))
        responses.listen(lambda framed: self.add(Direction.DOWNSTREAM, framed))
        return self

    @classmethod
    def from_bytes(
        cls,
        request_bytes: bytes,
        response_bytes: bytes,
        *,
        keep_pieces: bool = False,
        ended: bool = False,
        limit: int | None = None,
    ) -> LegRecord:
        """One framing pass over a captured leg (`ended`: the response stream closed
        after these bytes, which ends a read-until-close body or cuts one short)."""
        record = cls(keep_pieces=keep_pieces, limit=limit)
        requests = FramedStream(Direction.UPSTREAM)
        responses = FramedStream(Direction.DOWNSTREAM)
        requests.responses_to.append(responses)
        responses.tunnels.append(requests)
        record.listen(requests, responses)
        requests.feed(request_bytes)
        responses.feed(response_bytes)
        if ended:
            responses.feed_eof()
        return record

    def _room(self) -> bool:
        if self.limit is None or self._kept < self.limit:
            self._kept += 1
            return True
        self.dropped += 1
        return False

    def add(self, direction: Direction, framed: Framed) -> None:
        piece = framed.piece
        if self.keep_pieces:
            self.pieces[direction].append(framed)
        if piece.head is not None:
            if self._room():
                self.heads[direction].append(
                    (piece.message, piece.offset, len(piece.data), piece.head)
                )
            if direction is Direction.UPSTREAM:
                self.request_bodies[piece.message] = bytearray()
        elif piece.kind is PieceKind.BODY:
            if direction is Direction.UPSTREAM:
                body = self.request_bodies.get(piece.message)
                if body is not None and len(body) < REQUEST_BODY_KEEP:
                    kept = piece.data[: REQUEST_BODY_KEEP - len(body)]
                    body += kept
                    self._keep_body_bytes(len(kept))
            elif framed.lines or piece.message in self._segments:
                self._segments.setdefault(piece.message, []).append(
                    (framed.body_offset, piece.offset)
                )
        dispatched = False
        for line in framed.lines:
            if line.kind is SseKind.COMMENT and (piece.message in self.comments or self._room()):
                self.comments[piece.message] = self.comments.get(piece.message, 0) + 1
            event = line.event
            if event is not None:
                dispatched = True
                if self._room():
                    start = line.offset + len(line.data) - len(event.raw)
                    where = _stream_offset(self._segments.get(piece.message, []), start, piece)
                    self.events[direction].append((piece.message, where, event))
        lines = framed.lines
        ended = dispatched or bool(lines and lines[-1].kind is SseKind.OVERFLOW)
        segments = self._segments.get(piece.message) if ended else None
        if segments:
            # The next event starts after this one's end (or, past the SSE bound, never):
            # the earlier pieces' starts are never looked up again (a day-long stream has
            # millions).
            del segments[:-1]
        if piece.end_of_message:
            if self._room():
                self.ends[direction].append((piece.message, piece.offset + len(piece.data)))
            self._segments.pop(piece.message, None)

    def request_body(self, message: int) -> bytes:
        return bytes(self.request_bodies.get(message, b""))

    def _keep_body_bytes(self, added: int) -> None:
        self._body_bytes += added
        if self.limit is None:
            return
        while self._body_bytes > REQUEST_BODIES_KEPT and len(self.request_bodies) > 1:
            oldest = next(iter(self.request_bodies))
            self._body_bytes -= len(self.request_bodies.pop(oldest))
            self.dropped += 1


def _stream_offset(segments: list[tuple[int, int]], body_offset: int, piece: Piece) -> int:
    """A body offset to a stream offset, through the BODY pieces' (body, stream) starts."""
    for body_start, stream_start in reversed(segments):  # an event starts in a recent piece
        if body_start <= body_offset:
            return stream_start + body_offset - body_start
    return piece.offset
