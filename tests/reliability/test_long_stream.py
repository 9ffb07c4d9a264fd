"""A long stream through `coalescer` (one flush and one report per 1,460 bytes) holds the real
proxy process's memory flat: 400 MB here, 3.6 GB in `make soak` and `make hostile`
(middlebox.tools.long_stream).
A report kept per flush grew it by ~70 MiB over these bytes, freed only at the close."""

from __future__ import annotations

import trio

from middlebox.tools.long_stream import MIB, long_stream
from tests.reliability.support import FULL

TOTAL = 3_600_000_000 if FULL else 400_000_000


async def test_a_long_stream_through_coalescer_keeps_the_proxy_process_rss_flat() -> None:
    with trio.fail_after(600 if FULL else 240):
        report = await long_stream(TOTAL, samples=20)
    assert report.received == TOTAL, report.summary()
    assert len(report.samples) >= 20, report.summary()
    assert report.growth <= 16 * MIB, report.summary()
    assert report.flat, report.summary()
