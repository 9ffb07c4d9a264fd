"""Passive, byte-preserving Server-Sent Events framer (pure).

Feed it a de-chunked `text/event-stream` body in arbitrary pieces; it returns one
`SsePiece` per line (terminator included), following the WHATWG HTML "Interpreting an
event stream" rules: lines end in CRLF, LF or CR (a CR at the end of a feed is held
until the next byte says whether an LF follows); one leading U+FEFF is skipped; a line
starting with ":" is a comment; `field: value` drops one space after the colon; `data`
lines accumulate with LF between them; an empty line dispatches the event, unless no
data line came (then nothing is dispatched); `id` containing NUL is ignored; `retry`
takes ASCII digits only; an incomplete event at EOF is discarded.

The concatenation of all pieces' `data` is exactly the input, and since pieces are
whole lines they are the same however the input was split. The BLANK piece that
dispatches an event carries the parsed `SseEvent` (with the raw bytes of its block).
FIELD and COMMENT pieces give the byte span of their value, and `utf8_cut_offsets`
the positions inside UTF-8 sequences, so a fault can cut "inside a data: payload" or
"inside a multi-byte character" at an exact byte.

vLLM sends only `data: <json>\\n\\n` frames and `data: [DONE]\\n\\n` (`is_done`);
keep-alive comments (`: ping`) form blocks with no data, which dispatch nothing.

Bounds (`SseLimits`): the spec sets no limit on a line or an event, so a peer that never
ends one would make a parser hold everything it sends. With limits, a line longer than
`line` bytes (its line ending not counted) or an event whose lines total more than
`event` bytes (line endings counted, the blank line not) ends the parsing of that body:
what is held, and every byte after, comes out as OVERFLOW pieces, unparsed, so the
framer holds O(limit) bytes whatever the peer sends and the bytes still all come out.
No event is dispatched from the block that overflowed.
"""

from __future__ import annotations

import enum
import re
from dataclasses import dataclass

BOM = b"\xef\xbb\xbf"
DONE = "[DONE]"
"""The OpenAI/vLLM end-of-stream sentinel: `data: [DONE]`."""

_EOL = re.compile(rb"[\r\n]")
_CR = 0x0D
_LF = 0x0A
_COLON = 0x3A

MAX_LINE = 1024 * 1024
"""The default bound on an SSE line (1 MiB). A vLLM chunk is a few hundred bytes; the
largest honest lines are tool-call deltas or whole answers in one event, tens of KB;
1 MiB leaves a wide margin and keeps what one stream can make the proxy hold small."""

MAX_EVENT = 1024 * 1024
"""The default bound on an SSE event's lines (1 MiB), for the same reasons: vLLM sends
one `data:` line per event."""


@dataclass(frozen=True, slots=True)
class SseLimits:
    """How much of one line and of one event a framer holds before it stops parsing
    the body (see the module docstring); None is no bound."""

    line: int | None = MAX_LINE
    event: int | None = MAX_EVENT


UNBOUNDED = SseLimits(None, None)


class SseKind(enum.Enum):
    """What a line of an event stream is."""

    BOM = "bom"  # the leading U+FEFF, skipped by the spec
    COMMENT = "comment"  # ":" ... line end
    FIELD = "field"  # "name: value" or "name" ... line end
    BLANK = "blank"  # empty line: ends the block (and may dispatch an event)
    PARTIAL = "partial"  # an unterminated last line at EOF (discarded by the spec)
    OVERFLOW = "overflow"  # bytes from a line or event over its bound on: not parsed


@dataclass(frozen=True, slots=True)
class SseEvent:
    """A dispatched event. `id`/`retry` are what this block set (None if nothing);
    `last_event_id` is the spec's sticky value; `index` counts dispatched events
    from 0; `raw` is the block's bytes from its first line to the blank line."""

    data: str
    event: str
    id: str | None
    retry: int | None
    comments: tuple[str, ...]
    index: int
    last_event_id: str
    raw: bytes

    @property
    def is_done(self) -> bool:
        return self.data == DONE


@dataclass(frozen=True, slots=True)
class SsePiece:
    """One line. `offset` is the position of `data[0]` in the stream. For FIELD and
    COMMENT lines, `data[value_start:value_end]` is the value (after the colon and its
    optional space) or the comment text; `value_end` is where the line terminator
    starts. `field` names a FIELD line's field, and for OVERFLOW the bound that was
    passed (`line` or `event`; when both were, the one the bytes showed first). `event`
    is set on the BLANK line that dispatches an event."""

    kind: SseKind
    data: bytes
    offset: int
    field: str | None = None
    value_start: int = 0
    value_end: int = 0
    event: SseEvent | None = None


def utf8_cut_offsets(data: bytes) -> list[int]:
    """Offsets i (0 < i < len) where cutting `data[:i] | data[i:]` splits a multi-byte
    UTF-8 sequence: the positions of continuation bytes."""
    return [i for i, b in enumerate(data) if 0x80 <= b <= 0xBF and i > 0]


def utf8_incomplete_tail(data: bytes) -> int:
    """How many trailing bytes of `data` are an unfinished UTF-8 sequence (0 to 3)."""
    for back in range(1, min(4, len(data)) + 1):
        b = data[-back]
        if b < 0x80:
            return 0
        if b >= 0xC0:
            need = 2 if b < 0xE0 else 3 if b < 0xF0 else 4
            return back if back < need else 0
    return 0


class SseFramer:
    """Splits an event-stream body into line pieces and parses events on the way;
    `limits` bound what it holds (none by default: a client reads its whole stream)."""

    def __init__(self, limits: SseLimits = UNBOUNDED) -> None:
        self._max_line = limits.line
        self._max_event = limits.event
        self._over: str | None = None  # the bound passed: the rest is OVERFLOW
        self._buf = bytearray()
        self._scan = 0  # where the next line-end search starts: each byte is scanned once
        self._bom_pending = True
        self._offset = 0
        self._received = 0
        self._eof = False
        self._truncated = False
        self._events = 0
        self._done = False
        self._last_id = ""
        self._id_buffer = ""
        self._stream_retry: int | None = None
        # the block (lines since the last blank line)
        self._block = bytearray()
        self._lines = 0
        self._data: list[str] = []
        self._type = ""
        self._id: str | None = None
        self._retry: int | None = None
        self._comments: list[str] = []

    @property
    def events(self) -> int:
        """Events dispatched so far."""
        return self._events

    @property
    def last_event_id(self) -> str:
        """The spec's last event ID: the latest valid `id` field, kept across events."""
        return self._last_id

    @property
    def retry(self) -> int | None:
        """The reconnection time (ms) last set by a valid `retry` field."""
        return self._stream_retry

    @property
    def offset(self) -> int:
        """Bytes passed out in pieces so far."""
        return self._offset

    @property
    def received(self) -> int:
        """Bytes fed so far (`offset` + `buffered`)."""
        return self._received

    @property
    def buffered(self) -> int:
        """Bytes of an unfinished line (or possible BOM) held back."""
        return len(self._buf)

    @property
    def in_event(self) -> bool:
        """Lines of a block have arrived but not the blank line that ends it."""
        return self._lines > 0

    @property
    def mid_line(self) -> bool:
        """The bytes fed so far end inside a line."""
        return bool(self._buf)

    @property
    def mid_utf8(self) -> bool:
        """The bytes fed so far end inside a multi-byte UTF-8 sequence."""
        return utf8_incomplete_tail(bytes(self._buf[-4:])) > 0

    @property
    def done(self) -> bool:
        """A `data: [DONE]` event was dispatched."""
        return self._done

    @property
    def overflowed(self) -> str | None:
        """The bound a line or event passed (`line`, `event`), after which nothing of
        this body is parsed; None while within the bounds."""
        return self._over

    @property
    def truncated(self) -> bool:
        """EOF came inside a block or a line: the spec discards that event."""
        return self._truncated

    def feed(self, data: bytes) -> list[SsePiece]:
        if self._eof:
            raise RuntimeError("feed() after feed_eof()")
        self._received += len(data)
        if self._over is not None:
            if not data:
                return []
            piece = SsePiece(SseKind.OVERFLOW, bytes(data), self._offset, self._over)
            self._offset += len(data)
            return [piece]
        self._buf += data
        out: list[SsePiece] = []
        if self._bom_pending:
            if len(self._buf) < len(BOM) and BOM.startswith(self._buf):
                return out
            self._bom_pending = False
            if self._buf.startswith(BOM):
                self._emit_raw(out, SseKind.BOM, len(BOM))
        buf = self._buf
        while True:
            match = _EOL.search(buf, self._scan)
            if match is None:
                self._scan = len(buf)
                self._bound(out, len(buf), len(buf))
                return out
            i = match.start()
            if buf[i] == _CR:
                if i + 1 == len(buf):
                    self._scan = i  # CR LF may be split across feeds
                    self._bound(out, i, i)
                    return out
                end = i + 2 if buf[i + 1] == _LF else i + 1
            else:
                end = i + 1
            if i and self._bound(out, i, end):
                return out
            self._line(out, end, i)

    def _bound(self, out: list[SsePiece], content: int, size: int) -> bool:
        """Whether the line at the start of the buffer (`content` bytes without its line
        ending, `size` with what of it has arrived) passes a bound; if so, everything
        held goes out as OVERFLOW and the rest of the body will too. A line is checked
        when it completes and while it is pending, so the same input gives the same
        pieces however it was split."""
        if self._max_line is not None and content > self._max_line:
            bound = "line"
        elif self._max_event is not None and content and len(self._block) + size > self._max_event:
            bound = "event"
        else:
            return False
        self._over = bound
        if self._buf:
            data = bytes(self._buf)
            self._buf.clear()
            out.append(SsePiece(SseKind.OVERFLOW, data, self._offset, bound))
            self._offset += len(data)
        self._scan = 0
        self._clear_block()
        return True

    def feed_eof(self) -> list[SsePiece]:
        if self._eof:
            return []
        self._eof = True
        out: list[SsePiece] = []
        self._bom_pending = False
        buf = self._buf
        if buf and buf[-1] == _CR:
            self._line(out, len(buf), len(buf) - 1)  # a held CR: EOF says no LF follows
        self._truncated = bool(buf) or self.in_event
        if buf:
            self._emit_raw(out, SseKind.PARTIAL, len(buf), value_end=len(buf))
        return out

    def _emit_raw(self, out: list[SsePiece], kind: SseKind, n: int, *, value_end: int = 0) -> None:
        data = bytes(self._buf[:n])
        del self._buf[:n]
        self._scan = 0
        out.append(SsePiece(kind, data, self._offset, value_end=value_end))
        self._offset += n

    def _line(self, out: list[SsePiece], end: int, content_end: int) -> None:
        line = bytes(self._buf[:end])
        del self._buf[:end]
        self._scan = 0
        offset = self._offset
        self._offset += end
        if content_end == 0:
            out.append(SsePiece(SseKind.BLANK, line, offset, event=self._dispatch(line)))
            return
        self._block += line
        self._lines += 1
        if line[0] == _COLON:
            self._comments.append(line[1:content_end].decode("utf-8", "replace"))
            out.append(SsePiece(SseKind.COMMENT, line, offset, None, 1, content_end))
            return
        colon = line.find(b":", 0, content_end)
        if colon < 0:
            name, start = line[:content_end], content_end
        else:
            name, start = line[:colon], colon + 1
            if line[start : start + 1] == b" ":
                start += 1
        field = name.decode("utf-8", "replace")
        value = line[start:content_end].decode("utf-8", "replace")
        out.append(SsePiece(SseKind.FIELD, line, offset, field, start, content_end))
        if field == "data":
            self._data.append(value)
        elif field == "event":
            self._type = value
        elif field == "id":
            if "\0" not in value:
                # WHATWG 9.2.6: the id goes to the last event ID *buffer*; the event
                # source's last event ID takes it only when the block is dispatched
                # (WPT format-data-before-final-empty-line), so a truncated block's id
                # never becomes the Last-Event-ID a client resumes from.
                self._id = self._id_buffer = value
        elif field == "retry" and value.isascii() and value.isdigit():
            self._retry = self._stream_retry = int(value)

    def _dispatch(self, blank: bytes) -> SseEvent | None:
        # WHATWG 9.2.6 "dispatch the event" step 1: set the last event ID from the buffer,
        # even for a block without data (the buffer is not reset between blocks).
        self._last_id = self._id_buffer
        event = None
        if self._data:
            event = SseEvent(
                data="\n".join(self._data),
                event=self._type or "message",
                id=self._id,
                retry=self._retry,
                comments=tuple(self._comments),
                index=self._events,
                last_event_id=self._last_id,
                raw=bytes(self._block + blank),
            )
            self._events += 1
            self._done = self._done or event.is_done
        self._clear_block()
        return event

    def _clear_block(self) -> None:
        self._block = bytearray()
        self._lines = 0
        self._data = []
        self._type = ""
        self._id = None
        self._retry = None
        self._comments = []
