"""Per-connection limits an HTTP/2 client cannot talk its way past (pure): the rapid-reset
budget (CVE-2023-44487) the shell's session (shell/h2_streams.py) consults.

A rapid reset opens streams and resets them at once (HEADERS, then RST_STREAM): each reset
frees its stream's slot under SETTINGS_MAX_CONCURRENT_STREAMS, so the stream limit alone
never stops the work behind the streams. The servers patched in October 2023 count the
client's resets per connection and end a connection that resets faster than any real client:
nghttp2 1.57 with a token bucket (`nghttp2_option_set_stream_reset_rate_limit`: a burst of
1000 resets, 33 more per second), Go's x/net/http2 (0.17) with GOAWAY ENHANCE_YOUR_CALM once
more than 4 x its stream limit wait on early-reset streams ("too_many_early_resets"). The
session does both halves: this budget decides when, and it answers GOAWAY ENHANCE_YOUR_CALM
and closes; it also never dials upstream for a stream that was reset before its turn came.
"""

from __future__ import annotations

from dataclasses import dataclass, field

# nghttp2's defaults (lib/nghttp2_session.h: NGHTTP2_DEFAULT_STREAM_RESET_BURST and
# NGHTTP2_DEFAULT_STREAM_RESET_RATE): a browser cancelling a page's requests resets tens of
# streams, a rapid reset thousands a second.
RESET_BURST = 1000
RESET_RATE = 33.0  # resets per second the budget regains, up to RESET_BURST
# RFC 9113 §7: "the endpoint is exhibiting behavior that might be generating excessive load".
ENHANCE_YOUR_CALM = 0xB


@dataclass
class ResetBudget:
    """A token bucket of client RST_STREAMs for one connection: `burst` at first, `rate` more
    per second of `now` (the session's clock), never more than `burst`."""

    burst: int = RESET_BURST
    rate: float = RESET_RATE
    resets: int = 0  # every client reset counted, over the limit or not
    _tokens: float = field(init=False)
    _last: float | None = field(default=None, init=False)

    def __post_init__(self) -> None:
        if self.burst < 1 or self.rate < 0:
            raise ValueError("a reset budget needs a burst of at least 1 and a rate >= 0")
        self._tokens = float(self.burst)

    def spend(self, now: float) -> bool:
        """One client RST_STREAM at `now`: True while within the budget, False once the
        connection resets faster than it allows (the session answers ENHANCE_YOUR_CALM)."""
        self.resets += 1
        if self._last is not None and now > self._last:
            self._tokens = min(float(self.burst), self._tokens + (now - self._last) * self.rate)
        self._last = now if self._last is None else max(now, self._last)
        if self._tokens < 1:
            return False
        self._tokens -= 1
        return True
