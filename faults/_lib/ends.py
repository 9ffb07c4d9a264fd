"""How a proxy ends a response it gives up on, shared by the HTTP end faults (pure).

- `gateway_answer`: what the client and the upstream get when a proxy gives up
  *before* any byte of the response head reached the client: nginx's error page
  (`504 Gateway Time-out` from `ngx_http_upstream_next` on `NGX_HTTP_UPSTREAM_FT_TIMEOUT`,
  `502 Bad Gateway` on an upstream error) with `Connection: close`, or a reset; either
  way the upstream connection is closed (`ngx_http_upstream_finalize_request` →
  `ngx_close_connection`).
- `end_response`: what the client gets when the proxy gives up *after* the head went
  out: nginx can no longer change the status, so `ngx_http_upstream_finalize_request`
  turns the error into `NGX_ERROR` (`u->header_sent`) and closes the connection without
  the terminal `0\\r\\n\\r\\n` chunk: a truncated chunked body. `fin` instead completes
  the HTTP message when the bytes so far end between chunks.
- `ResponseProgress`: where the response in flight stands on the wire (started?
  chunked? between chunks?), fed with `Http1Framer` pieces.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from middlebox.core.http1 import (
    LAST_CHUNK_BYTES,
    Piece,
    PieceKind,
)
from middlebox.core.responses import apache_proxy_error, error_response
from middlebox.core.stream import DOWN, UP, Chunk, Eof, Item, Reset

BeforeHeaders = Literal["504", "502", "reset"]
"""The answer before the response head: nginx's 504 or 502 page, or an RST both ways."""

ResponseEnd = Literal["truncated_chunked", "fin", "rst"]
"""How a started response ends: FIN without the terminal chunk, a complete message, an RST."""


ErrorPage = Literal["nginx", "apache"]


def gateway_answer(kind: BeforeHeaders, page: ErrorPage = "nginx") -> list[Item]:
    """The client gets the error page and a FIN (or an RST); the upstream is closed the
    same way. nginx's page says `Connection: close`, as nginx's does after a gateway
    error; Apache's is its 502 Proxy Error page."""
    if kind == "reset":
        return [Reset(DOWN), Reset(UP)]
    answer = apache_proxy_error() if page == "apache" else error_response(int(kind))
    return [Chunk(DOWN, answer), Eof(DOWN), Eof(UP)]


def end_response(kind: ResponseEnd, progress: ResponseProgress) -> list[Item]:
    """The items that end a started response toward the client.

    `fin` on a chunked response whose bytes so far end between chunks sends the
    terminal chunk first, so the HTTP message is complete and only the SSE stream lacks
    its `[DONE]`; mid-chunk it cannot complete the message and closes like
    `truncated_chunked`. On a Content-Length or read-until-close body `fin` and
    `truncated_chunked` are both a plain FIN.
    """
    if kind == "rst":
        return [Reset(DOWN)]
    if kind == "fin" and progress.chunked and progress.between_chunks:
        return [Chunk(DOWN, LAST_CHUNK_BYTES), Eof(DOWN)]
    return [Eof(DOWN)]


@dataclass
class ResponseProgress:
    """The response in flight on one connection, as far as the bytes forwarded show.

    `message` is the index of the response in progress (or the next one); `started`
    says a byte of it has arrived; `between_chunks` that the bytes so far end after a
    head or a whole chunk (nothing of a chunk-size line or chunk data pending);
    `offset` counts the direction's wire bytes; `body` the current body's bytes.
    """

    message: int = 0
    started: bool = False
    chunked: bool = False
    between_chunks: bool = True
    offset: int = 0
    body: int = 0

    def feed(self, size: int, pieces: list[Piece], held: int) -> list[int]:
        """Account `size` new wire bytes whose completed pieces are `pieces` (`held`
        bytes remain inside the framer); returns the indices of responses completed."""
        done: list[int] = []
        self.offset += size
        if size:
            self.started = True
        for piece in pieces:
            if piece.kind is PieceKind.HEAD and piece.head is not None:
                self.chunked = piece.head.is_chunked
            elif piece.kind is PieceKind.BODY:
                self.body += len(piece.data)
            self.between_chunks = piece.kind in (PieceKind.HEAD, PieceKind.CHUNK_TRAILER_CRLF)
            if piece.end_of_message:
                done.append(piece.message)
                self.message = piece.message + 1
                self.started = False
                self.chunked = False
                self.body = 0
                self.between_chunks = True
        if held:
            self.started = True
            self.between_chunks = False
        return done

    def feed_body(self, size: int, body: int, whole_chunks: bool) -> None:
        """`feed` for `size` wire bytes that are all body of the response under way (data
        and chunk lines, no head, not its end, nothing held: `BodyRun`), `body` of them
        data: the same state, counted without walking the pieces."""
        if size:
            self.offset += size
            self.started = True
            self.body += body
            self.between_chunks = whole_chunks
