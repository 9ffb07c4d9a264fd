"""http10_upstream: the upstream leg speaks HTTP/1.0, as nginx's default `proxy_http_version 1.0`.

What nginx does (ngx_http_proxy_module; ngx_http_proxy_create_request):
- the request line to the upstream says `HTTP/1.0` and the head carries `Connection:
  close` (the default `proxy_set_header Connection close`); hop-by-hop fields the client
  sent (Connection, Keep-Alive, TE, Upgrade, Proxy-Connection) do not go on;
- a chunked request body is read whole first (`proxy_request_buffering on`) and sent
  with a `Content-Length`, since an HTTP/1.0 server cannot take chunked;
- so the upstream answers without chunking (RFC 9112 §6.1: no Transfer-Encoding to a
  1.0 client): a close-delimited body, ended by the upstream's FIN. vLLM (uvicorn/h11)
  does exactly that for a stream. The pipe then has no chunk framing to count (see
  proxy_buffering: only full buffers or the upstream's end release data), and
- towards an HTTP/1.1 client nginx's chunked filter (ngx_http_chunked_body_filter)
  frames each output buffer as one chunk and ends the body with the terminal chunk when
  the upstream's FIN completes it; a hop that gave up (`HopClose`, e.g. idle_reaper's
  read timeout) ends it without one.

Placement: client side of `proxy_buffering` (which then sees the upstream's
close-delimited body) and upstream side of `gzip_encoding` (which checks the client's
HTTP/1.1, `gzip_http_version`). Not modelled: nginx opens a new upstream connection for
the client's next keep-alive request; the middlebox has one upstream connection per
client connection, so the rewritten response says `Connection: close` and the client
opens a new connection instead. Responses with a Content-Length, or already chunked,
pass byte for byte; so does everything after an OPAQUE piece (a tunnel, malformed bytes).
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import ClassVar

from faults._lib.hop_close import is_hop_close
from faults._lib.items import joined_chunk
from faults._lib.match import HttpMatched
from middlebox.core.fault import Fault
from middlebox.core.http1 import (
    LAST_CHUNK_BYTES,
    Head,
    Piece,
    PieceKind,
    build_head,
    encode_chunk,
    rebuilt_head,
)
from middlebox.core.stream import DOWN, UP, Chunk, Direction, Item

# Fields that belong to the client's connection, not the upstream's (RFC 9110 §7.6.1).
HOP_BY_HOP = ("Connection", "Keep-Alive", "TE", "Upgrade", "Proxy-Connection")


@dataclass
class Http10Upstream(HttpMatched, Fault):
    """Send requests to the upstream as HTTP/1.0; chunk its close-delimited answers."""

    name: ClassVar[str] = "http10_upstream"

    _held_head: Head | None = field(init=False, repr=False, default=None)
    _held_body: bytearray = field(init=False, repr=False, default_factory=bytearray)
    _rechunking: bool = field(init=False, repr=False, default=False)

    def changes(self) -> frozenset[Direction]:
        return frozenset({Direction.UPSTREAM, Direction.DOWNSTREAM})

    def on_item(self, item: Item, now: float) -> list[Item]:
        pieces = self.observe(item, now)
        if item.direction is UP:
            parts = [self._request_piece(piece, now) for piece in pieces]
            return [*joined_chunk(UP, parts), *([] if isinstance(item, Chunk) else [item])]
        if is_hop_close(item) and self._rechunking:
            # A hop gave up: the body ends without its terminal chunk.
            self._rechunking = False
            self.report(now, "unterminated", reason="hop_close")
            return [item]
        parts = [self._response_piece(piece, now) for piece in pieces]
        return [*joined_chunk(DOWN, parts), *([] if isinstance(item, Chunk) else [item])]

    def _request_piece(self, piece: Piece, now: float) -> bytes:
        head = piece.head
        if piece.kind is PieceKind.HEAD and head is not None:
            new = replace(head, version="HTTP/1.0")
            if head.is_chunked and not piece.end_of_message:
                # proxy_request_buffering: the whole body first, then a Content-Length.
                self._held_head = new
                self._held_body = bytearray()
                return b""
            self.report(now, "rewrote_request", request=piece.message, version=head.version)
            return _upstream_head(new)
        if self._held_head is None:
            return piece.data
        if piece.kind is PieceKind.BODY:
            self._held_body += piece.data
        if not piece.end_of_message:
            return b""  # the client's chunk framing does not go on
        head, body = self._held_head, bytes(self._held_body)
        self._held_head = None
        self.report(now, "rewrote_request", request=piece.message, dechunked=len(body))
        dechunked = rebuilt_head(head, remove_headers=("Transfer-Encoding",))
        return _upstream_head(dechunked, [("Content-Length", str(len(body)))]) + body

    def _response_piece(self, piece: Piece, now: float) -> bytes:
        head = piece.head
        if piece.kind is PieceKind.HEAD and head is not None:
            if self._close_delimited(piece, head):
                self._rechunking = True
                self.report(now, "rechunking", response=piece.message, byte=piece.offset)
                # nginx writes its own status line, always `HTTP/1.1` toward an HTTP/1.1
                # client (ngx_http_header_filter): an upstream that answered `HTTP/1.0`
                # (aiohttp echoes the request's version; uvicorn says 1.1) must not reach
                # the client as a 1.0 response with chunked framing, which RFC 9112 §6.1
                # makes faulty framing (Chromium then reads the chunk-size lines as body).
                kept = rebuilt_head(
                    replace(head, version="HTTP/1.1"), remove_headers=("Connection", "Keep-Alive")
                )
                return build_head(kept, [("Transfer-Encoding", "chunked"), ("Connection", "close")])
            return piece.data
        if not self._rechunking:
            return piece.data
        data = encode_chunk(piece.data) if piece.data else b""
        if piece.end_of_message:
            # The upstream's FIN completed the body (RFC 9112 §6.3 item 8).
            self._rechunking = False
            self.report(now, "terminated", response=piece.message)
            data += LAST_CHUNK_BYTES
        return data

    def _close_delimited(self, piece: Piece, head: Head) -> bool:
        if head.is_interim or piece.end_of_message or head.is_chunked:
            return False
        if head.content_length is not None:
            return False
        request = self.request(piece.message)
        return request is not None and request.head.version == "HTTP/1.1"


def _upstream_head(head: Head, extra: list[tuple[str, str]] | None = None) -> bytes:
    """The head nginx sends upstream: the client's hop-by-hop fields gone, then
    `Connection: close` (and `extra`) appended."""
    kept = rebuilt_head(head, remove_headers=HOP_BY_HOP)
    return build_head(kept, [("Connection", "close"), *(extra or [])])
