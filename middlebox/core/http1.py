"""Passive, byte-preserving HTTP/1.1 framer (pure, sans-IO in the style of h11).

Bytes go in, labelled `Piece`s come out, and the concatenation of all pieces' `data`
is exactly the input: the framer never re-serializes, so the no-fault path stays
byte-exact and a fault can cut anywhere (inside a chunk-size line, inside a head) or
send invalid HTTP on purpose.

One `Http1Framer` reads one direction of a connection (`role="request"` for what the
client sends, `"response"` for what the server sends). `Http1Exchange` owns both and
tells the response framer which request method each response answers (HEAD and
CONNECT change the framing, RFC 9112 §6.3).

Pieces of a message, in order:

    HEAD                      start line + fields + blank line (parsed: `Piece.head`)
    BODY*                     content-length or read-until-close payload
    or, for chunked:
    (CHUNK_HEADER BODY+ CHUNK_TRAILER_CRLF)*  LAST_CHUNK  TRAILERS
    OPAQUE*                   after an upgrade/CONNECT tunnel, or after malformed input

Structural pieces (HEAD, CHUNK_HEADER, CHUNK_TRAILER_CRLF, LAST_CHUNK, TRAILERS) are
held back until complete, so they come out identical however the input is split;
BODY and OPAQUE bytes are released as they arrive, so their piece boundaries follow
the feeds. `coalesce()` gives the canonical form in which any split of the same input
yields the same list. Malformed input never raises: the framer says why in
`degraded` and passes everything from the start of the bad structure on as OPAQUE.
"""

from __future__ import annotations

import enum
import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Literal

from middlebox.core.stream import Direction

# Limits past which input is treated as not-HTTP and passed on as OPAQUE. nginx's
# defaults are in this range (large_client_header_buffers 4 x 8k, proxy_buffer_size).
MAX_HEAD_BYTES = 64 * 1024
MAX_CHUNK_LINE_BYTES = 4096
MAX_TRAILER_BYTES = 64 * 1024

LAST_CHUNK_BYTES = b"0\r\n\r\n"
"""The last-chunk line plus the empty trailer section that ends a chunked body."""

_LF = 0x0A
_CR = 0x0D

# RFC 9112 §7.1: chunk-size [chunk-ext] CRLF. Extensions are kept verbatim and only
# checked for line-breaking bytes; a bare LF line end is accepted as RFC 9112 §2.2
# allows. Leading zeros are allowed (an 18-digit zero-padded size is valid); the value
# must fit nginx's off_t (ngx_http_parse_chunked: "invalid chunked body" past it), so
# `ffffffffffffffff` is refused at once instead of waited for.
_CHUNK_LINE = re.compile(rb"([0-9A-Fa-f]+)[ \t]*(?:;[^\r\n]*)?\r?\n\Z")
_BARE_CR = re.compile(rb"\r[^\n]")
BARE_CR_IN_HEAD = "bare CR in the head (a CR not followed by LF)"
_TOKEN = re.compile(r"[!#$%&'*+\-.^_`|~0-9A-Za-z]+\Z")
_VERSION = re.compile(r"HTTP/1\.[0-9]\Z")
# Control bytes (NUL, CTLs but HTAB, DEL) that h11 and llhttp's strict mode refuse in a
# request target, a reason phrase and field values (RFC 9110 §5.5, RFC 9112 §3.2, §4).
_CONTROL = re.compile(r"[\x00-\x08\x0a-\x1f\x7f]")
# A field line as nearly every sender writes it: a token, a colon, a value without control
# bytes, its spaces and tabs around it dropped, the CR of its CRLF. It is what the checks of
# `_parse_fields` accept without a fold; any other line goes through them (and their reasons).
_FIELD_LINE = re.compile(
    r"([!#$%&'*+\-.^_`|~0-9A-Za-z]+):[ \t]*([^\x00-\x08\x0a-\x1f\x7f]*?)[ \t]*\r?"
)
MAX_BODY_SIZE = 2**63 - 1
"""The largest Content-Length or chunk size accepted: nginx's NGX_MAX_OFF_T_VALUE (a
20-digit length is "client sent invalid Content-Length header", 400)."""


class PieceKind(enum.Enum):
    """What a run of bytes is within an HTTP/1.1 message."""

    HEAD = "head"
    BODY = "body"
    CHUNK_HEADER = "chunk_header"
    CHUNK_TRAILER_CRLF = "chunk_trailer_crlf"
    LAST_CHUNK = "last_chunk"
    TRAILERS = "trailers"
    OPAQUE = "opaque"


_HEADER, _BODY, _CRLF = PieceKind.CHUNK_HEADER, PieceKind.BODY, PieceKind.CHUNK_TRAILER_CRLF
_CRLF_BYTES = b"\r\n"  # the CRLF after chunk data: one object, shared by every whole chunk


@dataclass(frozen=True, slots=True)
class Head:
    """A parsed start line and header section; field names and values keep their case
    and order (decoded as latin-1, so they round-trip to the exact bytes)."""

    version: str
    headers: tuple[tuple[str, str], ...] = ()
    method: str | None = None
    target: str | None = None
    status: int | None = None
    reason: str | None = None
    # The fields' values by lower-cased name, built on the first lookup: the framer, the
    # faults and the journal ask a head for several fields each (its framing, Connection,
    # what a rewrite sets), and a dict answers each without a scan of every field.
    _by_name: dict[str, tuple[str, ...]] | None = field(
        default=None, init=False, repr=False, compare=False, hash=False
    )

    @property
    def is_request(self) -> bool:
        return self.method is not None

    @property
    def is_interim(self) -> bool:
        """A 1xx response other than 101: the final response to the same request follows."""
        return self.status is not None and 100 <= self.status < 200 and self.status != 101

    def header_values(self, name: str) -> list[str]:
        """All values of the fields named `name` (case-insensitive), in order."""
        by_name = self._by_name
        if by_name is None:
            by_name = _fields_by_name(self)
        return list(by_name.get(name.lower(), ()))

    def header(self, name: str) -> str | None:
        """The field's values joined with ", " (RFC 9110 §5.3), or None when absent."""
        values = self.header_values(name)
        return ", ".join(values) if values else None

    def tokens(self, name: str) -> list[str]:
        """The comma-separated list elements of a field, lower-cased (Connection, TE...)."""
        return [
            t.strip().lower() for v in self.header_values(name) for t in v.split(",") if t.strip()
        ]

    @property
    def is_chunked(self) -> bool:
        """Transfer-Encoding ends in chunked (RFC 9112 §6.3: only then is it chunked)."""
        codings = self.tokens("transfer-encoding")
        return bool(codings) and codings[-1] == "chunked"

    @property
    def content_length(self) -> int | None:
        """The Content-Length, or None when absent or invalid."""
        try:
            return _content_length(self)
        except _Malformed:
            return None

    @property
    def keep_alive(self) -> bool:
        """Whether the connection persists after this message (RFC 9112 §9.3)."""
        by_name = self._by_name
        if by_name is None:
            by_name = _fields_by_name(self)
        if "connection" not in by_name:
            return self.version != "HTTP/1.0"  # the usual case: no Connection field
        conn = self.tokens("connection")
        if "close" in conn:
            return False
        return self.version != "HTTP/1.0" or "keep-alive" in conn


_SET_HEAD = tuple(
    getattr(Head, name).__set__
    for name in ("version", "headers", "method", "target", "status", "reason", "_by_name")
)
_SET_BY_NAME = _SET_HEAD[-1]


def new_head(
    version: str,
    headers: tuple[tuple[str, str], ...],
    method: str | None = None,
    target: str | None = None,
    status: int | None = None,
    reason: str | None = None,
) -> Head:
    """`Head(version, headers, method, target, status, reason)`, made as `new_piece` makes
    a piece (a frozen dataclass's `__init__` sets each field through `object.__setattr__`;
    the framer makes a head per message and a rewriter another)."""
    head: Head = _new(Head)
    set_version, set_headers, set_method, set_target, set_status, set_reason, set_index = _SET_HEAD
    set_version(head, version)
    set_headers(head, headers)
    set_method(head, method)
    set_target(head, target)
    set_status(head, status)
    set_reason(head, reason)
    set_index(head, None)
    return head


def _fields_by_name(head: Head) -> dict[str, tuple[str, ...]]:
    """The head's index (`Head._by_name`), built now if it is not yet."""
    by_name = head._by_name
    if by_name is None:
        by_name = {}
        for name, value in head.headers:
            key = name.lower()
            seen = by_name.get(key)
            by_name[key] = (value,) if seen is None else (*seen, value)
        _SET_BY_NAME(head, by_name)
    return by_name


@dataclass(frozen=True, slots=True)
class Piece:
    """A labelled run of bytes. `message` is the index of the message in this direction
    (a response's interim 1xx heads share the index of the final response);
    `offset` is the position of `data[0]` in the direction's byte stream; `head` is
    set on HEAD pieces; `end_of_message` on the last piece of a message (at EOF a
    read-until-close body ends with an empty BODY piece that carries it)."""

    kind: PieceKind
    data: bytes
    message: int
    offset: int
    head: Head | None = None
    end_of_message: bool = False


# A frozen dataclass's __init__ sets each field through object.__setattr__ (about 1 us
# for a Piece, and the framer makes three per SSE frame); the slots' own descriptors set
# the same fields in half the time. Used only where pieces are made per body read.
_new = object.__new__
_SET_PIECE = tuple(
    getattr(Piece, name).__set__
    for name in ("kind", "data", "message", "offset", "head", "end_of_message")
)


def new_piece(
    kind: PieceKind,
    data: bytes,
    message: int,
    offset: int,
    head: Head | None = None,
    end_of_message: bool = False,
) -> Piece:
    """`Piece(kind, data, message, offset, head, end_of_message)`, made faster."""
    piece: Piece = _new(Piece)
    set_kind, set_data, set_message, set_offset, set_head, set_end = _SET_PIECE
    set_kind(piece, kind)
    set_data(piece, data)
    set_message(piece, message)
    set_offset(piece, offset)
    set_head(piece, head)
    set_end(piece, end_of_message)
    return piece


def moved_piece(piece: Piece, shift: int) -> Piece:
    """`piece` `shift` bytes further into its stream (a rewrite before it changed size)."""
    return new_piece(
        piece.kind,
        piece.data,
        piece.message,
        piece.offset + shift,
        piece.head,
        piece.end_of_message,
    )


@dataclass(frozen=True, slots=True)
class Refusal:
    """The first message on a stream that an intermediary must not pass on as it is
    (RFC 9112 §6.1, §6.3, §7; nginx 1.22's answers): where it starts (`message`,
    `offset`), where the unframeable bytes start (`at`), why, and the status nginx
    answers it with (`status` None: bytes after `Connection: close`, which nginx reads
    and discards without an answer). `start_line`: the start line itself is not HTTP/1.x
    (nginx takes such a response for HTTP/0.9 and relays it raw, ngx_http_proxy_module's
    "upstream sent no valid HTTP/1.0 header")."""

    message: int
    offset: int
    at: int
    reason: str
    status: int | None = 400
    start_line: bool = False


_MERGEABLE = (PieceKind.BODY, PieceKind.OPAQUE)


def coalesce(pieces: Iterable[Piece]) -> list[Piece]:
    """The canonical form: adjacent BODY (or OPAQUE) pieces of the same message merged.
    Any split of the same input gives the same coalesced list."""
    out: list[Piece] = []
    for p in pieces:
        last = out[-1] if out else None
        if (
            last is not None
            and p.kind in _MERGEABLE
            and last.kind is p.kind
            and last.message == p.message
            and not last.end_of_message
        ):
            out[-1] = Piece(
                p.kind, last.data + p.data, p.message, last.offset, None, p.end_of_message
            )
        else:
            out.append(p)
    return out


class _Malformed(ValueError):
    def __init__(self, reason: str, status: int = 400, *, start_line: bool = False) -> None:
        super().__init__(reason)
        self.status = status
        self.start_line = start_line


class _State(enum.Enum):
    HEAD = "head"
    LENGTH = "length"
    UNTIL_CLOSE = "until_close"
    CHUNK_SIZE = "chunk_size"
    CHUNK_DATA = "chunk_data"
    CHUNK_CRLF = "chunk_crlf"
    TRAILERS = "trailers"
    OPAQUE = "opaque"
    CLOSED = "closed"  # after a Connection: close message: nothing more should come


# Where `skip_body` can take a read: between chunks, or inside a body it cannot end early.
_SKIPPABLE = frozenset({_State.CHUNK_SIZE, _State.LENGTH, _State.UNTIL_CLOSE})

_BODY_STATES = frozenset(
    {
        _State.LENGTH,
        _State.UNTIL_CLOSE,
        _State.CHUNK_SIZE,
        _State.CHUNK_DATA,
        _State.CHUNK_CRLF,
        _State.TRAILERS,
    }
)

Role = Literal["request", "response"]


class Http1Framer:
    """Splits one direction of an HTTP/1.1 connection into `Piece`s.

    `feed(data)` returns the pieces completed by `data`; bytes of an incomplete
    structural piece are held (`buffered`) until it completes. `feed_eof()` ends the
    stream: it completes a read-until-close body, and otherwise passes held bytes on as
    OPAQUE and sets `truncated` when a message was cut short.
    """

    def __init__(self, role: Role) -> None:
        if role not in ("request", "response"):
            raise ValueError(f"role must be 'request' or 'response', not {role!r}")
        self.role: Role = role
        self._buf = bytearray()
        self._scan = 0  # where the next LF search starts in _buf: each byte is scanned once
        self._line = 0  # start of the current line in _buf
        self._start = 0  # start of the start line, after skipped blank lines (RFC 9112 §2.2)
        self._state = _State.HEAD
        self._remaining = 0
        # a list, not a deque: a deque allocates a 64-slot block up front (~0.7 KiB a
        # framer, two framers a connection) for the one or two methods it ever holds
        self._methods: list[str] = []
        self._method: str | None = None
        self._message = 0
        self._interim = False
        self._head: Head | None = None
        self._offset = 0
        self._body_received = 0
        self._tunnel = False
        self._degraded: str | None = None
        self._refusal: Refusal | None = None
        self._message_start = 0  # stream offset where the current message began
        self._closed = False  # the last message had Connection: close (RFC 9112 §9.6)
        self._truncated = False
        self._eof = False

    # -- state ---------------------------------------------------------------------

    @property
    def message(self) -> int:
        """Index of the message in progress (or the next one, between messages)."""
        return self._message

    @property
    def head(self) -> Head | None:
        """The most recently parsed head (interim 1xx heads included)."""
        return self._head

    @property
    def request_method(self) -> str | None:
        """For a response framer: the method of the request the current response answers."""
        return self._method

    @property
    def in_head(self) -> bool:
        """Part of a head (or an interim 1xx before the final head) has arrived."""
        return self._state is _State.HEAD and not self.message_complete

    @property
    def in_body(self) -> bool:
        """The current message's head is done and its body (framing included) is not."""
        return self._state in _BODY_STATES

    @property
    def in_chunks(self) -> bool:
        """Between two chunks of a chunked body (the next byte starts a chunk-size line)."""
        return self._state is _State.CHUNK_SIZE and not self._buf

    @property
    def skips_body(self) -> bool:
        """Whether `skip_body` may take the next bytes: inside a body, nothing held."""
        return self._state in _SKIPPABLE and not self._buf and not self._eof

    @property
    def message_complete(self) -> bool:
        """Between messages: the last one ended and no byte of the next has arrived
        (blank lines between messages, which RFC 9112 §2.2 lets a recipient skip, aside).
        False in a tunnel or after degrading."""
        if self._state is _State.CLOSED:
            return True
        return self._state is _State.HEAD and not self._interim and self._start == len(self._buf)

    @property
    def tunnel(self) -> bool:
        """After a 101 or a CONNECT: the rest of the stream is another protocol (OPAQUE)."""
        return self._tunnel

    @property
    def degraded(self) -> str | None:
        """Why the framer gave up on malformed input (the rest is OPAQUE), or None."""
        return self._degraded

    @property
    def refusal(self) -> Refusal | None:
        """The first message an intermediary must refuse (malformed framing, a CONNECT,
        bytes after `Connection: close`), or None: what fail-closed answers with."""
        return self._refusal

    @property
    def truncated(self) -> bool:
        """EOF arrived in the middle of a message."""
        return self._truncated

    @property
    def offset(self) -> int:
        """Bytes passed out in pieces so far."""
        return self._offset

    @property
    def buffered(self) -> int:
        """Bytes fed but held back inside an incomplete structural piece."""
        return len(self._buf)

    @property
    def held(self) -> bytes:
        """The bytes counted in `buffered`."""
        return bytes(self._buf)

    @property
    def body_received(self) -> int:
        """Payload bytes (BODY pieces) of the current message so far."""
        return self._body_received

    # -- control -------------------------------------------------------------------

    def expect_response_to(self, method: str) -> None:
        """Queue the method of a request sent on this connection (pipelining keeps order);
        each final response takes the oldest. Without one, GET is assumed."""
        self._methods.append(method.upper())

    def start_tunnel(self) -> None:
        """From here on everything is OPAQUE (e.g. a request stream after the server's 101,
        or the 2xx to a CONNECT). Held bytes go out as OPAQUE with the next feed
        (`feed(b"")` releases them now)."""
        if self._state is not _State.OPAQUE:
            self._tunnel = True
            self._state = _State.OPAQUE

    def feed(self, data: bytes) -> list[Piece]:
        if self._eof:
            raise RuntimeError("feed() after feed_eof()")
        out: list[Piece] = []
        if self._buf:
            self._buf += data
        else:
            # Nothing held: cut what can be cut straight from `data`, and buffer only
            # the rest (the same pieces as the buffered way, without copying body bytes
            # through the buffer twice).
            if not isinstance(data, bytes):
                data = bytes(data)
            taken = self._cut_direct(data, out)
            if taken == len(data):
                return out
            self._buf += data[taken:] if taken else data
        while self._buf and self._step(out):
            pass
        return out

    def skip_body(self, data: bytes) -> int:
        """Take `data` without cutting pieces if all of it is body of the message under
        way and none of it ends that message: whole chunks (each its chunk-size line, data
        and CRLF, none of them the last chunk, exactly as `_cut_direct` cuts one read
        whole), a Content-Length body's bytes short of its last, or a body read until
        close. Returns the payload bytes in it (chunk data, not chunk lines), with the
        framer's offsets moved past it as `feed` would have; -1, with nothing changed,
        for anything else (then `feed` it)."""
        state = self._state
        size = len(data)
        if self._buf or self._eof or not size:
            return -1
        if state is _State.CHUNK_SIZE:
            body = pos = 0
            while pos < size:
                nl = data.find(b"\n", pos)
                if nl < 0 or nl - pos >= MAX_CHUNK_LINE_BYTES:
                    return -1
                match = _CHUNK_LINE.match(data, pos, nl + 1)
                if match is None:
                    return -1
                chunk = int(match.group(1), 16)
                stop = nl + 1 + chunk
                if chunk == 0 or chunk > MAX_BODY_SIZE or stop + 1 >= size:
                    return -1
                if data[stop] != _CR or data[stop + 1] != _LF:
                    return -1
                body += chunk
                pos = stop + 2
        elif state is _State.LENGTH:
            if size >= self._remaining:
                return -1  # its last bytes end the message: `feed` them
            self._remaining -= size
            body = size
        elif state is _State.UNTIL_CLOSE:
            body = size
        else:
            return -1
        self._offset += size
        self._body_received += body
        return body

    def feed_eof(self) -> list[Piece]:
        if self._eof:
            return []
        self._eof = True
        out: list[Piece] = []
        state = self._state
        if state is _State.UNTIL_CLOSE:
            # RFC 9112 §6.3 item 8: the close is what ends this body.
            self._emit(out, PieceKind.BODY, 0, end=True)
            self._next_message()
        elif state is _State.OPAQUE:
            if self._buf:
                self._emit(out, PieceKind.OPAQUE, len(self._buf))
        else:
            self._truncated = not self.message_complete
            if self._buf:
                self._emit(out, PieceKind.OPAQUE, len(self._buf))
        return out

    # -- machinery -----------------------------------------------------------------

    def _emit(
        self,
        out: list[Piece],
        kind: PieceKind,
        n: int,
        *,
        head: Head | None = None,
        end: bool = False,
    ) -> None:
        data = bytes(self._buf[:n])
        del self._buf[:n]
        self._scan = self._line = self._start = 0
        out.append(Piece(kind, data, self._message, self._offset, head, end))
        self._offset += n
        if kind is PieceKind.BODY:
            self._body_received += n

    def _cut_direct(self, data: bytes, out: list[Piece]) -> int:
        """The fast path for bytes whose boundaries are known (content-length and chunk
        data, chunk-size lines and the CRLF after chunk data, bodies read until close,
        tunnels) and a head read whole (`_cut_head`) when nothing is held: pieces are
        slices of `data` itself. Returns how many bytes it cut; anything else (a head cut
        short, trailers, a line cut short, a last or malformed chunk) is left to `_step`,
        which decides it exactly as before."""
        pos = 0
        size = len(data)
        while pos < size:
            state = self._state
            if state is _State.LENGTH or state is _State.CHUNK_DATA:
                n = min(self._remaining, size - pos)
                self._remaining -= n
                done = self._remaining == 0
                last = done and state is _State.LENGTH
                pos = self._cut(out, PieceKind.BODY, data, pos, n, last)
                if last:
                    self._next_message()
                elif done:
                    self._state = _State.CHUNK_CRLF
            elif state is _State.CHUNK_SIZE:
                nl = data.find(b"\n", pos)
                if nl < 0 or nl - pos >= MAX_CHUNK_LINE_BYTES:
                    return pos
                match = _CHUNK_LINE.match(data, pos, nl + 1)
                if match is None:
                    return pos
                chunk = int(match.group(1), 16)
                if chunk == 0 or chunk > MAX_BODY_SIZE:
                    return pos
                stop = nl + 1 + chunk
                if stop + 1 < size and data[stop] == _CR and data[stop + 1] == _LF:
                    # A whole chunk in this read (an SSE frame's usual shape): its line,
                    # data and CRLF at once, the pieces and state the steps below make.
                    message, offset = self._message, self._offset
                    out.append(new_piece(_HEADER, data[pos : nl + 1], message, offset))
                    offset += nl + 1 - pos
                    out.append(new_piece(_BODY, data[nl + 1 : stop], message, offset))
                    offset += chunk
                    out.append(new_piece(_CRLF, _CRLF_BYTES, message, offset))
                    self._offset = offset + 2
                    self._body_received += chunk
                    self._remaining = 0
                    pos = stop + 2
                    continue
                pos = self._cut(out, PieceKind.CHUNK_HEADER, data, pos, nl + 1 - pos, False)
                self._remaining = chunk
                self._state = _State.CHUNK_DATA
            elif state is _State.CHUNK_CRLF:
                if data[pos] == _LF:
                    n = 1
                elif data[pos] == _CR and pos + 1 < size and data[pos + 1] == _LF:
                    n = 2
                else:
                    return pos
                pos = self._cut(out, PieceKind.CHUNK_TRAILER_CRLF, data, pos, n, False)
                self._state = _State.CHUNK_SIZE
            elif state is _State.UNTIL_CLOSE:
                pos = self._cut(out, PieceKind.BODY, data, pos, size - pos, False)
            elif state is _State.OPAQUE:
                pos = self._cut(out, PieceKind.OPAQUE, data, pos, size - pos, False)
            elif state is _State.HEAD:
                taken = self._cut_head(data, pos, out)
                if taken == pos:
                    return pos
                pos = taken
            else:
                return pos
        return pos

    def _cut(
        self, out: list[Piece], kind: PieceKind, data: bytes, pos: int, n: int, end: bool
    ) -> int:
        """`_emit` for `data[pos:pos + n]` (nothing held); returns the position after it."""
        piece = data if n == len(data) else data[pos : pos + n]
        out.append(new_piece(kind, piece, self._message, self._offset, None, end))
        self._offset += n
        if kind is PieceKind.BODY:
            self._body_received += n
        return pos + n

    def _next_message(self) -> None:
        self._message += 1
        self._interim = False
        self._body_received = 0
        self._message_start = self._offset
        # RFC 9112 §9.6: after a Connection: close message the sender sends no more.
        self._state = _State.CLOSED if self._closed else _State.HEAD

    def _refuse(self, reason: str, status: int | None, *, start_line: bool = False) -> None:
        if self._refusal is None:
            self._refusal = Refusal(
                self._message, self._message_start, self._offset, reason, status, start_line
            )

    def _degrade(self, reason: str, status: int = 400, *, start_line: bool = False) -> bool:
        self._degraded = reason
        self._refuse(reason, status, start_line=start_line)
        self._state = _State.OPAQUE
        return True

    def _blank_line_end(self, skip_leading: bool, limit: int) -> int | None:
        """Scan new bytes for the blank line ending a field section; its end index, or
        None when more bytes are needed. Raises _Malformed past `limit`."""
        buf = self._buf
        while True:
            nl = buf.find(b"\n", self._scan)
            if nl < 0:
                self._scan = len(buf)
                if len(buf) - self._start > limit:
                    raise _Malformed(f"field section longer than {limit} bytes")
                return None
            start = self._line
            self._scan = self._line = nl + 1
            if nl + 1 - self._start > limit:
                raise _Malformed(f"field section longer than {limit} bytes")
            if nl == start or (nl == start + 1 and buf[start] == _CR):
                if skip_leading and start == self._start:
                    self._start = nl + 1
                    continue
                return nl + 1

    def _step(self, out: list[Piece]) -> bool:
        """Advance by one piece or state change; False when more bytes are needed."""
        state = self._state
        buf = self._buf
        if state is _State.OPAQUE:
            self._emit(out, PieceKind.OPAQUE, len(buf))
            return True
        if state is _State.CLOSED:
            # What follows a Connection: close message is not a second message (nginx
            # reads and discards it, answering nothing).
            reason = "data after Connection: close"
            self._refuse(reason, None)
            self._degraded = reason
            self._state = _State.OPAQUE
            return True
        if state is _State.HEAD:
            begin = max(self._scan - 1, self._start)  # a CR before the new bytes, and those
            try:
                end = self._blank_line_end(skip_leading=True, limit=MAX_HEAD_BYTES)
            except _Malformed as exc:
                if _BARE_CR.search(buf, begin, self._start + MAX_HEAD_BYTES + 1):
                    return self._degrade(BARE_CR_IN_HEAD)  # the earlier of the two faults
                return self._degrade(str(exc))
            # nginx refuses a CR that no LF follows as soon as it reads the byte after it
            # (ngx_http_parse_request_line / ngx_http_parse_header_line, sw_almost_done:
            # 400), whether or not the head ever ends: a head cannot hide one.
            if _BARE_CR.search(buf, begin, len(buf) if end is None else end):
                return self._degrade(BARE_CR_IN_HEAD)
            return end is not None and self._finish_head(out, end)
        if state is _State.LENGTH or state is _State.CHUNK_DATA:
            n = min(self._remaining, len(buf))
            self._remaining -= n
            done = self._remaining == 0
            last = done and state is _State.LENGTH
            self._emit(out, PieceKind.BODY, n, end=last)
            if last:
                self._next_message()
            elif done:
                self._state = _State.CHUNK_CRLF
            return True
        if state is _State.UNTIL_CLOSE:
            self._emit(out, PieceKind.BODY, len(buf))
            return True
        if state is _State.CHUNK_SIZE:
            nl = buf.find(b"\n", self._scan)
            if nl < 0:
                self._scan = len(buf)
                if len(buf) > MAX_CHUNK_LINE_BYTES:
                    return self._degrade(f"chunk-size line longer than {MAX_CHUNK_LINE_BYTES}")
                return False
            match = _CHUNK_LINE.match(buf, 0, nl + 1) if nl < MAX_CHUNK_LINE_BYTES else None
            if match is None:
                return self._degrade(f"malformed chunk-size line {bytes(buf[: nl + 1])!r}")
            size = int(match.group(1), 16)
            if size > MAX_BODY_SIZE:
                return self._degrade(f"chunk size {match.group(1)!r} too large")
            if size == 0:
                self._emit(out, PieceKind.LAST_CHUNK, nl + 1)
                self._state = _State.TRAILERS
            else:
                self._emit(out, PieceKind.CHUNK_HEADER, nl + 1)
                self._remaining = size
                self._state = _State.CHUNK_DATA
            return True
        if state is _State.CHUNK_CRLF:
            if buf[0] == _LF:
                n = 1
            elif buf[0] == _CR and len(buf) >= 2 and buf[1] == _LF:
                n = 2
            elif buf[0] == _CR and len(buf) == 1:
                return False
            else:
                return self._degrade("chunk data not followed by CRLF")
            self._emit(out, PieceKind.CHUNK_TRAILER_CRLF, n)
            self._state = _State.CHUNK_SIZE
            return True
        # _State.TRAILERS
        try:
            end = self._blank_line_end(skip_leading=False, limit=MAX_TRAILER_BYTES)
            if end is None:
                return False
            _parse_fields(bytes(buf[:end]).decode("latin-1").split("\n")[:-2])
        except _Malformed as exc:
            return self._degrade(f"trailers: {exc}")
        self._emit(out, PieceKind.TRAILERS, end, end=True)
        self._next_message()
        return True

    def _finish_head(self, out: list[Piece], end: int) -> bool:
        try:
            head = _parse_head(bytes(self._buf[self._start : end]), self.role)
            mode, length = self._body_mode(head)
        except _Malformed as exc:
            return self._degrade(str(exc), exc.status, start_line=exc.start_line)
        self._took_head(out, head, mode, length, None, end)
        return True

    def _cut_head(self, data: bytes, pos: int, out: list[Piece]) -> int:
        """`_cut_direct` for a head that `data` holds whole from `pos`, ending in CRLF
        CRLF, with no blank line before it (a client's or an upstream's head, read in one
        go): parsed once from the read, its piece a slice of it. Returns the position
        after it, or `pos` to leave anything else (a head cut short, one the parser
        refuses) to `_step`, which decides it exactly as before."""
        end = data.find(b"\r\n\r\n", pos)
        if end < 0:
            return pos
        stop = end + 4
        if stop - pos > MAX_HEAD_BYTES:
            return pos
        raw = data if pos == 0 and stop == len(data) else data[pos:stop]
        try:
            head = _parse_head(raw, self.role)
            mode, length = self._body_mode(head)
        except _Malformed:
            # Refused the buffered way, with its reason. A blank line before the start
            # line (skipped the buffered way) or an earlier one ending the head (bare LF
            # line ends) puts an empty line where a start or field line must be, which
            # the parser refuses, as it refuses a bare CR: such heads come here too.
            return pos
        self._took_head(out, head, mode, length, raw, stop - pos)
        return stop

    def _took_head(
        self,
        out: list[Piece],
        head: Head,
        mode: _State,
        length: int,
        raw: bytes | None,
        size: int,
    ) -> None:
        """The state a parsed head leaves and its piece: the first `size` bytes of the
        buffer, or `raw` (cut from a read with nothing held)."""
        self._head = head
        interim = head.is_interim
        if not interim and not head.keep_alive and mode is not _State.OPAQUE:
            self._closed = True
        if head.method == "CONNECT":
            # nginx answers CONNECT 405 and closes (ngx_http_process_request_header): a
            # reverse proxy opens no tunnel. The framer still frames what follows.
            self._refuse("CONNECT method", 405)
        if self.role == "response" and not interim:
            self._method = self._methods.pop(0) if self._methods else "GET"
        elif self.role == "request":
            self._method = head.method
        ends = (mode is _State.HEAD or mode is _State.OPAQUE) and not interim
        if raw is None:
            self._emit(out, PieceKind.HEAD, size, head=head, end=ends)
        else:
            out.append(new_piece(PieceKind.HEAD, raw, self._message, self._offset, head, ends))
            self._offset += size
        if interim:
            self._interim = True
        elif mode is _State.HEAD:
            self._next_message()
        elif mode is _State.OPAQUE:
            self._tunnel = True
            self._state = _State.OPAQUE
        else:
            self._state = mode
            self._remaining = length

    def _body_mode(self, head: Head) -> tuple[_State, int]:
        """How the body after `head` is delimited (RFC 9112 §6.3); HEAD means none."""
        if head.status is not None:
            method = self._methods[0] if self._methods else "GET"
            if head.status == 101 or (method == "CONNECT" and 200 <= head.status < 300):
                return _State.OPAQUE, 0
            if head.is_interim or head.status in (204, 304) or method == "HEAD":
                return _State.HEAD, 0
        elif head.method == "CONNECT":
            # A CONNECT has no body (RFC 9110 §9.3.6); the request stream turns into a
            # tunnel only when a 2xx answers it (`start_tunnel`), never before: bytes
            # sent ahead of the answer are the next request as far as a proxy knows.
            return _State.HEAD, 0
        by_name = _fields_by_name(head)
        codings = by_name.get("transfer-encoding")
        if codings:
            if "content-length" in by_name:
                # RFC 9112 §6.1: an intermediary must not forward both; nginx: 400 for a
                # request, 502 ("upstream sent both") for a response.
                raise _Malformed("Content-Length and Transfer-Encoding together")
            if head.is_request and head.version == "HTTP/1.0":
                # RFC 9112 §6.1: TE in a 1.0 message is faulty framing; nginx: 400.
                raise _Malformed("Transfer-Encoding in an HTTP/1.0 request")
            if len(codings) > 1 or head.tokens("transfer-encoding").count("chunked") > 1:
                # RFC 9112 §7: chunked at most once; nginx refuses a repeated header line.
                raise _Malformed("Transfer-Encoding repeated")
            if head.is_chunked:
                return _State.CHUNK_SIZE, 0
            if head.is_request:
                # nginx: "client sent unknown Transfer-Encoding", 501 Not Implemented.
                raise _Malformed("request Transfer-Encoding does not end in chunked", 501)
            return _State.UNTIL_CLOSE, 0
        length = _content_length(head)
        if length is not None:
            return (_State.LENGTH, length) if length else (_State.HEAD, 0)
        return (_State.HEAD, 0) if head.is_request else (_State.UNTIL_CLOSE, 0)


def _content_length(head: Head) -> int | None:
    """RFC 9110 §8.6: a list of identical values is that value; anything else is invalid."""
    values = {v.strip() for raw in head.header_values("content-length") for v in raw.split(",")}
    if not values:
        return None
    if len(values) != 1:
        raise _Malformed(f"conflicting Content-Length values {sorted(values)}")
    (value,) = values
    if not value.isascii() or not value.isdigit():
        raise _Malformed(f"invalid Content-Length {value!r}")
    if len(value.lstrip("0")) > 19 or int(value) > MAX_BODY_SIZE:
        raise _Malformed(f"invalid Content-Length {value!r} (too large)")
    return int(value)


def _parse_fields(lines: Sequence[str]) -> tuple[tuple[str, str], ...]:
    """Field lines (line ends already split off) into (name, value) pairs."""
    fields: list[tuple[str, str]] = []
    for raw in lines:
        match = _FIELD_LINE.fullmatch(raw)
        if match is not None:
            fields.append((match[1], match[2]))  # the usual line, in one step
            continue
        line = raw[:-1] if raw.endswith("\r") else raw
        if "\r" in line:
            raise _Malformed(f"bare CR in field line {line!r}")
        if _CONTROL.search(line):
            raise _Malformed(f"control byte in field line {line!r}")
        if line[:1] in (" ", "\t"):
            # obs-fold (RFC 9112 §5.2): a recipient may replace it with a space, but a
            # folded framing field would be forwarded folded and read otherwise further
            # on (nginx refuses it): refused.
            if not fields:
                raise _Malformed("folded line before any field")
            name, value = fields[-1]
            if name.lower() in ("transfer-encoding", "content-length"):
                raise _Malformed(f"folded {name} line")
            fields[-1] = (name, (value + " " + line.strip(" \t")).strip())
            continue
        name, colon, value = line.partition(":")
        if not colon or not _TOKEN.match(name):
            raise _Malformed(f"malformed field line {line!r}")
        fields.append((name, value.strip(" \t")))
    return tuple(fields)


def _parse_head(raw: bytes, role: Role) -> Head:
    lines = raw.decode("latin-1").split("\n")[:-2]  # drop the blank line and what follows
    start = lines[0].removesuffix("\r")
    if _CONTROL.search(start) or "\r" in start:
        raise _Malformed(f"control byte in start line {start!r}")
    fields = _parse_fields(lines[1:])
    if role == "request":
        parts = start.split(" ")
        if len(parts) != 3 or not _TOKEN.match(parts[0]) or not parts[1]:
            raise _Malformed(f"malformed request line {start!r}")
        if not _VERSION.match(parts[2]):
            raise _Malformed(f"not HTTP/1.x: {start!r}")
        return new_head(parts[2], fields, parts[0], parts[1])
    version, _, rest = start.partition(" ")
    code, _, reason = rest.partition(" ")
    if not _VERSION.match(version):
        raise _Malformed(f"not an HTTP/1.x status line: {start!r}", start_line=True)
    if len(code) != 3 or not code.isascii() or not code.isdigit() or code[0] == "0":
        raise _Malformed(f"malformed status code in {start!r}", start_line=True)
    return new_head(version, fields, None, None, int(code), reason)


# -- builders for the few faults that rewrite ------------------------------------------


def build_head(
    head: Head,
    set_headers: Mapping[str, str] | Sequence[tuple[str, str]] = (),
    remove_headers: Iterable[str] = (),
) -> bytes:
    """Serialize `head` (use `dataclasses.replace` to change the start line) with CRLF
    line ends. `set_headers` replaces the first field of each name in place, drops its
    other occurrences and appends names not present; `remove_headers` drops fields
    (names case-insensitive)."""
    return serialize_head(rebuilt_head(head, set_headers, remove_headers))


def rebuilt_head(
    head: Head,
    set_headers: Mapping[str, str] | Sequence[tuple[str, str]] = (),
    remove_headers: Iterable[str] = (),
) -> Head:
    """`head` with its fields changed as `build_head` describes (the parsed form of what
    `build_head` writes, so a fault that rewrites a head knows its pieces)."""
    pairs = list(set_headers.items()) if isinstance(set_headers, Mapping) else list(set_headers)
    new = {n.lower(): (n, v) for n, v in pairs}
    removed = {n.lower() for n in remove_headers}
    headers = head.headers
    if removed or any(key in new for key in _fields_by_name(head)):
        fields: list[tuple[str, str]] = []
        placed: set[str] = set()
        for name, value in headers:
            key = name.lower()
            if key in removed or key in placed:
                continue
            if key in new:
                placed.add(key)
                fields.append((name, new[key][1]))
            else:
                fields.append((name, value))
        fields += [nv for key, nv in new.items() if key not in placed and key not in removed]
        headers = tuple(fields)
    else:
        headers += tuple(new.values())  # only new names (set_header's usual case): appended
    # the start line as it was (what `dataclasses.replace` would copy, without its
    # generic machinery: a head is rewritten on every response of a set_header path)
    return new_head(head.version, headers, head.method, head.target, head.status, head.reason)


def serialize_head(head: Head) -> bytes:
    """A head's start line and fields with CRLF line ends and the blank line."""
    if head.method is not None:
        start = f"{head.method} {head.target} {head.version}"
    else:
        start = f"{head.version} {head.status} {head.reason or ''}".rstrip(" ")
    lines = [start, *(f"{n}: {v}" for n, v in head.headers), "", ""]
    return "\r\n".join(lines).encode("latin-1")


def encode_chunk(data: bytes, extensions: str = "") -> bytes:
    """One chunk: size line (with `extensions`, e.g. ";foo=bar"), data, CRLF. Empty data
    would be the last chunk, so it is refused: use LAST_CHUNK_BYTES."""
    if not data:
        raise ValueError("an empty chunk ends the body; use LAST_CHUNK_BYTES")
    return b"%x%s\r\n%s\r\n" % (len(data), extensions.encode("latin-1"), data)


# -- both directions -------------------------------------------------------------------

REQUEST_BODY_KEEP = 64 * 1024
"""How many bytes of each request body `Http1Exchange` keeps (enough for the model)."""

_KEEP_MESSAGES = 64


class Http1Exchange:
    """Both framers of one connection: feed `(direction, data)`; UPSTREAM is the request
    stream. Request methods reach the response framer (HEAD, CONNECT), a 101 turns the
    request stream into a tunnel, and the heads and first `REQUEST_BODY_KEEP` bytes of
    the last 64 requests stay available, so response K can be matched to request K."""

    def __init__(self) -> None:
        self.requests = Http1Framer("request")
        self.responses = Http1Framer("response")
        self._heads: dict[int, Head] = {}
        self._bodies: dict[int, bytearray] = {}

    def framer(self, direction: Direction) -> Http1Framer:
        return self.requests if direction is Direction.UPSTREAM else self.responses

    def feed(self, direction: Direction, data: bytes) -> list[Piece]:
        pieces = self.framer(direction).feed(data)
        self._observe(direction, pieces)
        return pieces

    def feed_eof(self, direction: Direction) -> list[Piece]:
        pieces = self.framer(direction).feed_eof()
        self._observe(direction, pieces)
        return pieces

    def request_head(self, message: int) -> Head | None:
        """The head of request `message` (the request that response `message` answers)."""
        return self._heads.get(message)

    def request_body(self, message: int) -> bytes:
        """The first REQUEST_BODY_KEEP bytes of request `message`'s payload."""
        return bytes(self._bodies.get(message, b""))

    def _observe(self, direction: Direction, pieces: list[Piece]) -> None:
        for p in pieces:
            if direction is Direction.UPSTREAM:
                if p.head is not None and p.head.method is not None:
                    self.responses.expect_response_to(p.head.method)
                    self._heads[p.message] = p.head
                    self._bodies[p.message] = bytearray()
                    self._heads.pop(p.message - _KEEP_MESSAGES, None)
                    self._bodies.pop(p.message - _KEEP_MESSAGES, None)
                elif p.kind is PieceKind.BODY and p.message in self._bodies:
                    body = self._bodies[p.message]
                    body += p.data[: REQUEST_BODY_KEEP - len(body)]
            elif p.head is not None and self.responses.tunnel:
                self.requests.start_tunnel()  # a 101, or a 2xx to a CONNECT
