"""proxy_buffering: nginx's default response buffering (`proxy_buffering on`).

What nginx does (ngx_http_proxy_module docs; src/event/ngx_event_pipe.c):
- The response head is read into a buffer of `proxy_buffer_size` (4k or 8k, one
  memory page); body bytes read together with the head stay in that buffer
  ("preread"), which keeps filling. The body then goes into `proxy_buffers` (8 x 4k|8k).
- `ngx_event_pipe_read_upstream` hands a buffer to the input filter, and so towards
  the client, only when it is *full* (`if (n >= size) { ... p->input_filter(p, cl->buf) }`);
  a partly filled buffer goes back to `free_raw_bufs` and keeps filling on the next
  read. Exceptions: when the upstream ends (`upstream_eof`/`upstream_done`), every
  buffer goes out; and when the partly filled buffer holds at least `p->length`
  bytes, "the minimal amount of data we want to see". With the default
  `proxy_http_version 1.0` the upstream body has no chunking, `p->length` is the
  Content-Length left (so only the end of the body releases early) or -1 for a
  streamed body (never). With `proxy_http_version 1.1` and a chunked upstream,
  `ngx_http_proxy_chunked_filter` sets `p->length = ctx->chunked.length`, the minimal
  rest of the chunked body (`ngx_http_parse_chunked`: 3 at a chunk start, the chunk's
  remaining size + 4 inside its data, 4 before its CRLF), so a read that completes a
  chunk is released at once.
- The head is not sent on its own: `ngx_http_send_header`'s output waits in the write
  filter, which also holds output smaller than `postpone_output` (1460) unless it is
  the last; so the client gets the head together with the first released buffer.
- nginx has no flush interval for proxied responses: a 200-byte-per-token SSE stream
  reaches the client in ~4 KiB bursts, the first one with the head, and the rest at
  the end. `X-Accel-Buffering: no` from the upstream turns buffering off for that
  response (`ngx_http_upstream_process_buffering`) unless the config has
  `proxy_ignore_headers X-Accel-Buffering` (`honour_x_accel_buffering: false`).

A hop's read timeout is not the upstream's end (`HopClose` from idle_reaper): on
`proxy_read_timeout` ngx_http_upstream_process_upstream sets `p->upstream_error`
without another ngx_event_pipe_read_upstream, so the partly filled raw buffer never
reaches the input filter and is lost; ngx_http_upstream_finalize_request then sends
only `NGX_HTTP_FLUSH` (`u->header_sent`), which makes the write filter send what
postpone_output held, and closes. The client gets the full buffers and not the partial
one. The upstream's own FIN (the end of a close-delimited body) releases everything.

The fault counts the upstream's wire bytes (head, chunk framing and data) as what
fills the buffers and forwards them unchanged. With nginx's default HTTP/1.0 upstream
leg (`http10_upstream` on the client side of this fault) the body is close-delimited,
so only body bytes count, as in nginx; with a chunked upstream the chunk framing counts
too (nginx's 1.1 leg parses it in the input filter). nginx re-frames the body, and it
hides `X-Accel-*` headers from the client (`ngx_http_proxy_hide_headers`), which
`strip_header` can add. A head larger than `buffer_size` gets nginx's `502` ("upstream
sent too big header"). Not modelled: a slow client's backlog spilling into
`proxy_temp_path` files up to `proxy_max_temp_file_size` (1024m); the pure fault
contract does not tell a fault how fast the client drains, so the relay's own bound
applies.

Each response on a keep-alive connection is buffered on its own, and only responses
to requests that `match` selects.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import ClassVar, Literal

from faults._lib.checks import check_choice, check_positive
from faults._lib.ends import gateway_answer
from faults._lib.hop_close import is_hop_close
from faults._lib.items import merged
from faults._lib.match import RESPONSES, HttpMatched
from middlebox.core.fault import Bytes, Fault
from middlebox.core.http1 import Piece, PieceKind
from middlebox.core.stream import DOWN, Chunk, Direction, Item

HttpVersion = Literal["1.0", "1.1"]


@dataclass
class _Response:
    """One buffered response: the pipe's partly filled buffer and the write filter."""

    message: int
    capacity: int
    chunked: bool
    partial: bytearray = field(default_factory=bytearray)
    pos: int = 0  # where in `partial` the body starts (after the head, in the first buffer)
    postponed: bytearray = field(default_factory=bytearray)
    end: int = 0  # wire offset after the last byte put in the pipe
    chunk_data: tuple[int, int] = (0, 0)  # wire range of the latest chunk's data


@dataclass
class ProxyBuffering(HttpMatched, Fault):
    """Hold each response until an nginx proxy buffer fills or the upstream ends."""

    name: ClassVar[str] = "proxy_buffering"

    buffer_size: Bytes = 4096
    buffers_size: Bytes = 4096
    honour_x_accel_buffering: bool = True
    proxy_http_version: HttpVersion = "1.0"
    postpone_output: Bytes = 1460

    _response: _Response | None = field(init=False, repr=False, default=None)
    _closed: bool = field(init=False, repr=False, default=False)

    def __post_init__(self) -> None:
        check_positive("buffer_size", self.buffer_size)
        check_positive("buffers_size", self.buffers_size)
        check_positive("postpone_output", self.postpone_output, allow_zero=True)
        check_choice("proxy_http_version", self.proxy_http_version, HttpVersion)

    def changes(self) -> frozenset[Direction]:
        # Its 502 for a head over `buffer_size` replaces the upstream's bytes: the faults
        # nearer the client read that page, not the head it stands for.
        return RESPONSES

    def on_item(self, item: Item, now: float) -> list[Item]:
        if self._closed:
            return []
        pieces = self.observe(item, now)
        if item.direction is Direction.UPSTREAM:
            return [item]
        if is_hop_close(item) and self._response is not None:
            return self._timed_out(self._response, item, now)
        out: list[Item] = []
        for piece in pieces:
            out += self._piece(piece, now)
            if self._closed:
                return out
        response = self._response
        if response is not None and isinstance(item, Chunk):
            self._after_read(response, now, out)
        if not isinstance(item, Chunk):
            if response is not None:
                self._release(response, now, out, reason="upstream_end")
                self._response = None
            out.append(item)
        return merged(out)

    def _piece(self, piece: Piece, now: float) -> list[Item]:
        response = self._response
        if response is None:
            head = piece.head
            if piece.kind is not PieceKind.HEAD or head is None or head.is_interim:
                return [Chunk(DOWN, piece.data)] if piece.data else []
            if self.selected(piece.message) is None:
                return [Chunk(DOWN, piece.data)]
            accel = (head.header("X-Accel-Buffering") or "").strip().lower()
            if accel == "no" and self.honour_x_accel_buffering:
                self.report(
                    now, "not_buffering", response=piece.message, reason="X-Accel-Buffering"
                )
                return [Chunk(DOWN, piece.data)]
            if len(piece.data) > self.buffer_size:
                # ngx_http_upstream_process_header: "upstream sent too big header".
                self._closed = True
                self.report(now, "too_big_header", response=piece.message, size=len(piece.data))
                return gateway_answer("502")
            response = self._response = _Response(
                piece.message, self.buffer_size, head.is_chunked, pos=len(piece.data)
            )
            self.report(now, "buffering", response=piece.message, byte=piece.offset)
        out: list[Item] = []
        self._fill(response, piece, now, out)
        if piece.kind is PieceKind.CHUNK_HEADER:
            start = piece.offset + len(piece.data)
            size = int(piece.data.split(b";", 1)[0].strip(), 16)
            response.chunk_data = (start, start + size)
        if piece.end_of_message:
            self._release(response, now, out, reason="upstream_done")
            self._response = None
        return out

    def _fill(self, response: _Response, piece: Piece, now: float, out: list[Item]) -> None:
        """Put a piece's bytes into the pipe; each buffer that fills goes out."""
        data = memoryview(piece.data)
        response.end = piece.offset + len(piece.data)
        while data:
            room = response.capacity - len(response.partial)
            response.partial += data[:room]
            data = data[room:]
            if len(response.partial) == response.capacity:
                self._pass_buffer(response)
                self._write(response, now, out, last=False, reason="buffer_full")

    def _pass_buffer(self, response: _Response) -> None:
        """The input filter takes the buffer; the next read goes into a fresh one."""
        response.postponed += response.partial
        response.partial = bytearray()
        response.pos = 0
        response.capacity = self.buffers_size

    def _after_read(self, response: _Response, now: float, out: list[Item]) -> None:
        """The end of ngx_event_pipe_read_upstream: the partly filled buffer goes out
        early only when it holds `p->length` bytes (proxy_http_version 1.1, chunked)."""
        if self.proxy_http_version != "1.1" or not response.chunked:
            return
        unparsed = len(response.partial) - response.pos
        if unparsed <= 0:
            return
        start = response.end - unparsed
        data_start, data_end = response.chunk_data
        if data_start <= start < data_end:
            minimal = data_end - start + 4  # sw_chunk_data: size + LF "0" LF LF
        elif start == data_end:
            minimal = 4  # sw_after_data
        else:
            minimal = 3  # sw_chunk_start: "0" LF LF
        if unparsed >= minimal:
            self._pass_buffer(response)
            self._write(response, now, out, last=False, reason="chunk_complete")

    def _timed_out(self, response: _Response, item: Item, now: float) -> list[Item]:
        """A hop gave up: the partial buffer is dropped, NGX_HTTP_FLUSH sends the rest."""
        self._response = None
        dropped = len(response.partial) - response.pos
        self.report(now, "dropped_partial", response=response.message, size=max(dropped, 0))
        out: list[Item] = []
        if response.pos:
            # The head is still in the first buffer: the client has had nothing.
            response.postponed += response.partial[: response.pos]
        response.partial = bytearray()
        self._write(response, now, out, last=True, reason="flush")
        return [*out, item]

    def _release(self, response: _Response, now: float, out: list[Item], reason: str) -> None:
        """The upstream is done: every buffer goes out, the write filter flushes."""
        response.postponed += response.partial
        response.partial = bytearray()
        self._write(response, now, out, last=True, reason=reason)

    def _write(
        self, response: _Response, now: float, out: list[Item], *, last: bool, reason: str
    ) -> None:
        """ngx_http_write_filter: send unless it is under postpone_output and not last."""
        size = len(response.postponed)
        if not size or (not last and size < self.postpone_output):
            return
        out.append(Chunk(DOWN, bytes(response.postponed)))
        response.postponed = bytearray()
        held = len(response.partial)
        self.report(
            now,
            "released",
            response=response.message,
            size=size,
            byte=response.end - held,
            reason=reason,
        )
