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

from collections.abc import AsyncGenerator
from contextlib import AbstractAsyncContextManager

import aiohttp

from middlebox.clients.aiohttp_lines import line_session
from middlebox.clients.contract import ClientEnv, Handler, run_client


class NaiveLines:
    """Text lines from reads decoded one by one (the bug is the per-read decode)."""

    def __init__(self) -> None:
        self.pending = ""

    def feed(self, data: bytes) -> list[str]:
        self.pending += data.decode("utf-8", errors="replace")
        *lines, self.pending = self.pending.split("\n")
        return lines


async def naive_lines(response: aiohttp.ClientResponse) -> AsyncGenerator[bytes]:
    """`iter_any()` reads, each decoded on its own, split into lines."""
    lines = NaiveLines()
    async for data in response.content.iter_any():
        for line in lines.feed(data):
            yield line.encode()


def session(env: ClientEnv) -> AbstractAsyncContextManager[Handler]:
    return line_session(env, naive_lines)


def main() -> int:
    return run_client("aiohttp-naive", session)


if __name__ == "__main__":
    raise SystemExit(main())
