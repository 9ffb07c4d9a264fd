"""max_concurrent_streams: a server's SETTINGS_MAX_CONCURRENT_STREAMS, so the client queues.

An HTTP/2 server announces how many streams a client may have open at once (RFC 9113
§6.5.2; nginx's `http2_max_concurrent_streams`, 128 by default; some gateways and CDNs
announce far fewer, and a few announce 1). A client must not open more (§5.1.2): browsers,
curl's nghttp2 and httpcore hold the extra requests until a stream ends, so the later tabs'
answers wait, as they would behind HTTP/1.1's per-origin connection cap.

- `limit: N` (>= 1): the value announced in the server's preface.

HTTP/2 only; on an HTTP/1.1 connection it passes everything through.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import ClassVar

from middlebox.core.fault import Fault
from middlebox.core.h2_faults import SETTINGS_MAX_CONCURRENT_STREAMS, H2Action, H2Fault


@dataclass
class MaxConcurrentStreams(H2Fault, Fault):
    """Announce SETTINGS_MAX_CONCURRENT_STREAMS = `limit`; report when the limit is reached."""

    name: ClassVar[str] = "max_concurrent_streams"

    limit: int = 1

    _open: set[int] = field(init=False, repr=False, default_factory=set)
    _reported: bool = field(init=False, repr=False, default=False)

    def __post_init__(self) -> None:
        if self.limit < 1:
            raise ValueError(f"limit must be at least 1, got {self.limit}")

    def h2_settings(self) -> dict[int, int]:
        return {SETTINGS_MAX_CONCURRENT_STREAMS: self.limit}

    def on_connection_open(self, now: float) -> list[H2Action]:
        self.report(now, "announced", limit=self.limit)
        return []

    def on_stream_open(self, stream_id: int, now: float) -> list[H2Action]:
        self._open.add(stream_id)
        if len(self._open) >= self.limit and not self._reported:
            # From here a client that wants another stream must wait for one to end.
            self._reported = True
            self.report(now, "limit_reached", streams=sorted(self._open))
        return []

    def on_stream_close(self, stream_id: int, now: float) -> list[H2Action]:
        self._open.discard(stream_id)
        return []
