"""`aiohttp-lines`: an aiohttp session reading the stream line by line, the common loop.

`aiohttp.ClientSession()` with aiohttp's defaults (`ClientTimeout(total=300,
sock_connect=30)`: five minutes for the whole request, no read timeout of its own, no
retries), `raise_for_status()`, then `async for line in response.content`, which yields
whole lines, so a UTF-8 character split across reads is decoded whole. It shows each
`data: {json}` line's delta and stops at `data: [DONE]`; it checks no `finish_reason`, so a
clean close without `[DONE]` ends silently. A body cut inside its chunked framing raises
`ClientPayloadError`, an RST `ClientPayloadError` or `ServerDisconnectedError`, and an
in-band `{"error": ...}` frame shows no text and no error (the loop does not look for it).
"""

from __future__ import annotations

import json
from collections.abc import AsyncGenerator, AsyncIterator, Callable
from contextlib import AbstractAsyncContextManager, aclosing, asynccontextmanager

import aiohttp

from middlebox.clients.contract import ClientEnv, Handler, Recorder, RequestSpec, run_client
from middlebox.clients.plain_http import auth_headers, show_answer, show_chunk

DATA = b"data:"


def show_line(rec: Recorder, line: bytes) -> bool:
    """Show one body line; True at `data: [DONE]` (the loop's end)."""
    if not line.startswith(DATA):
        return False
    payload = line[len(DATA) :].strip()
    if payload == b"[DONE]":
        rec.saw_done = True
        return True
    if payload:
        show_chunk(rec, json.loads(payload))
    return False


LineReader = Callable[[aiohttp.ClientResponse], AsyncGenerator[bytes]]


async def whole_lines(response: aiohttp.ClientResponse) -> AsyncGenerator[bytes]:
    """aiohttp's own line iterator: whole lines, decoded later, so never split inside one."""
    async for line in response.content:
        yield line


@asynccontextmanager
async def line_session(env: ClientEnv, read_lines: LineReader) -> AsyncIterator[Handler]:
    """The loop both aiohttp clients share (default session, `raise_for_status()`, each
    `data:` line shown, stop at `[DONE]`); they differ only in how lines come off the body."""
    async with aiohttp.ClientSession() as http:

        async def handle(spec: RequestSpec, rec: Recorder) -> None:
            rec.attempts += 1
            async with http.post(
                env.url(spec.endpoint), json=spec.body, headers=auth_headers(env)
            ) as response:
                response.raise_for_status()
                if not spec.streaming:
                    show_answer(rec, await response.json())
                    return
                async with aclosing(read_lines(response)) as lines:
                    async for line in lines:
                        if show_line(rec, line):
                            break

        yield handle


def session(env: ClientEnv) -> AbstractAsyncContextManager[Handler]:
    return line_session(env, whole_lines)


def main() -> int:
    return run_client("aiohttp-lines", session)


if __name__ == "__main__":
    raise SystemExit(main())
