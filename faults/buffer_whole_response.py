"""buffer_whole_response: a hop that reads the whole answer, then sends it with Content-Length.

The device: lighttpd 1.4 with its default `server.stream-response-body = 0` ("buffer the
entire response body before sending it to the client"), and any gateway that buffers a
backend's answer before it answers (a serverless function's buffered response mode). A
token stream reaches the client in one piece at the end, however long the answer took,
and a client that reads the framing sees a plain response with a length, not a stream.

What lighttpd 1.4.69 does (measured through `calibrate.proxies`' launcher, a chunked SSE
answer from a stdlib upstream; mod_proxy speaks HTTP/1.1 upstream):
- the head and the body wait until the upstream's answer ends: the terminal chunk, the
  Content-Length reached, or the upstream's FIN for a close-delimited body;
- then the head goes out without `Transfer-Encoding` and with `Content-Length` set to the
  decoded body's length (chunk framing and trailers gone), then the body, byte for byte;
- an HTTP/1.0 client gets the same length-framed answer (no chunked coding exists for
  it, RFC 9112 §6.1), so its connection may stay open as it asked (`Connection:
  keep-alive`) and a keep-alive HTTP/1.1 client's next request follows on the same
  connection;
- an upstream that ends the answer early (a FIN inside a chunked body, or an RST) is
  not reported: the client gets what arrived, with a Content-Length of that, a complete
  response to any HTTP client, and only the SSE stream lacks its end (`cut_short:
  send`; `502` answers with a gateway's error page instead, as a hop that checks the
  upstream's framing does);
- a hop that gave up upstream of it (its read timeout, `HopClose` from idle_reaper)
  with the answer held: lighttpd's error page replaces it, with `Connection: close`;
  lighttpd 1.4.69 was measured to say `404 Not Found` there (`timeout_status`), and `504`
  when nothing of the answer had arrived (idle_reaper's `before_headers` gives that one).

The fault adds `Connection: close` when the answer ends with the upstream connection
(a close-delimited body, or one cut short): the client's connection closes after it. It
ignores `X-Accel-Buffering: no` as lighttpd does (`honour_x_accel_buffering: true` streams
such an answer unchanged, as nginx would). Responses without a body (HEAD, 204, 304),
interim 1xx heads, and those `match` does not select pass byte for byte; bytes the
framer cannot read as HTTP while an answer is held (a malformed chunk) go out as they
arrived, after what was held, and the fault reports `stepped_aside`. Not modelled:
lighttpd's own `Accept-Ranges`, `Date` and `Server` fields (`set_header` adds them) and
its spilling of large answers to temp files: the answer is held in memory.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import ClassVar, Literal

from faults._lib.checks import check_choice
from faults._lib.ends import gateway_answer
from faults._lib.hop_close import is_hop_close
from faults._lib.items import merged
from faults._lib.match import RESPONSES, HttpMatched
from middlebox.core.fault import Fault
from middlebox.core.http1 import Head, Piece, PieceKind, build_head
from middlebox.core.responses import error_response
from middlebox.core.stream import DOWN, Chunk, Direction, Eof, Item, Reset

CutShort = Literal["send", "502"]


@dataclass
class _Held:
    """One answer being read whole: its head, its wire bytes and its decoded body."""

    message: int
    head: Head
    wire: bytearray = field(default_factory=bytearray)
    body: bytearray = field(default_factory=bytearray)


@dataclass
class BufferWholeResponse(HttpMatched, Fault):
    """Hold each chosen answer to its end; send it with a Content-Length, unchunked."""

    name: ClassVar[str] = "buffer_whole_response"

    honour_x_accel_buffering: bool = False
    cut_short: CutShort = "send"
    timeout_status: int = 404

    _answer: _Held | None = field(init=False, repr=False, default=None)
    _aside: bool = field(init=False, repr=False, default=False)

    def __post_init__(self) -> None:
        check_choice("cut_short", self.cut_short, CutShort)
        if not 400 <= self.timeout_status <= 599:
            raise ValueError(f"timeout_status must be 400..599, got {self.timeout_status!r}")

    def changes(self) -> frozenset[Direction]:
        return RESPONSES  # the head is re-framed and the chunk framing goes

    def on_item(self, item: Item, now: float) -> list[Item]:
        pieces = self.observe(item, now)
        if item.direction is Direction.UPSTREAM:
            return [item]
        out: list[Item] = []
        for piece in pieces:
            if piece.kind is PieceKind.OPAQUE and self._answer and not isinstance(item, Chunk):
                continue  # a chunk-size line cut by the end: no data of the answer in it
            out += self._piece(piece, now)
        if isinstance(item, Chunk):
            return merged(out)
        held, self._answer = self._answer, None
        if held is None:
            return merged([*out, item])
        if is_hop_close(item):
            self.report(now, "replaced", response=held.message, status=self.timeout_status,
                        held=len(held.body), end="fin")  # fmt: skip
            page = error_response(self.timeout_status, server=None)
            return merged([*out, Chunk(DOWN, page), item])
        how = "reset" if isinstance(item, Reset) else "fin"
        if self.cut_short == "502":
            self.report(now, "cut_short", response=held.message, upstream=how, held=len(held.body),
                        client="502", end="fin")  # fmt: skip
            return merged([*out, *gateway_answer("502")])
        self.report(now, "cut_short", response=held.message, upstream=how, held=len(held.body),
                    client="sent_as_complete", end="fin")  # fmt: skip
        # lighttpd closes the client's connection cleanly after it, even on the
        # upstream's RST: the client gets a FIN.
        return merged([*out, Chunk(DOWN, self._framed(held, closing=True)), Eof(DOWN)])

    def _piece(self, piece: Piece, now: float) -> list[Item]:
        held = self._answer
        if held is None:
            return self._start(piece, now)
        if piece.kind is PieceKind.OPAQUE:
            # Not HTTP any more (a malformed chunk): what was held goes out as it came.
            self._answer = None
            self._aside = True
            self.report(now, "stepped_aside", response=held.message, reason="not_http",
                        held=len(held.wire))  # fmt: skip
            return [Chunk(DOWN, bytes(held.wire) + piece.data)]
        held.wire += piece.data
        if piece.kind is PieceKind.BODY:
            held.body += piece.data
        if not piece.end_of_message:
            return []
        self._answer = None
        # An answer ended by the upstream's FIN (RFC 9112 §6.3 item 8) ends its connection.
        closing = not held.head.is_chunked and held.head.content_length is None
        data = self._framed(held, closing=closing)
        self.report(now, "released", response=held.message, size=len(held.body),
                    framing="chunked" if held.head.is_chunked else "length" if not closing
                    else "close")  # fmt: skip
        return [Chunk(DOWN, data)]

    def _start(self, piece: Piece, now: float) -> list[Item]:
        head = piece.head
        if piece.kind is not PieceKind.HEAD or head is None or self._aside:
            return [Chunk(DOWN, piece.data)] if piece.data else []
        if head.is_interim or piece.end_of_message or self.selected(piece.message) is None:
            return [Chunk(DOWN, piece.data)]
        accel = (head.header("X-Accel-Buffering") or "").strip().lower()
        if accel == "no" and self.honour_x_accel_buffering:
            self.report(now, "not_buffering", response=piece.message, reason="X-Accel-Buffering")
            return [Chunk(DOWN, piece.data)]
        self._answer = _Held(piece.message, head, bytearray(piece.data))
        self.report(now, "holding", response=piece.message, byte=piece.offset)
        return []

    def _framed(self, held: _Held, *, closing: bool) -> bytes:
        """The held answer with its new framing: no Transfer-Encoding, a Content-Length."""
        extra = [("Connection", "close")] if closing else []
        head = build_head(
            held.head,
            [("Content-Length", str(len(held.body))), *extra],
            remove_headers=("Transfer-Encoding", "Trailer"),
        )
        return head + bytes(held.body)
