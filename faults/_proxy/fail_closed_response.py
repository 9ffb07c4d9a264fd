"""fail_closed_response: a response that cannot be framed is answered as nginx would.

The response-side twin of `fail_closed`. With an HTTP-aware fault in the path, an
upstream response the framer refuses must not reach the faults or the client as raw bytes:
they would skip every SSE and HTTP fault. nginx (ngx_http_upstream.c, ngx_http_proxy_module.c)
answers by where the bad bytes are:

- in the head (a malformed field line, CL and TE together, an invalid Content-Length):
  "upstream sent invalid header", `NGX_HTTP_UPSTREAM_INVALID_HEADER`; invalid_header is not
  in the default `proxy_next_upstream` (error timeout), so the request is finalized with
  502 and nginx's page. Nothing of that head reaches the client: nginx parses the whole
  head before it sends its own.
- in the status line (not `HTTP/1.x NNN`): nginx logs "upstream sent no valid HTTP/1.0
  header", takes the response for HTTP/0.9 and relays its bytes raw, closing after
  (`ngx_http_proxy_process_status_line`). So does this stage: it steps aside.
- in the body, after the head went on (a bad chunk-size line: "upstream sent invalid
  chunked response", the chunked filter's NGX_ERROR): the header was sent, so
  `ngx_http_upstream_finalize_request` cannot answer; it closes the client connection
  (no terminal chunk) and the upstream one. The body bytes before the bad ones went on.
- after a `Connection: close` response: "upstream sent data after final chunk" or more
  than Content-Length; nginx drops those bytes and the upstream connection's keep-alive.
- no complete head at all: the upstream closes (or resets) with a request outstanding
  before the head's end. `ngx_http_upstream_process_header` reads 0 bytes ("upstream
  prematurely closed connection while reading response header from upstream") or a
  recv() error and calls `ngx_http_upstream_next(NGX_HTTP_UPSTREAM_FT_ERROR)`; with no
  other server to try it finalizes with 502 and nginx's page. The partial head it held
  never reaches the client. A client that already left (its FIN went upstream) gets
  nothing: nginx finalized that request (499) before the upstream's close.

nginx keeps the client connection after a 502 and dials the upstream again for the next
request; middlebox has one upstream connection per client connection, so it closes both
after the 502 (`Connection: close` on the page says so).

The stage sits server-most, reads the response stream's one framing pass where the upstream's
bytes enter (`Http1Framer.refusal`, no framer of its own) and holds the bytes of an
incomplete head or chunk-size line until the framer has judged them, as nginx reads a whole
head before it sends one. With no HTTP-aware fault in the path nothing is framed and the
stage steps aside at once (pass-through frames nothing).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import ClassVar

from middlebox.core.fault import FaultContext, StageEvent
from middlebox.core.framed import ItemPass
from middlebox.core.http1 import Http1Framer, Refusal
from middlebox.core.responses import error_response
from middlebox.core.stream import DOWN, UP, Chunk, Direction, Eof, Item

from .refusing import RefusingStage

# ngx_http_upstream_next: NGX_HTTP_UPSTREAM_FT_INVALID_HEADER finalizes with Bad Gateway.
INVALID_HEADER_STATUS = 502
# ngx_http_upstream_next: NGX_HTTP_UPSTREAM_FT_ERROR (a close or recv() error while
# reading the head) with no next upstream finalizes with Bad Gateway too.
PREMATURE_CLOSE_STATUS = 502
PREMATURE_CLOSE_MESSAGE = (
    "upstream prematurely closed connection while reading response header from upstream"
)


@dataclass
class FailClosedResponse(RefusingStage):
    """Answer an upstream response the framer refuses as nginx does (502 before its head
    reached the client, a close after it) and close both sides."""

    name: ClassVar[str] = "fail_closed_response"
    stage_event: ClassVar[StageEvent | None] = StageEvent.UNFRAMEABLE_RESPONSE

    # The request stream where it leaves for the upstream: is a request outstanding?
    _requests: Http1Framer | None = field(init=False, repr=False, default=None)
    _client_left: bool = field(init=False, repr=False, default=False)
    _held: bytearray = field(init=False, repr=False, default_factory=bytearray)

    def bind(self, context: FaultContext) -> None:
        super().bind(context)
        position = context.framing
        if position is not None:
            self._framer = position.down.http
            self._requests = position.up.http
            if self._framer is not None:
                # nearly every read is framed whole with no refusal: the pipeline passes
                # the stage over for it without a call (`_WholeReads`)
                self.body_aside = _WholeReads(self)

    def on_item(self, item: Item, now: float) -> list[Item]:
        if item.direction is UP and not isinstance(item, Chunk) and not self.connection_closed:
            self._client_left = True  # nginx finalizes the request: no answer after this
        settled = self.settled(item, DOWN)
        if settled is not None:
            return settled
        framer = self._framer
        assert framer is not None  # settled() answered for no framer
        if not isinstance(item, Chunk):
            if self._head_cut_short(framer):
                return self._premature_close(framer, now)
            # The end of the stream: the framer passed what it held on (as OPAQUE).
            return [*self._release(framer.offset), item]
        refusal = framer.refusal
        if refusal is None:
            if not self._held and framer.offset == self._passed + len(item.data):
                self._passed = framer.offset
                return [item]  # the usual read: every byte framed, nothing to hold
            self._held += item.data
            return self._release(framer.offset)
        self._held += item.data
        return self._refuse(refusal, now)

    def _head_cut_short(self, framer: Http1Framer) -> bool:
        """At the upstream's close or reset (the framer has had its end): no complete head
        of the response to an outstanding request came, and the client is still there."""
        if self._client_left or framer.tunnel or framer.degraded is not None:
            return False
        if framer.truncated and not framer.in_body:
            return True  # part of a head (its bytes are held here), then the end
        requests = self._requests
        if requests is None or not framer.message_complete:
            return False
        # No byte of the next response: did a whole request head go up for it to answer?
        sent = requests.message + (1 if requests.in_body else 0)
        return not requests.tunnel and sent > framer.message

    def _premature_close(self, framer: Http1Framer, now: float) -> list[Item]:
        held = len(self._held)
        self._held.clear()  # nginx parses a whole head before it sends one: none of it
        self._passed = framer.offset
        self.connection_closed = True
        self.report(
            now,
            "refused",
            status=PREMATURE_CLOSE_STATUS,
            reason="premature_close",
            message=PREMATURE_CLOSE_MESSAGE,
            byte=framer.offset - held,
        )
        return [Chunk(DOWN, error_response(PREMATURE_CLOSE_STATUS)), Eof(DOWN), Eof(UP)]

    def _release(self, upto: int) -> list[Item]:
        """The held bytes before stream offset `upto`, as one chunk."""
        count = upto - self._passed
        if count <= 0:
            return []
        data = bytes(self._held[:count])
        del self._held[:count]
        self._passed = upto
        return [Chunk(DOWN, data)]

    def _refuse(self, refusal: Refusal, now: float) -> list[Item]:
        details = {"reason": refusal.reason, "message": refusal.message, "byte": refusal.at}
        if refusal.start_line:
            # nginx's HTTP/0.9 fallback: the bytes go on raw; the upstream's close ends it.
            self.report(now, "relayed_raw", **details)
            out = self._release(self._passed + len(self._held))
            self._framer = None  # steps aside
            return out
        out = self._release(refusal.at)  # what was framed before the bad bytes
        self._held.clear()
        if refusal.status is None:
            self.report(now, "discarded", status=None, **details)
            self._discarding = True  # after a Connection: close response: dropped
            return out
        self.connection_closed = True
        if refusal.at == refusal.offset and self._passed == refusal.offset:
            # Nothing of the refused response reached the client: nginx's 502.
            self.report(now, "refused", status=INVALID_HEADER_STATUS, **details)
            return [*out, Chunk(DOWN, error_response(INVALID_HEADER_STATUS)), Eof(DOWN), Eof(UP)]
        self.report(now, "closed", status=None, **details)
        return [*out, Eof(DOWN), Eof(UP)]  # its head went on: only the close


class _WholeReads(ItemPass):
    """fail_closed_response passed over for a response read the framer took whole with no
    refusal and nothing held here: `on_item`'s usual read (it counts the bytes as passed
    on and hands the read on); anything else (an end, a refusal, held bytes, a closed or
    discarding stage) reaches `on_item`."""

    __slots__ = ("stage",)

    def __init__(self, stage: FailClosedResponse) -> None:
        self.stage = stage

    def passes(self, item: Item, now: float) -> bool:
        if item.direction is not DOWN or type(item) is not Chunk:
            return False
        stage = self.stage
        framer = stage._framer
        if (
            framer is None
            or framer.refusal is not None
            or stage.connection_closed
            or stage._discarding
            or stage._held
        ):
            return False
        offset = framer.offset
        if offset != stage._passed + len(item.data):
            return False
        stage._passed = offset
        return True

    def skips(self, direction: Direction) -> bool:
        stage = self.stage
        framer = stage._framer
        return (
            direction is DOWN
            and framer is not None
            and framer.refusal is None
            and not stage.connection_closed
            and not stage._discarding
            and not stage._held
            and framer.offset == stage._passed
        )

    def skipped(self, size: int, body: int, whole_chunks: bool, now: float) -> None:
        self.stage._passed += size
