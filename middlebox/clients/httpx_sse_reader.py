"""`httpx-sse`: httpx plus httpx-sse's `aconnect_sse`, as its README shows.

`httpx.AsyncClient()` with httpx's defaults (5 s connect/read/write/pool timeouts), then
`aiter_sse()` until `data: [DONE]` or the end of the body. What that gives, per
vllm-wire.md §6.2: an error status raises `SSEError` from the Content-Type check (JSON is
not `text/event-stream`), a broken body raises `httpx.RemoteProtocolError`, a clean close
without `[DONE]` ends silently, an in-band `{"error": ...}` frame arrives as an ordinary
event with no text (httpx-sse has no error handling), and nothing is retried.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import httpx
from httpx_sse import aconnect_sse

from middlebox.clients.contract import ClientEnv, Handler, Recorder, RequestSpec, run_client
from middlebox.clients.plain_http import auth_headers, show_answer, show_chunk


@asynccontextmanager
async def session(env: ClientEnv, **client_options: Any) -> AsyncIterator[Handler]:
    """`client_options` go to `httpx.AsyncClient` (`httpx-h2`: http2=True and its CA)."""
    async with httpx.AsyncClient(**client_options) as http:

        async def handle(spec: RequestSpec, rec: Recorder) -> None:
            rec.attempts += 1
            url = env.url(spec.endpoint)
            if not spec.streaming:
                response = await http.post(url, json=spec.body, headers=auth_headers(env))
                response.raise_for_status()
                show_answer(rec, response.json())
                return
            async with aconnect_sse(
                http, "POST", url, json=spec.body, headers=auth_headers(env)
            ) as source:
                async for sse in source.aiter_sse():
                    if sse.data == "[DONE]":
                        rec.saw_done = True
                        break
                    show_chunk(rec, json.loads(sse.data))

        yield handle


def main() -> int:
    return run_client("httpx-sse", session)


if __name__ == "__main__":
    raise SystemExit(main())
