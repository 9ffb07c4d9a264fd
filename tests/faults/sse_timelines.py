"""Timelines the SSE-rewriting faults' tests replay (sse_ids, sse_retry, inband_error): one
slow stream at set times, and any stream in any TCP segments for the properties."""

from __future__ import annotations

from faults.testing import TimedItem
from middlebox.core.stream import DOWN, UP, Chunk, Eof
from tests.faults.httpprops import SSE_HEAD, request, resplit, timed


def two_events_and_done(body: list[bytes]) -> list[TimedItem]:
    """`sse_chunks(2)` as a slow server sends it: the head at 20 ms, the two events at 1 s
    and 1.25 s, `[DONE]` with the last chunk at 1.5 s, then the FIN."""
    pieces = [body[0], body[1], body[2] + body[3]]
    head = [(0.0, Chunk(UP, request())), (0.02, Chunk(DOWN, SSE_HEAD))]
    return [*head, *timed(DOWN, pieces, 1.0, 0.25), (1.5, Eof(DOWN))]


def in_segments(wire: bytes, tcp_cuts: list[int]) -> list[TimedItem]:
    """A request, then `wire` in the TCP segments `tcp_cuts` cut it into, from 1 s on,
    10 ms apart."""
    return [(0.0, Chunk(UP, request())), *timed(DOWN, resplit(wire, tcp_cuts), 1.0, 0.01)]
