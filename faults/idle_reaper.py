"""idle_reaper: a proxy's read timeout between two bytes from the upstream.

Imitates nginx's `proxy_read_timeout` (default 60s), which the ngx_http_proxy_module
docs define as "a timeout for reading a response from the proxied server. The timeout
is set only between two successive read operations, not for the transmission of the
whole response": nginx arms it once the request is sent and re-arms it on every read,
so any byte, an SSE keep-alive comment (`: ping`) included, resets the clock. An AWS
ALB's idle timeout (60s) and Cloudflare's proxy read timeout (100s) cut a silent
stream the same way; vLLM added `--sse-keep-alive-interval` for exactly this
(vllm-project/vllm#47647, #51034).

When it fires:
- before any byte of the response head reached the client, nginx answers
  `504 Gateway Time-out` (`before_headers: 504`; an ALB also answers 504; `502` and
  `reset` are the other shapes seen in the field; Cloudflare's own 524 is not
  reproduced) and closes the upstream connection;
- after the head went out, nginx can only close: `ngx_http_upstream_finalize_request`
  turns the timeout into `NGX_ERROR` because `u->header_sent`, so a chunked body ends
  without its terminal chunk (`after_headers: close`), or `reset` for a box that
  aborts. The upstream connection is closed (or reset) as well. The FIN toward the
  client is a `HopClose`, so the faults on the client side (proxy_buffering,
  gzip_encoding, http10_upstream) end the response as nginx's timeout path does and
  not as the upstream's own end would;
- Caddy 2.6's `reverse_proxy` with a transport `read_timeout` ends a started chunked
  response cleanly instead: Go's http server writes the terminal chunk when the
  handler returns, so the client sees a complete HTTP message without the SSE
  `[DONE]` (`after_headers: finish`, measured by `make calibrate`); mid-chunk it can
  only close.

nginx's timers are lazy (`lazy: 300ms` in the nginx presets): `ngx_event_add_timer` keeps
an armed timer when the new expiry is less than NGX_TIMER_LAZY_DELAY (300 ms) from the
old one, so reads closer together than that do not move it. A stream that goes quiet
within 300 ms of the timer's last move times out up to 300 ms early: measured by `make
calibrate` (timeout-after-head: the real nginx fired 1.003 s after the head, not 1.2 s
after the last of the frames that followed it over 200 ms).

Each HTTP exchange on a keep-alive connection is timed on its own: the clock runs from
the moment the request is complete until its response is, and only for requests that
`match` selects.

Inside a response's body it has only its read timer and its count of the bytes to keep, so
it steps aside for the body (`Fault.body_aside`): the pipeline keeps its place in the
response stream, and each read passed over re-arms the timer at its own time, as nginx does
per read (`_BodyReads`).
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field
from typing import ClassVar, Literal

from faults._lib.checks import check_choice, check_positive
from faults._lib.ends import (
    BeforeHeaders,
    ErrorPage,
    ResponseProgress,
    end_response,
    gateway_answer,
)
from faults._lib.hop_close import HopClose
from faults._lib.match import RESPONSES, HttpMatched
from middlebox.core.fault import Fault, FaultContext, Seconds
from middlebox.core.framed import BodyPass, BodyRun, Framed, FramedStream
from middlebox.core.stream import DOWN, UP, Chunk, Direction, Eof, Item, Reset

AfterHeaders = Literal["close", "reset", "finish"]


@dataclass
class IdleReaper(HttpMatched, Fault):
    """End an exchange when the upstream sends nothing for `timeout` seconds."""

    name: ClassVar[str] = "idle_reaper"

    timeout: Seconds = 60.0
    before_headers: BeforeHeaders = "504"
    after_headers: AfterHeaders = "close"
    # a read re-arms the timer only when that moves it by at least this (nginx: 300 ms)
    lazy: Seconds = 0.0
    # whose error page answers before the head: nginx's, or Apache's 502 Proxy Error
    page: ErrorPage = "nginx"

    _waiting: deque[int] = field(init=False, repr=False, default_factory=deque)
    _last: float = field(init=False, repr=False, default=0.0)
    _progress: ResponseProgress = field(init=False, repr=False, default_factory=ResponseProgress)
    _closed: bool = field(init=False, repr=False, default=False)

    def bind(self, context: FaultContext) -> None:
        super().bind(context)
        framing = context.framing
        if framing is not None:
            self.body_aside = _BodyReads(self, framing.publish.get(Direction.DOWNSTREAM))

    def changes(self) -> frozenset[Direction]:
        return RESPONSES  # its answer or early end, when it fires

    def publishes(self) -> frozenset[Direction]:
        return RESPONSES  # it forwards pieces as they came

    def __post_init__(self) -> None:
        check_positive("timeout", self.timeout)
        check_positive("lazy", self.lazy, allow_zero=True)
        check_choice("page", self.page, ErrorPage)
        if self.page == "apache" and self.before_headers != "502":
            raise ValueError("page: apache is Apache's 502 Proxy Error: before_headers must be 502")
        check_choice("before_headers", self.before_headers, BeforeHeaders)
        check_choice("after_headers", self.after_headers, AfterHeaders)

    def on_item(self, item: Item, now: float) -> list[Item]:
        if self._closed:
            return []  # both sides were ended when it fired; nothing more goes through
        pieces = self.observe(item, now)
        if item.direction is Direction.UPSTREAM:
            for piece in pieces:
                if piece.end_of_message and self.selected(piece.message) is not None:
                    if not self._waiting:
                        self._last = now  # nginx arms the timer once the request is sent
                    self._waiting.append(piece.message)
            if not isinstance(item, Chunk):
                self._waiting.clear()  # the client left: nginx finalizes the request
            return [item]
        if isinstance(item, Chunk):
            self._read(now)
            held = self._flow.responses.held
            for message in self._progress.feed(len(item.data), pieces, held):
                if self._waiting and self._waiting[0] == message:
                    self._waiting.popleft()
        else:
            self._waiting.clear()  # the upstream ended the connection itself
        return [self.forwarded(item)]

    def _read(self, now: float) -> None:
        # nginx compares whole milliseconds (a move of exactly 300 ms counts); a
        # virtual clock's float sums may miss 0.3 by 1e-16, hence the epsilon
        if now - self._last >= self.lazy - 1e-9:
            self._last = now  # any byte re-arms the read timer, heartbeats included

    def deadline(self) -> float | None:
        if self._closed or not self._waiting:
            return None
        return self._last + self.timeout

    def on_deadline(self, now: float) -> list[Item]:
        self._closed = True
        self.body_aside = None  # it swallows whatever comes after: it sees every item
        message = self._waiting[0]
        progress = self._progress
        end: str
        if not progress.started:
            out = gateway_answer(self.before_headers, self.page)
            end = self.before_headers
        elif self.after_headers == "reset":
            out = [Reset(DOWN), Reset(UP)]
            end = "reset"
        elif self.after_headers == "finish":
            out = [*end_response("fin", progress), Eof(UP)]
            end = "finish" if len(out) == 3 else "close"
            out[-2] = HopClose(DOWN)
        else:
            out = [HopClose(DOWN), Eof(UP)]
            end = "close"
        self.report(
            now,
            "timed_out",
            response=message,
            phase="after_headers" if progress.started else "before_headers",
            end=end,
            byte=progress.offset,
            body_byte=progress.body,
            idle_since=self._last,
        )
        return self.wrote(out)


class _BodyReads(BodyPass):
    """idle_reaper's place in the response stream while the pipeline passes it over for a
    body: each read passed over still re-arms its timer at that read's own time (with
    `lazy`, only the reads that move it far enough do) and is counted in its progress
    (the byte and body byte its report gives), and its pieces go on as they came. A
    Content-Length body's last bytes pass it too (`ends`): the answer is complete, so
    its request stops waiting, as when it is given the read."""

    __slots__ = ("reaper",)

    def __init__(self, reaper: IdleReaper, publish: FramedStream | None) -> None:
        super().__init__(Direction.DOWNSTREAM, reaper._flow.responses, publish, ends=True)
        self.reaper = reaper

    def passed(self, framed: list[Framed], run: BodyRun, now: float) -> None:
        reaper = self.reaper
        reaper._read(now)
        progress = reaper._progress
        if not run.ends:
            progress.feed_body(run.end - run.start, run.body, run.whole_chunks)
        else:  # the response's last bytes (`ends`): its request stops waiting
            waiting = reaper._waiting
            for message in progress.feed(run.end - run.start, [e.piece for e in framed], 0):
                if waiting and waiting[0] == message:
                    waiting.popleft()
        self.publish_passed(framed, run)

    def skips(self, direction: Direction) -> bool:
        # With `lazy`, which reads re-arm the timer depends on every read's time, not
        # only the last one's: those are passed read by read.
        return not self.reaper.lazy and super().skips(direction)

    def skipped(self, size: int, body: int, whole_chunks: bool, now: float) -> None:
        self.reaper._read(now)
        self.reaper._progress.feed_body(size, body, whole_chunks)
        super().skipped(size, body, whole_chunks, now)
