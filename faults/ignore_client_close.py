"""ignore_client_close: the proxy keeps the upstream stream going after the client left.

Imitates proxies that do not watch the client socket while they relay a response, so
the server keeps generating (and billing) tokens nobody reads:

- `until: write_fails` (Apache httpd's mod_proxy, HAProxy without `option
  abortonclose`, nginx with `proxy_ignore_client_abort on`): the client's close is
  only discovered when writing to it fails. After a client RST the next write fails
  at once (ECONNRESET/EPIPE). After a client FIN the first write still succeeds (the
  kernel queues it) but draws an RST from the client's closed socket (RFC 9293
  §3.10.7.1), so the second write fails. The proxy then closes the upstream
  connection: with an RST by default, since Linux sends RST when a socket with unread
  data is closed (RFC 2525 §2.17) and the upstream is mid-stream.
  `rst_delay` is how long after that first write the client's RST is back: a round
  trip, plus however long the proxy's kernel holds the write (HAProxy sends with
  MSG_MORE, so Linux corks it until a full segment or 200 ms; measured on HAProxy
  2.6 by `make calibrate`: the upstream learned 224 ms after the client's FIN, not
  two token writes later). Writes before then still succeed; the first one at or
  after it fails. 0 (default) makes the second write fail, whatever its time.
  `cork` models HAProxy's cancellation as measured on a stream shape grid: the first
  write after the client's FIN is corked (MSG_MORE) and leaves when the cork releases,
  `cork` seconds later; writes up to that moment join the corked segment and succeed,
  and the first write after it fails, since the client's RST is back by then. Unlike
  `rst_delay`, a write that falls exactly on the release (a frame period that divides
  200 ms) still succeeds: "the write after the first corked write fails".
- `until: never`: a proxy that drains the upstream to its end (a cache filling an
  entry, `proxy_ignore_client_abort on` with buffering); when the upstream ends, its
  end is passed on and only then is the client's close passed to the upstream.

Everything the upstream sends after the client's close is swallowed and counted, so
the journal shows how many bytes were generated into the void.

Only a close while an answer is owed is ignored: every one of these proxies closes an
idle keep-alive client connection at once (nginx's `ngx_http_set_keepalive`, HAProxy's
and Apache's keep-alive handling), and an upstream that was never asked anything, or
has answered all it was asked, has nothing to drain. So the fault reads the HTTP
exchange at its place: a client close when every request that passed it has had its
whole response (or none passed) goes on as it came, unreported. What it cannot frame
(a tunnel, bytes that are not HTTP/1.1) counts as owed.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import ClassVar, Literal

from faults._lib.checks import check_choice, check_positive
from faults._lib.match import HttpFlow
from middlebox.core.fault import Fault, FaultContext, Seconds
from middlebox.core.http1 import PieceKind
from middlebox.core.stream import DOWN, UP, Chunk, Eof, Item, Reset, is_end

Until = Literal["write_fails", "never"]
CloseWith = Literal["rst", "fin"]


@dataclass
class IgnoreClientClose(Fault):
    """Swallow the client's FIN/RST; drain the upstream until a write fails or it ends."""

    name: ClassVar[str] = "ignore_client_close"

    until: Until = "write_fails"
    close_with: CloseWith = "rst"
    rst_delay: Seconds = 0.0
    cork: Seconds = 0.0

    _client_end: Item | None = field(init=False, repr=False, default=None)
    _delivered: int = field(init=False, repr=False, default=0)
    _drained: int = field(init=False, repr=False, default=0)
    _writes: int = field(init=False, repr=False, default=0)
    _first_write_at: float = field(init=False, repr=False, default=0.0)
    _upstream_closed: bool = field(init=False, repr=False, default=False)
    _client_closed: bool = field(init=False, repr=False, default=False)
    _flow: HttpFlow = field(init=False, repr=False)
    _owed: int = field(init=False, repr=False, default=0)  # requests passed - answers ended
    _unframed: bool = field(init=False, repr=False, default=False)

    def __post_init__(self) -> None:
        check_choice("until", self.until, Until)
        check_choice("close_with", self.close_with, CloseWith)
        check_positive("rst_delay", self.rst_delay, allow_zero=True)
        check_positive("cork", self.cork, allow_zero=True)
        if self.cork and self.rst_delay:
            raise ValueError("set rst_delay or cork, not both")

    def bind(self, context: FaultContext) -> None:
        super().bind(context)
        self._flow = HttpFlow(context.framing)

    def reads_http(self) -> bool:
        return True  # whether an answer is owed when the client closes

    def leave(self) -> None:
        self._flow.requests.close()
        self._flow.responses.close()

    @property
    def _answer_owed(self) -> bool:
        flow = self._flow
        return self._unframed or self._owed > 0 or flow.requests.held + flow.responses.held > 0

    def _follow(self, item: Item) -> None:
        """Count the requests that pass and the answers that end, at this place."""
        for piece in self._flow.feed(item):
            if piece.kind is PieceKind.OPAQUE:
                self._unframed = True
            elif piece.head is not None and piece.head.is_request:
                self._owed += 1
            elif piece.end_of_message and item.direction is DOWN:
                self._owed -= 1

    def on_item(self, item: Item, now: float) -> list[Item]:
        self._follow(item)
        if item.direction is UP:
            return self._from_client(item, now)
        if self._client_end is None:
            if isinstance(item, Chunk):
                self._delivered += len(item.data)
            return [item]
        if self._upstream_closed or self._client_closed:
            return []
        if isinstance(item, Chunk):
            return self._write_into_the_void(item, now)
        self._client_closed = True
        self.report(now, "upstream_ended", drained=self._drained, end=type(item).__name__)
        passed_on: list[Item] = [item]
        if isinstance(item, Eof):
            passed_on.append(self._client_end)
        return passed_on

    def _from_client(self, item: Item, now: float) -> list[Item]:
        if self._client_end is not None:
            return []
        if not is_end(item) or not self._answer_owed:
            return [item]  # an idle connection's close: nothing to drain
        self._client_end = item
        kind = "rst" if isinstance(item, Reset) else "fin"
        self.report(now, "client_close_ignored", kind=kind, offset=self._delivered)
        return []

    def _write_into_the_void(self, chunk: Chunk, now: float) -> list[Item]:
        self._drained += len(chunk.data)
        self._writes += 1
        if self._writes == 1:
            self._first_write_at = now
        failing_write = 1 if isinstance(self._client_end, Reset) else 2
        if self.until == "never" or self._writes < failing_write:
            return []
        if failing_write == 2 and now < self._first_write_at + self.rst_delay:
            return []  # the RST drawn by the first write is not back yet
        if failing_write == 2 and now <= self._first_write_at + self.cork:
            return []  # still corked with the first write: it leaves with it
        self._upstream_closed = True
        self.report(now, "write_failed", drained=self._drained, writes=self._writes)
        closing: list[Item] = [Reset(UP) if self.close_with == "rst" else Eof(UP)]
        if isinstance(self._client_end, Eof):
            closing.append(Eof(DOWN))  # the proxy closes its side of the client connection
        return closing
