"""cut: a stream cut mid-response, at an exact event, token, byte or time.

What it imitates: a load balancer or NAT that drops the connection (RST), a proxy or
server that closes cleanly in the middle of a generation (FIN without `[DONE]`: the
silent truncation the openai client cannot see, vllm-wire.md §9), a proxy whose
upstream died after the head went out (a chunked body without its terminal chunk,
what nginx's `ngx_http_upstream_finalize_request` sends once `u->header_sent`), and a
blackholed path (the client waits forever).

When: `after: events` (N dispatched SSE events, counted by the WHATWG rules of
`middlebox.core.sse`: every event counts, a Responses stream's `response.created` and a
Messages stream's `message_start` and `ping` included), `tokens` (N events that add text to
the answer, the reasoning or a tool call's arguments: one vLLM frame is a token with
`--stream-interval 1`), `tool_fragments` (N events carrying a tool-call argument fragment:
chat's `{"index": 0, "function": {"arguments": "..."}}` deltas, Responses'
`response.function_call_arguments.delta`, Messages' `input_json_delta`: the cut lands inside
the call's arguments, before its JSON closes), `reasoning_tokens` (N events carrying
reasoning text: chat's `delta.reasoning`, Responses' `response.reasoning_text.delta`,
Messages' `thinking_delta`: inside the reasoning phase, before the answer starts), `finish`
(N events that end the answer: a `finish_reason` or an in-band error frame on chat and
completions, the `response.completed` / `incomplete` / `failed` or `error` event on
Responses, the `message_delta` carrying `stop_reason` or `event: error` on Messages;
`count: 1` for an n=1 stream: the answer or tool call is complete and the connection dies
before what closes the stream, the usage chunk and `[DONE]` or `message_stop`; nothing
follows a Responses stream's `response.completed` but the HTTP message's end, which is all
the client then lacks), `bytes` (N
bytes of de-chunked response body), or `time` (seconds since the request's head arrived).
What an event carries is read by `middlebox.core.dialects` in the dialect of the API the
request asked (`POST /v1/chat/completions`, `/v1/completions`, `/v1/responses`, `GET
/v1/responses/{id}?stream=true`, `POST /v1/messages`), as the scorer reads it, and by the
event's own shape when the path names none; so `tokens: 12` lands after the same piece of
the same answer in each. Where: at the first position at or after that point that is an
`event_boundary` (after a blank line, and after the chunk's CRLF when the event ends its
HTTP chunk), `inside_data_line` (after at least
one byte of a `data:` line and before its line end) or `inside_utf8` (between the
bytes of one multi-byte UTF-8 character of a `data:` line, in the first event that
has one). When several positions qualify in the first line that has any, the seeded
rng picks one, unless the point itself qualifies (so `bytes: 100` cuts at body byte
100 exactly). Body positions map back to wire bytes, so a cut inside a chunk's data
truncates that chunk.

How it ends (`end`), toward whom (`toward`):
- `rst`: an RST; `truncated_chunked`: a FIN without the terminal chunk;
- `fin`: a clean-looking end. On a chunked response the fault completes the HTTP
  message: after a whole chunk it sends the terminal `0\\r\\n\\r\\n`; inside a chunk it
  re-frames the cut chunk to the bytes kept, when that chunk's size line has not gone
  out yet (it holds bytes past the cut point until the cut is placed), so the HTTP
  message is valid and only the SSE stream lacks `[DONE]`. If the size line already
  went out it cannot, closes as `truncated_chunked` and reports so. On a
  Content-Length body the client sees a short body; on a read-until-close body the
  FIN is the normal end;
- `hang`: nothing more is forwarded toward the peer, and the connection stays open;
  the client's own close is still passed on to the server.
- `toward: both`: the client gets the end and the server gets the same kind (an RST,
  or a FIN, which vLLM treats as a disconnect and aborts on, vllm-wire.md §3); after
  `hang` the server hears only the client's close.
- `toward: client`: only the client gets the end; the upstream connection stays open
  and the server streams into the void (its bytes are read and dropped, and the
  client's later bytes and close are not passed on, except after `hang`), as behind a
  proxy that does not propagate a client abort.
- `toward: server`: only the server gets the end (an RST, a FIN, or silence); the
  client gets no more response bytes but stays connected, and sees whatever end the
  upstream connection then has (its FIN or RST is passed on), as behind a proxy that
  lost its upstream leg; after an RST toward the server the relay drops that socket
  and the client hangs until its own timeout.

Only the first selected response that reaches the point is cut (the connection is
over after that); responses that complete first are left alone, and each keep-alive
exchange counts from zero. The report says the exact wire offset, body offset, event
index, tokens and time of the cut.

A response whose SSE line or event passes the proxy's bound (`proxy.sse_max_line`,
`proxy.sse_max_event`) before the cut is placed can no longer be counted or cut at a line:
`cut` steps aside for the rest of that response (its bytes pass as they come, the bytes
held for the cut point included) and reports `stepped_aside` with the events and tokens
counted so far; the next response on the connection is watched again.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import ClassVar, Literal

from faults._lib.checks import check_choice, check_positive
from faults._lib.events import response_dialect
from faults._lib.items import merged
from faults._lib.match import HttpMatched
from middlebox.core.dialects import Dialect, TokenKind, read
from middlebox.core.fault import Fault, Seconds
from middlebox.core.http1 import LAST_CHUNK_BYTES, Piece, PieceKind, encode_chunk
from middlebox.core.sse import SseKind, SsePiece, utf8_cut_offsets
from middlebox.core.stream import DOWN, UP, Chunk, Direction, Eof, Item, Reset

After = Literal["events", "tokens", "tool_fragments", "reasoning_tokens", "finish", "bytes", "time"]
End = Literal["rst", "fin", "truncated_chunked", "hang"]
At = Literal["event_boundary", "inside_data_line", "inside_utf8"]
Toward = Literal["both", "client", "server"]
_COUNTED = ("events", "tokens", "tool_fragments", "reasoning_tokens", "finish")


@dataclass
class _ChunkSpan:
    """One HTTP chunk of the body: where its size line starts on the wire, where its
    data starts on the wire and in the body, and its size."""

    header_wire: int
    data_wire: int
    data_body: int
    size: int


@dataclass
class _Response:
    """The response being watched for the cut point."""

    message: int
    start: float
    dialect: Dialect | None = None  # the API the request asked; None: read by shape
    head_end: int = 0
    chunked: bool = False
    line_end: int = 0  # body offset after the last complete SSE line
    in_block: bool = False  # lines of an event block arrived, not yet its blank line
    segments: list[tuple[int, int, int]] = field(default_factory=list)  # body, wire, size
    chunk: _ChunkSpan | None = None
    chunks: list[_ChunkSpan] = field(default_factory=list)
    body: int = 0
    events: int = 0
    tokens: int = 0
    tool_fragments: int = 0
    reasoning_tokens: int = 0
    finishes: int = 0
    threshold: int | None = None
    cut_body: int | None = None
    cut_wire: int | None = None
    cut_event: int = 0
    cut_tokens: int = 0
    cut_chunk: _ChunkSpan | None = None
    after_chunk: bool = False  # the cut falls after a whole chunk (its CRLF included)
    trailer: tuple[int, int] = (-1, -1)  # body offset and wire end of the last chunk's CRLF

    def chunk_holding(self, body: int) -> _ChunkSpan | None:
        """The chunk whose data holds body byte `body - 1` (None for 0)."""
        for chunk in reversed(self.chunks):
            if chunk.data_body < body <= chunk.data_body + chunk.size:
                return chunk
        return None

    def wire_after(self, body: int) -> int:
        """The wire offset just after body byte `body - 1` (the head's end for 0)."""
        if body <= 0:
            return self.head_end
        for start, wire, size in reversed(self.segments):
            if start < body <= start + size:
                return wire + (body - start)
        raise ValueError(f"body offset {body} has not arrived")


@dataclass
class Cut(HttpMatched, Fault):
    """Cut the response after `count` events/tokens/bytes or `time` seconds."""

    name: ClassVar[str] = "cut"

    after: After = "events"
    count: int = 3
    time: Seconds = 1.0
    end: End = "rst"
    at: At = "event_boundary"
    toward: Toward = "both"

    _pending: bytearray = field(init=False, repr=False, default_factory=bytearray)
    _forwarded: int = field(init=False, repr=False, default=0)
    _starts: dict[int, float] = field(init=False, repr=False, default_factory=dict)
    _response: _Response | None = field(init=False, repr=False, default=None)
    _aside: int | None = field(init=False, repr=False, default=None)  # a response let be
    _done: bool = field(init=False, repr=False, default=False)

    def __post_init__(self) -> None:
        check_choice("after", self.after, After)
        check_choice("end", self.end, End)
        check_choice("at", self.at, At)
        check_choice("toward", self.toward, Toward)
        if self.count < 0:
            raise ValueError(f"count must be >= 0, got {self.count!r}")
        check_positive("time", self.time, allow_zero=True)

    # -- items ---------------------------------------------------------------------

    def reads_sse(self) -> bool:
        return True

    def changes(self) -> frozenset[Direction]:
        return frozenset(
            {Direction.DOWNSTREAM}
        )  # the response stops short (and may get its last chunk)

    def on_item(self, item: Item, now: float) -> list[Item]:
        if self._done:
            return self._after_cut(item)
        pieces = self.observe(item, now)
        if item.direction is Direction.UPSTREAM:
            for piece in pieces:
                if piece.kind is PieceKind.HEAD:
                    self._starts[piece.message] = now
            return [item]
        if isinstance(item, Chunk):
            self._pending += item.data
        for entry in self._flow.framed:
            self._piece(entry.piece, entry.lines, now)
        out = self._advance(now)
        if not isinstance(item, Chunk) and not self._done:
            # The upstream ended first: what is held goes out, then its end.
            out += self._forward(self._forwarded + len(self._pending))
            self._response = None
            out.append(item)
        return merged(out)

    def _after_cut(self, item: Item) -> list[Item]:
        """Once cut: which later items still travel (see the module docstring)."""
        if item.direction is Direction.UPSTREAM:
            if self.end == "hang" and (not isinstance(item, Chunk) or self.toward == "client"):
                return [item]
            return []
        if self.toward == "server" and not isinstance(item, Chunk):
            return [item]
        return []

    # -- watching the response -----------------------------------------------------

    def _piece(self, piece: Piece, lines: tuple[SsePiece, ...], now: float) -> None:
        response = self._response
        if piece.message == self._aside and piece.end_of_message:
            self._aside = None
        if piece.kind is PieceKind.HEAD and piece.head is not None and not piece.head.is_interim:
            self._response = None
            start = self._starts.pop(piece.message, now)
            if piece.end_of_message or self.selected(piece.message) is None:
                return
            response = self._response = _Response(
                piece.message,
                start,
                response_dialect(self._flow.position.up, piece.message),
                head_end=piece.offset + len(piece.data),
                chunked=piece.head.is_chunked,
            )
            if self.after == "bytes" or (self.after in _COUNTED and not self.count):
                self._arm(response, self.count if self.after == "bytes" else 0)
            return
        if response is None or response.message != piece.message:
            return
        if piece.kind is PieceKind.CHUNK_HEADER:
            size = int(piece.data.split(b";", 1)[0].strip(), 16)
            end = piece.offset + len(piece.data)
            response.chunk = _ChunkSpan(piece.offset, end, response.body, size)
            response.chunks.append(response.chunk)
        elif piece.kind is PieceKind.CHUNK_TRAILER_CRLF:
            response.trailer = (response.body, piece.offset + len(piece.data))
            if response.cut_body is not None and response.cut_wire is None:
                response.cut_wire = response.trailer[1]  # after the whole chunk
                response.after_chunk = True
        elif piece.kind is PieceKind.BODY and piece.data:
            response.segments.append((response.body, piece.offset, len(piece.data)))
            response.body += len(piece.data)
            if lines:  # framed once for the path (middlebox.core.framed)
                last = lines[-1]
                response.line_end = last.offset + len(last.data)
                response.in_block = last.kind is not SseKind.BLANK
            for line in lines:
                if line.kind is SseKind.OVERFLOW and response.cut_body is None:
                    self._step_aside(response, line, piece.end_of_message, now)
                    return
                self._line(response, line)
        if piece.end_of_message and response.cut_body is None:
            self._response = None  # complete before the cut point: left alone

    def _line(self, response: _Response, line: SsePiece) -> None:
        if response.cut_body is not None:
            return
        end = line.offset + len(line.data)
        if line.kind is SseKind.BLANK:
            if line.event is not None:
                response.events += 1
                meaning = read(line.event, response.dialect)
                response.tokens += meaning.token is not None
                response.tool_fragments += meaning.tool_fragments
                response.reasoning_tokens += meaning.token is TokenKind.REASONING
                response.finishes += meaning.end is not None
                if response.threshold is None and self._reached(response):
                    self._arm(response, end, boundary=True)
                    return
            if self.at == "event_boundary" and self._armed_before(response, end):
                self._place(response, end)
            return
        if self.at == "event_boundary" or line.kind is not SseKind.FIELD or line.field != "data":
            return
        threshold = response.threshold
        if threshold is None:
            return
        if self.at == "inside_data_line":
            inside = range(line.offset + 1, line.offset + line.value_end)
            candidates = [p for p in inside if p >= threshold]
        else:
            value = line.data[: line.value_end]
            candidates = [
                line.offset + i
                for i in utf8_cut_offsets(value)
                if i > line.value_start and line.offset + i >= threshold
            ]
        if candidates:
            chosen = threshold if threshold in candidates else self.rng.choice(candidates)
            self._place(response, chosen)

    def _step_aside(self, response: _Response, line: SsePiece, ended: bool, now: float) -> None:
        """The response's SSE framing stopped at a line or event over its bound: nothing
        past it can be counted or cut at a line, so the response passes untouched."""
        self._response = None
        if not ended:
            self._aside = response.message  # no timer of a later request cuts into it
        limits = self._flow.position.down.sse_limits
        self.report(
            now,
            "stepped_aside",
            response=response.message,
            reason=f"sse {line.field} over its bound",
            limit=limits.line if line.field == "line" else limits.event,
            body_offset=line.offset,
            events=response.events,
            tokens=response.tokens,
        )

    def _reached(self, response: _Response) -> bool:
        if self.after == "events":
            return response.events >= self.count
        if self.after == "tokens":
            return response.tokens >= self.count
        if self.after == "tool_fragments":
            return response.tool_fragments >= self.count
        if self.after == "reasoning_tokens":
            return response.reasoning_tokens >= self.count
        if self.after == "finish":
            return response.finishes >= self.count
        return False

    @staticmethod
    def _armed_before(response: _Response, position: int) -> bool:
        return response.threshold is not None and position >= response.threshold

    def _arm(self, response: _Response, threshold: int, *, boundary: bool = False) -> None:
        """The cut point is known; place the cut there if the point itself qualifies
        (`boundary`: it is the end of a blank line)."""
        response.threshold = threshold
        if self.at != "event_boundary":
            return
        at_end = (
            response.body == threshold
            and not response.in_block
            and response.line_end == response.body
        )
        if boundary or (at_end and threshold == response.body):
            self._place(response, threshold)

    def _place(self, response: _Response, body: int) -> None:
        response.cut_body = body
        response.cut_event = response.events
        response.cut_tokens = response.tokens
        response.cut_chunk = response.chunk_holding(body)
        chunk = response.cut_chunk
        chunk_end = chunk is not None and body == chunk.data_body + chunk.size and body > 0
        if self.at == "event_boundary" and response.chunked and chunk_end:
            # The cut falls after the whole chunk, its CRLF included (maybe still to come).
            if response.trailer[0] == body:
                response.cut_wire = response.trailer[1]
                response.after_chunk = True
            return
        response.cut_wire = response.wire_after(body)

    # -- time ----------------------------------------------------------------------

    def deadline(self) -> float | None:
        if self._done or self.after != "time" or self._aside is not None:
            return None
        response = self._response
        if response is not None:
            return None if response.threshold is not None else response.start + self.time
        selected = [m for m in self._starts if self.selected(m) is not None]
        return self._starts[min(selected)] + self.time if selected else None

    def on_deadline(self, now: float) -> list[Item]:
        response = self._response
        if response is None:
            # No response head yet: the cut falls before it, where the bytes stand.
            return merged(self._fire(None, self._forwarded + len(self._pending), now))
        self._arm(response, response.body)
        return merged(self._advance(now))

    # -- forwarding and the cut ----------------------------------------------------

    def _forward(self, upto: int) -> list[Item]:
        size = upto - self._forwarded
        if size <= 0:
            return []
        data = bytes(self._pending[:size])
        del self._pending[:size]
        self._forwarded += size
        return [Chunk(DOWN, data)]

    def _advance(self, now: float) -> list[Item]:
        response = self._response
        end_of_input = self._forwarded + len(self._pending)
        if response is None or response.threshold is None:
            return self._forward(end_of_input)
        if response.cut_wire is not None:
            return self._fire(response, response.cut_wire, now)
        limit = end_of_input
        threshold = response.threshold
        if threshold <= response.body:
            limit = min(limit, response.wire_after(threshold))
        chunk = response.chunk
        if chunk is not None and chunk.data_body < threshold < chunk.data_body + chunk.size:
            # The cut will fall in this chunk: keep its size line back, so `fin` can
            # re-frame it.
            limit = min(limit, chunk.header_wire)
        return self._forward(max(limit, self._forwarded))

    def _fire(self, response: _Response | None, wire: int, now: float) -> list[Item]:
        self._done = True
        wire = max(wire, self._forwarded)
        end: str = self.end
        tail: list[Item] = []
        if self.toward != "server" and self.end == "fin" and response and response.chunked:
            tail, wire, end = self._complete_message(response, wire)
        out = self._forward(wire)
        self._pending.clear()  # bytes after the cut never reach the client
        if self.toward != "server":
            if end == "rst":
                out.append(Reset(DOWN))
            elif end != "hang":
                out += [*tail, Eof(DOWN)]
        if self.toward != "client" and self.end != "hang":
            out.append(Reset(UP) if self.end == "rst" else Eof(UP))
        self.report(
            now,
            "cut",
            response=None if response is None else response.message,
            byte=wire,
            body_byte=None if response is None else response.cut_body,
            event=0 if response is None else response.cut_event,
            tokens=0 if response is None else response.cut_tokens,
            end=end,
            at=self.at,
            toward=self.toward,
        )
        return out

    def _complete_message(self, response: _Response, wire: int) -> tuple[list[Item], int, str]:
        """For `fin` on a chunked body: the items that complete the HTTP message, the
        wire offset to forward up to, and the end actually sent."""
        chunk = response.cut_chunk
        if response.after_chunk or chunk is None:
            return [Chunk(DOWN, LAST_CHUNK_BYTES)], wire, "fin"
        if chunk.header_wire >= self._forwarded:
            # Re-frame the cut chunk to the bytes kept: the message stays valid.
            kept = bytes(self._pending[chunk.data_wire - self._forwarded : wire - self._forwarded])
            framed = encode_chunk(kept) if kept else b""
            return [Chunk(DOWN, framed + LAST_CHUNK_BYTES)], chunk.header_wire, "fin"
        return [], wire, "truncated_chunked"
