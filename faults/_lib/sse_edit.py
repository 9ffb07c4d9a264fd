"""Editing a response's event stream in place, keeping the chunked framing honest (pure).

`SseRewriter` is the mixin for faults that do it (inband_error, sse_ids).

`SseBodyEditor` takes the http1 pieces of one response body, de-chunks them into an
`SseFramer` and hands the caller each completed SSE line; the caller may `replace` a
line or `insert` bytes at a body offset, then `release()` gives the bytes to send.

Framing: a chunk's size line promises its length (RFC 9112 §7.1), so a chunk can only
go out once it is known whether an edit touches it. Each chunk is held until its data
and CRLF have arrived and every SSE line overlapping it is complete (a line split across chunks
holds the first chunk until the line ends); then it goes out verbatim (size line,
extensions and all) when no edit touches it, or re-encoded when one does. Every
insertion becomes a chunk of its own (a chunk it falls inside is split there), so an
injected frame is one chunk as vLLM writes one (`yield` = one chunk, reference §1.1). A body without
chunked framing that runs until close is edited in the same way without framing; a
Content-Length body is not `editable` (its length is already on the wire) and passes
untouched. `end(cut)` cuts the body short at a line boundary: what was held up to there
goes out (a partial chunk re-encoded), then the insertions there, then the
last chunk if asked.

A line or event over the framing's bound (`middlebox.core.sse.SseLimits`), or a chunk
held longer than twice the event bound (its peer may declare any size), ends the editing
of that body (`step_aside`): what is held goes out with the edits made so far
(a chunk an edit touched re-encoded, the rest of that chunk's data as chunks of its own),
and every byte after passes as it comes, so the editor holds O(bound) bytes.
`SseRewriter` reports it (`stepped_aside`: the journal and /metrics count it).
"""

from __future__ import annotations

import re
from collections import deque
from dataclasses import dataclass, field
from typing import cast

from faults._lib.items import joined_chunk
from faults._lib.match import HttpMatched
from middlebox.core.fault import Fault
from middlebox.core.framed import Framed
from middlebox.core.http1 import LAST_CHUNK_BYTES, Head, Piece, PieceKind, encode_chunk
from middlebox.core.sse import SseFramer, SseKind, SseLimits, SsePiece
from middlebox.core.stream import Chunk, Direction, Eof, Item

__all__ = ["SseBodyEditor", "SseRewriter"]

_SIZE = re.compile(rb"[0-9A-Fa-f]+")


@dataclass
class _Chunk:
    header: bytes
    start: int  # body offset of its first data byte
    size: int
    data: bytearray = field(default_factory=bytearray)
    crlf: bytes | None = None

    @property
    def end(self) -> int:
        return self.start + self.size


@dataclass(frozen=True)
class _Edit:
    start: int
    end: int
    data: bytes


class SseBodyEditor:
    """Edits one response body (see the module docstring). Feed it the pieces after the
    HEAD; it ignores everything once the message ends or `end()` was called."""

    def __init__(self, head: Head) -> None:
        if head.is_chunked:
            self.framing = "chunked"
        elif head.header_values("transfer-encoding") or head.content_length is None:
            self.framing = "close"
        else:
            self.framing = "length"
        self._sse: SseFramer | None = None  # only when fed bare pieces (no shared framing)
        self._complete = 0  # body offset up to which every line is complete
        self._chunks: deque[_Chunk] = deque()
        self._current: _Chunk | None = None
        self._unframed = bytearray()  # a read-until-close body's data not yet sent
        self._edits: list[_Edit] = []
        self._received = 0
        self._sent = 0  # body offset up to which data has gone out
        self._out = bytearray()
        self._tail: bytes | None = None  # the last chunk and trailers, once they arrive
        self._raw = self.framing == "length"  # pass everything as it came
        self._rechunk = False  # stepped aside inside a re-encoded chunk: its rest re-framed
        self.ended = False

    @property
    def editable(self) -> bool:
        return not self._raw and not self.ended

    @property
    def held(self) -> int:
        """Body bytes held back (chunks waiting for their end or for a line to complete)."""
        return sum(len(chunk.data) for chunk in self._chunks) + len(self._unframed)

    @property
    def complete_to(self) -> int:
        """Body offset up to which every line is complete (edits may only start there)."""
        return self._complete

    def feed(self, piece: Piece | Framed) -> list[SsePiece]:
        """Take one piece of the body; return the SSE lines it completes. A `Framed`
        piece brings its lines (framed once for the path); a bare `Piece` is framed
        here."""
        if self.ended:
            return []
        framed = piece if isinstance(piece, Framed) else None
        if isinstance(piece, Framed):
            piece = piece.piece
        kind = piece.kind
        if self._raw:
            if not self._rechunk:
                self._out += piece.data
            elif kind is PieceKind.BODY:
                self._out += encode_chunk(piece.data) if piece.data else b""
            else:
                self._rechunk = False  # the chunk's own CRLF: its data went out re-framed
                if kind is not PieceKind.CHUNK_TRAILER_CRLF:
                    self._out += piece.data
            return []
        if kind is PieceKind.OPAQUE:
            # The framing broke: what is held goes out as it came, and so does the rest.
            for chunk in self._chunks:
                self._out += chunk.header + chunk.data + (chunk.crlf or b"")
            self._chunks.clear()
            self._out += self._unframed + piece.data
            self._raw = True
            return []
        lines: list[SsePiece] = []
        if kind is PieceKind.CHUNK_HEADER:
            match = _SIZE.match(piece.data)
            size = int(match.group(), 16) if match else 0
            self._current = _Chunk(piece.data, self._received, size)
            self._chunks.append(self._current)
        elif kind is PieceKind.BODY:
            if self._current is not None:
                self._current.data += piece.data
            else:
                self._unframed += piece.data
            self._received += len(piece.data)
            if framed is not None:
                lines = list(framed.lines)
            else:
                lines = self._own_sse().feed(piece.data)
                if piece.end_of_message:  # the close that ends a read-until-close body
                    lines += self._own_sse().feed_eof()
        elif kind is PieceKind.CHUNK_TRAILER_CRLF and self._current is not None:
            self._current.crlf = piece.data
        elif kind is PieceKind.LAST_CHUNK:
            lines = list(framed.lines) if framed is not None else self._own_sse().feed_eof()
            self._tail = piece.data
        elif self._tail is not None:  # TRAILERS
            self._tail += piece.data
        if lines:
            last = lines[-1]
            self._complete = max(self._complete, last.offset + len(last.data))
        return lines

    def step_aside(self) -> None:
        """Stop editing this body (a line or event passed the framing's bound): what is
        held goes out now, with the edits already made, and the rest as it comes."""
        if self._raw or self.ended:
            return
        self._release(self._received)  # whole chunks, edited or verbatim
        for chunk in self._chunks:  # the chunk whose data is still arriving
            if self._touched(chunk):
                self._send_rewritten(chunk, self._received)
                self._rechunk = True
            else:
                self._out += chunk.header + chunk.data
                self._sent = self._received
        self._chunks.clear()
        self._release_insertions(self._sent)
        self._raw = True

    def _own_sse(self) -> SseFramer:
        if self._sse is None:
            self._sse = SseFramer(SseLimits())
        return self._sse

    def replace(self, line: SsePiece, data: bytes) -> None:
        """Replace a completed line (terminator included) with `data` (b"" drops it)."""
        self._add(_Edit(line.offset, line.offset + len(line.data), data))

    def insert(self, offset: int, data: bytes) -> None:
        """Insert `data` at body offset `offset`; insertions at one offset keep their
        order and, at a chunk boundary, each becomes a chunk of its own."""
        if data:
            self._add(_Edit(offset, offset, data))

    def _add(self, edit: _Edit) -> None:
        if not self.editable:
            raise RuntimeError("this body cannot be edited (Content-Length, broken or ended)")
        if edit.start < self._sent or edit.start > self.complete_to:
            raise ValueError(f"edit at {edit.start} outside [{self._sent}, {self.complete_to}]")
        self._edits.append(edit)
        self._edits.sort(key=lambda e: e.start)  # stable: insertions keep their order

    def release(self) -> bytes:
        """The bytes that may go out now."""
        if not self._raw:
            if self._tail is not None:
                # The last chunk: every line is final, so everything held goes out.
                self._release(self._received)
                self._out += self._tail
                self._tail = b""
            else:
                self._release(self.complete_to)
        return self._take()

    def end(self, cut: int, last_chunk: bool) -> bytes:
        """Cut the body at body offset `cut` (a line boundary at most `complete_to`):
        release what is held up to there, the insertions there, and the last chunk
        `0\\r\\n\\r\\n` when `last_chunk` (chunked only). Nothing after is sent."""
        if not self._sent <= cut <= self.complete_to:
            raise ValueError(f"cut at {cut} outside [{self._sent}, {self.complete_to}]")
        if not self._raw:
            self._release(cut)
            for chunk in self._chunks:
                if chunk.start < cut:
                    self._send_rewritten(chunk, cut)
            self._chunks.clear()
            if self.framing == "close":
                held = bytes(self._unframed[: cut - self._sent])
                self._out += b"".join(self._apply(held, self._sent, cut))
                self._sent = cut
            self._release_insertions(cut)
            if last_chunk and self.framing == "chunked":
                self._out += LAST_CHUNK_BYTES
        self.ended = True
        return self._take()

    # -- machinery -----------------------------------------------------------------

    def _take(self) -> bytes:
        out = bytes(self._out)
        self._out.clear()
        return out

    def _release(self, limit: int) -> None:
        if self.framing == "close":
            self._release_insertions(self._sent)
            if limit > self._sent:
                held = bytes(self._unframed[: limit - self._sent])
                del self._unframed[: limit - self._sent]
                self._out += b"".join(self._apply(held, self._sent, limit))
                self._sent = limit
            self._release_insertions(self._sent)
            return
        while self._chunks:
            self._release_insertions(self._sent)
            chunk = self._chunks[0]
            if chunk.crlf is None or chunk.end > limit:
                break  # its data or CRLF still to come, or a line running past it
            self._chunks.popleft()
            if self._touched(chunk):
                self._send_rewritten(chunk, chunk.end)
            else:
                self._out += chunk.header + chunk.data + (chunk.crlf or b"")
                self._sent = chunk.end
        self._release_insertions(self._sent)

    def _touched(self, chunk: _Chunk) -> bool:
        """Whether an edit changes or falls inside `chunk`'s data."""
        return any(
            e.start < chunk.end and (e.end > chunk.start or e.start > chunk.start)
            for e in self._edits
        )

    def _release_insertions(self, offset: int) -> None:
        while self._edits and self._edits[0].start == self._edits[0].end == offset:
            self._out += self._frame(self._edits.pop(0).data)

    def _frame(self, data: bytes) -> bytes:
        return encode_chunk(data) if self.framing == "chunked" and data else data

    def _send_rewritten(self, chunk: _Chunk, stop: int) -> None:
        """Send `chunk`'s data up to body offset `stop` with the edits applied, as new
        chunks (the original size line and CRLF are dropped): one for the data, split
        where an insertion falls, which gets a chunk of its own."""
        for segment in self._apply(bytes(chunk.data[: stop - chunk.start]), chunk.start, stop):
            self._out += self._frame(segment)
        self._sent = stop

    def _apply(self, data: bytes, start: int, stop: int) -> list[bytes]:
        """`data` (body offsets [start, stop)) with the edits starting before `stop`
        applied, cut into segments at insertions (each insertion one segment); the part
        of an edit running past `stop` stays for the next span."""
        segments: list[bytes] = []
        run = bytearray()
        position = start
        kept: list[_Edit] = []
        for edit in self._edits:
            if edit.start >= stop:
                kept.append(edit)
                continue
            if edit.start > position:
                run += data[position - start : edit.start - start]
                position = edit.start
            if edit.start == edit.end:
                segments += [bytes(run), edit.data]
                run = bytearray()
            else:
                run += edit.data
            position = max(position, min(edit.end, stop))
            if edit.end > stop:
                kept.append(_Edit(stop, edit.end, b""))
        run += data[position - start :]
        self._edits = kept
        return [segment for segment in [*segments, bytes(run)] if segment]


@dataclass
class SseRewriter(HttpMatched):
    """Mixin for faults that edit the event stream of matched 2xx responses:
    `class X(SseRewriter, Fault)` implements `edit(editor, line, now)` (called with each
    completed SSE line; it may `replace`/`insert` through the editor, or `cut`), and
    may override `begin(editor, now)` and `finish(now)`. Requests pass untouched, as do
    responses that are not matched; a matched response that is not `text/event-stream`
    or has a Content-Length is reported as skipped.
    `self.request_index` is the matched request's cross-connection index.
    """

    request_index: int = field(init=False, repr=False, compare=False, default=0)
    _editor: SseBodyEditor | None = field(init=False, repr=False, compare=False, default=None)
    _editing: int = field(init=False, repr=False, compare=False, default=-1)
    _dropping: int = field(init=False, repr=False, compare=False, default=-1)
    _closed: bool = field(init=False, repr=False, compare=False, default=False)
    _parts: list[bytes] = field(init=False, repr=False, compare=False, default_factory=list)

    @property
    def response_index(self) -> int:
        """The edited response's index on its connection (-1 when none is edited)."""
        return self._editing

    def begin(self, editor: SseBodyEditor, now: float) -> None:
        """A matched response's body is about to start (`editor.complete_to` is 0)."""

    def edit(self, editor: SseBodyEditor, line: SsePiece, now: float) -> None:
        raise NotImplementedError

    def finish(self, now: float) -> None:
        """The edited response ended."""

    def cut(self, editor: SseBodyEditor, offset: int, last_chunk: bool, close: bool) -> None:
        """End the edited body at `offset` (see `SseBodyEditor.end`). The rest of the
        server's response is dropped; with `close` (or a body that only a close can
        end) the connection is closed both ways and everything after is dropped."""
        self._parts.append(editor.end(offset, last_chunk=last_chunk))
        if close or editor.framing == "close":
            self._closed = True
        else:
            self._dropping = self._editing
        self._editor, self._editing = None, -1

    def reads_sse(self) -> bool:
        return True

    def changes(self) -> frozenset[Direction]:
        return frozenset({Direction.DOWNSTREAM})  # edited event streams are re-chunked

    def on_item(self, item: Item, now: float) -> list[Item]:
        if self._closed:
            return []  # this connection was closed both ways
        self.observe(item, now)
        if item.direction is Direction.UPSTREAM:
            return [item]
        self._parts = []
        for entry in self._flow.framed:
            self._piece(entry, now)
            if self._closed:
                down, up = Direction.DOWNSTREAM, Direction.UPSTREAM
                return [*joined_chunk(down, self._parts), Eof(down), Eof(up)]
        out = joined_chunk(Direction.DOWNSTREAM, self._parts)
        return out if isinstance(item, Chunk) else [*out, item]

    def _piece(self, entry: Framed, now: float) -> None:
        piece = entry.piece
        message = piece.message
        if message == self._dropping:
            if piece.end_of_message:
                self._dropping = -1
            return
        head = piece.head
        if head is not None and not head.is_interim:
            self._parts.append(piece.data)
            index = self.selected(message)
            status = head.status or 0
            if index is not None and not piece.end_of_message and 200 <= status < 300:
                self._begin(head, message, index, now)
            return
        editor = self._editor
        if editor is None or message != self._editing:
            self._parts.append(piece.data)
            return
        for line in editor.feed(entry):
            if line.kind is SseKind.OVERFLOW:
                self._step_aside(editor, line.field or "", line.offset, now)
                break
            self.edit(editor, line, now)
            if self._editor is not editor:
                return  # cut
        self._parts.append(editor.release())
        bound = self._flow.position.down.sse_limits.event
        if editor.editable and bound is not None and editor.held > 2 * bound:
            # A chunk goes out only whole (its size line promises its length): one longer
            # than twice an event's bound (one event at the bound and its neighbours) is
            # not held whole, however long its peer declares it.
            self._step_aside(editor, "chunk", editor.complete_to, now)
            self._parts.append(editor.release())
        if piece.end_of_message:
            self._editor, self._editing = None, -1
            self.finish(now)

    def _step_aside(self, editor: SseBodyEditor, bound: str, offset: int, now: float) -> None:
        """A line, an event or a held chunk of the edited body passed its bound (`line`:
        `sse_max_line`, else `sse_max_event`) at body offset `offset`: no more edits to
        it (the bytes pass as they come); said in the journal and /metrics."""
        editor.step_aside()
        limits = self._flow.position.down.sse_limits
        cast(Fault, self).report(
            now,
            "stepped_aside",
            request=self.request_index,
            message=self._editing,
            reason=f"sse {bound} over its bound",
            limit=limits.line if bound == "line" else limits.event,  # a chunk: twice it
            body_offset=offset,
        )

    def _begin(self, head: Head, message: int, index: int, now: float) -> None:
        editor = SseBodyEditor(head)
        media = (head.header("content-type") or "").split(";")[0].strip().lower()
        # Only event streams are edited: a JSON body has no line ends, so holding it until
        # its lines complete would buffer the whole response.
        reason = None
        if media != "text/event-stream":
            reason = "not text/event-stream"
        elif not editor.editable:
            reason = "content-length"
        if reason is not None:
            cast(Fault, self).report(now, "skipped", request=index, message=message, reason=reason)
            return
        self._editor, self._editing, self.request_index = editor, message, index
        self.begin(editor, now)
        if self._editor is editor:
            self._parts.append(editor.release())
