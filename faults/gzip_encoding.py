"""gzip_encoding: a hop that gzips the response body, as nginx's gzip filter does.

The incident: `gzip on` with `gzip_types ... text/event-stream` (or a CDN's automatic
compression) in front of an SSE stream. nginx's ngx_http_gzip_filter_module:
- compresses only when the request accepts gzip (`ngx_http_gzip_ok`: a `gzip` coding
  in Accept-Encoding without `q=0`) from an HTTP/1.1 client (`gzip_http_version 1.1`),
  for status 200, 403 or 404, a body-bearing response without a Content-Encoding,
  a content type listed in `gzip_types` (compared without parameters; `*` is any),
  and a Content-Length, if known, of at least `gzip_min_length` (20);
- rewrites the head: `Content-Encoding: gzip`, no Content-Length (the body is sent
  chunked), no Accept-Ranges, a weak ETag, and `Vary: Accept-Encoding` when
  `gzip_vary on` (off by default in nginx, on here, as most gzip configs set it);
- deflates with zlib at `gzip_comp_level` 1, window 15, memLevel 8, behind its own
  10-byte gzip header `1f 8b 08 00 00000000 00 03` and a CRC-32/ISIZE trailer;
- passes compressed output on only when one of its `gzip_buffers` (32 x 4k) is full,
  or at the end (Z_FINISH), unless the incoming data carries a flush flag: then it
  calls deflate with Z_SYNC_FLUSH and sends what it has. Upstream data is flagged
  so under `proxy_buffering off` (`ngx_http_proxy_non_buffered_copy_filter` sets
  `b->flush`), and not under the default buffering.

So `flush: none` (buffered proxying) holds the head and the stream until 4 KiB of
*compressed* output exist, which for a token stream at level 1 means zlib's own block
(tens of KiB of events): the client sees nothing for a long time, then bursts, and the
rest at the end. `flush: sync` (buffering off) sends every upstream read as its own
sync-flushed deflate block, so each event is decodable on arrival, and the head with
the gzip header and an empty sync block at once (nginx's `NGX_HTTP_FLUSH` after the
head). The head and the gzip header wait in the write filter until the first output,
as `postpone_output` makes them.

The body is de-chunked by the passive framer and re-framed with `encode_chunk`;
upstream trailers are dropped. A FIN that cuts the response short (idle_reaper's read
timeout, or an upstream that dies mid-response) makes nginx finalize with
NGX_HTTP_FLUSH: zlib sync-flushes and the client gets the head (if still held), the
gzip header and the compressed data, then the close without the terminal chunk
(measured on nginx 1.22 with `gzip on` and buffering: a 200 with
`Content-Encoding: gzip` and the compressed slab). An RST loses what zlib held. Other
responses (and those `match` does not select) pass through byte for byte.
"""

from __future__ import annotations

import struct
import zlib
from dataclasses import dataclass, field
from typing import ClassVar, Literal

from faults._lib.checks import check_choice, check_positive
from faults._lib.items import merged
from faults._lib.match import HttpMatched
from middlebox.core.fault import Bytes, Fault
from middlebox.core.http1 import LAST_CHUNK_BYTES, Head, Piece, PieceKind, build_head, encode_chunk
from middlebox.core.stream import DOWN, Chunk, Direction, Eof, Item

FlushPolicy = Literal["none", "sync"]

# ngx_http_gzip_filter_gzheader: magic, deflate, no flags, mtime 0, xfl 0, OS unix.
NGINX_GZIP_HEADER = bytes([0x1F, 0x8B, 8, 0, 0, 0, 0, 0, 0, 3])
# ngx_http_gzip_header_filter compresses only these statuses.
GZIP_STATUSES = frozenset({200, 403, 404})


def accepts_gzip(head: Head) -> bool:
    """A `gzip` coding with a non-zero q in Accept-Encoding (RFC 9110 §12.5.3)."""
    for element in head.tokens("accept-encoding"):
        coding, _, params = element.partition(";")
        if coding.strip() != "gzip":
            continue
        for param in params.split(";"):
            name, _, value = param.strip().partition("=")
            if name == "q":
                try:
                    return float(value) > 0
                except ValueError:
                    return False
        return True
    return False


def media_type(head: Head) -> str:
    """The Content-Type without parameters, lower-cased, as gzip_types compares it."""
    return (head.header("content-type") or "").split(";", 1)[0].strip().lower()


@dataclass
class _Deflating:
    """One response being compressed."""

    message: int
    head: bytes
    compressor: zlib._Compress
    pending: bytearray = field(default_factory=bytearray)
    head_sent: bool = False
    crc: int = 0
    size: int = 0
    compressed: int = 0
    fed: bool = False


@dataclass
class GzipEncoding(HttpMatched, Fault):
    """Gzip chosen responses' bodies with nginx's defaults and flush behaviour."""

    name: ClassVar[str] = "gzip_encoding"

    flush: FlushPolicy = "none"
    level: int = 1
    buffer_size: Bytes = 4096
    content_types: tuple[str, ...] = ("text/html", "text/event-stream", "application/json")
    require_accept_encoding: bool = True
    min_length: Bytes = 20
    vary: bool = True

    _deflating: _Deflating | None = field(init=False, repr=False, default=None)

    def __post_init__(self) -> None:
        check_choice("flush", self.flush, FlushPolicy)
        if not 1 <= self.level <= 9:
            raise ValueError(f"level must be 1..9 (gzip_comp_level), got {self.level!r}")
        check_positive("buffer_size", self.buffer_size)
        check_positive("min_length", self.min_length, allow_zero=True)
        if not self.content_types:
            raise ValueError("content_types must name at least one type (or '*')")

    def changes(self) -> frozenset[Direction]:
        return frozenset({Direction.DOWNSTREAM})  # the body is re-encoded: a new stream

    def on_item(self, item: Item, now: float) -> list[Item]:
        pieces = self.observe(item, now)
        if item.direction is Direction.UPSTREAM:
            return [item]
        out = bytearray()
        for piece in pieces:
            out += self._piece(piece, now)
        state = self._deflating
        if state is not None and state.fed:
            state.fed = False
            if self.flush == "sync":
                state.pending += state.compressor.flush(zlib.Z_SYNC_FLUSH)
                out += self._output(state, everything=True)
            else:
                out += self._output(state, everything=False)
        items: list[Item] = [Chunk(DOWN, bytes(out))] if out else []
        if not isinstance(item, Chunk):
            state = self._deflating
            if state is not None:
                self._deflating = None
                if isinstance(item, Eof):
                    # Cut short by a FIN (a hop's read timeout, or the upstream dying):
                    # ngx_http_upstream_finalize_request sends NGX_HTTP_FLUSH, so zlib
                    # sync-flushes and the head and compressed data go out; no terminal
                    # chunk and no gzip trailer follow.
                    state.pending += state.compressor.flush(zlib.Z_SYNC_FLUSH)
                    flushed = self._output(state, everything=True)
                    if flushed:
                        items.append(Chunk(DOWN, flushed))
                    self.report(now, "flushed_on_close", response=state.message, size=len(flushed))
                else:
                    # An RST: the connection is gone, what zlib held with it.
                    self.report(now, "truncated", response=state.message)
            items.append(item)
        return merged(items)

    def _piece(self, piece: Piece, now: float) -> bytes:
        state = self._deflating
        if state is None:
            if piece.kind is PieceKind.HEAD and piece.head is not None:
                return self._start(piece, piece.head, now)
            return piece.data
        if piece.kind is PieceKind.BODY and piece.data:
            state.crc = zlib.crc32(piece.data, state.crc)
            state.size += len(piece.data)
            state.pending += state.compressor.compress(piece.data)
            state.fed = True
        if not piece.end_of_message:
            return b""  # the upstream's chunk framing is replaced by ours
        self._deflating = None
        state.pending += state.compressor.flush(zlib.Z_FINISH)
        state.pending += struct.pack("<II", state.crc, state.size & 0xFFFFFFFF)
        data = self._output(state, everything=True) + LAST_CHUNK_BYTES
        self.report(
            now, "compressed", response=state.message, size=state.size, gzipped=state.compressed
        )
        return data

    def _start(self, piece: Piece, head: Head, now: float) -> bytes:
        if not self._compresses(piece, head):
            return piece.data
        set_headers = [("Content-Encoding", "gzip"), ("Transfer-Encoding", "chunked")]
        if self.vary and head.header("vary") is None:
            set_headers.append(("Vary", "Accept-Encoding"))
        etag = head.header("etag")
        if etag is not None and not etag.startswith("W/"):
            set_headers.append(("ETag", "W/" + etag))  # ngx_http_weak_etag
        new_head = build_head(head, set_headers, remove_headers=("Content-Length", "Accept-Ranges"))
        compressor = zlib.compressobj(self.level, zlib.DEFLATED, -zlib.MAX_WBITS, 8)
        state = _Deflating(piece.message, new_head, compressor)
        self._deflating = state
        self.report(now, "compressing", response=piece.message, byte=piece.offset)
        if self.flush == "sync":
            # Buffering off: nginx sends NGX_HTTP_FLUSH after the head, which makes
            # the gzip filter sync-flush an empty stream.
            state.pending += compressor.flush(zlib.Z_SYNC_FLUSH)
            return self._output(state, everything=True)
        return b""

    def _compresses(self, piece: Piece, head: Head) -> bool:
        if piece.end_of_message or head.status not in GZIP_STATUSES:
            return False  # no body (HEAD, 204, 304) or a status nginx leaves alone
        if self.selected(piece.message) is None:
            return False
        if head.header("content-encoding"):
            return False
        length = head.content_length
        if length is not None and length < self.min_length:
            return False
        if "*" not in self.content_types and media_type(head) not in self.content_types:
            return False
        request = self.request(piece.message)
        if request is None or request.head.version != "HTTP/1.1":
            return False  # gzip_http_version 1.1; HTTP/1.0 could not take chunked either
        return accepts_gzip(request.head) or not self.require_accept_encoding

    def _output(self, state: _Deflating, *, everything: bool) -> bytes:
        """What reaches the client: the gzip filter passes on full buffers, or all it
        has when flushing, and the write filter sends the held head with the first."""
        size = len(state.pending)
        if not everything:
            size -= size % self.buffer_size
            if size == 0:
                return b""
        body = bytes(state.pending[:size])
        del state.pending[:size]
        state.compressed += len(body)
        data = b""
        if not state.head_sent:
            state.head_sent = True
            state.compressed += len(NGINX_GZIP_HEADER)
            data = state.head
            if self.flush == "sync":
                # The gzip header and the first sync-flushed block share one output call.
                body = NGINX_GZIP_HEADER + body
            else:
                # The header went to the next filter on its own, as a 10-byte chunk that
                # postpone_output held back together with the response head.
                data += encode_chunk(NGINX_GZIP_HEADER)
        return data + (encode_chunk(body) if body else b"")
