"""`aiohttp-naive`: aiohttp's `iter_any()` with every network read decoded on its own.

The loop many hand-written streaming clients start as: `async for data in
response.content.iter_any(): buffer += data.decode("utf-8", errors="replace")`, then split
the text on newlines and show each `data:` line. `errors="replace"` is the usual answer to
the `UnicodeDecodeError` a strict `decode()` raises on the first split character; either
way the decoding is per read, not per stream, so a multi-byte character cut across two
reads (RFC 3629: 2 to 4 bytes) becomes U+FFFD on both sides. That is the `mojibake`
verdict; the fix is an incremental decoder (`codecs.getincrementaldecoder("utf-8")()`) or
aiohttp's own line iterator (`async for line in response.content`, the `aiohttp-lines`
client). Otherwise it is `aiohttp-lines`: aiohttp's default timeouts, `raise_for_status()`,
stops at `[DONE]`, no retries, no `finish_reason` check.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import aiohttp

from middlebox.clients.aiohttp_lines import show_line
from middlebox.clients.contract import (
    ClientEnv,
    Handler,
    Recorder,
    RequestSpec,
    apply_chunk,
    auth_headers,
    non_stream_info,
    run_client,
)


class NaiveLines:
    """Text lines from reads decoded one by one (the bug is the per-read decode)."""

    def __init__(self) -> None:
        self.pending = ""

    def feed(self, data: bytes) -> list[str]:
        self.pending += data.decode("utf-8", errors="replace")
        *lines, self.pending = self.pending.split("\n")
        return lines


@asynccontextmanager
async def session(env: ClientEnv) -> AsyncIterator[Handler]:
    async with aiohttp.ClientSession() as http:

        async def handle(spec: RequestSpec, rec: Recorder) -> None:
            rec.attempts += 1
            async with http.post(
                env.url(spec.endpoint), json=spec.body, headers=auth_headers(env)
            ) as response:
                response.raise_for_status()
                if not spec.streaming:
                    apply_chunk(rec, non_stream_info(await response.json()))
                    return
                lines = NaiveLines()
                async for data in response.content.iter_any():
                    for line in lines.feed(data):
                        if show_line(rec, line.encode()):
                            return

        yield handle


def main() -> int:
    return run_client("aiohttp-naive", session)


if __name__ == "__main__":
    raise SystemExit(main())
