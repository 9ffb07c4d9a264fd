"""`raw`: the client that trusts whatever arrives, like `curl -N ... | show`.

It streams with httpx, splits the body into lines and shows the text of every
`data: {json}` line as soon as the line is complete (no event assembly). It checks
neither the HTTP status (curl without `--fail`), nor `finish_reason`, nor `[DONE]`, never
retries, and treats any end of the body (a clean close without `[DONE]`, a truncated
chunked body, an RST) as the end of the answer: a script that pipes `curl -N` into a
formatter loses curl's exit status, so the user sees a complete-looking answer. This is
the baseline that shows **silent truncation**.
Only a request that never got a response (connection refused) reports an error.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import httpx

from middlebox.clients.contract import ClientEnv, Handler, Recorder, RequestSpec, run_client
from middlebox.clients.plain_http import auth_headers, show_answer, show_chunk
from middlebox.core.sse import SseFramer, SseKind, SsePiece


def _show_line(rec: Recorder, piece: SsePiece) -> None:
    if piece.kind is not SseKind.FIELD or piece.field != "data":
        return
    payload = piece.data[piece.value_start : piece.value_end].decode("utf-8", "replace").strip()
    if payload == "[DONE]":
        rec.saw_done = True  # noted, but raw keeps reading to the end regardless
        return
    try:
        obj: Any = json.loads(payload)
    except ValueError:
        return
    show_chunk(rec, obj)


@asynccontextmanager
async def session(env: ClientEnv) -> AsyncIterator[Handler]:
    # curl has no read or total timeout by default; only connecting is bounded.
    timeout = httpx.Timeout(None, connect=10.0)
    async with httpx.AsyncClient(
        timeout=timeout, limits=httpx.Limits(max_connections=None)
    ) as http:

        async def handle(spec: RequestSpec, rec: Recorder) -> None:
            rec.attempts += 1
            async with http.stream(
                "POST", env.url(spec.endpoint), json=spec.body, headers=auth_headers(env)
            ) as response:
                if not spec.streaming:
                    show_answer(rec, json.loads(await response.aread()))
                    return
                lines = SseFramer()
                try:
                    async for data in response.aiter_bytes():
                        for piece in lines.feed(data):
                            _show_line(rec, piece)
                except httpx.TransportError:
                    pass  # the end of the body, however it came, is trusted

        yield handle


def main() -> int:
    return run_client("raw", session)


if __name__ == "__main__":
    raise SystemExit(main())
