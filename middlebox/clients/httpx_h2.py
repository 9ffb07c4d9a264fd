"""`httpx-h2`: httpx with `http2=True` plus httpx-sse, a client that speaks HTTP/2.

The same reading as `httpx-sse` (httpx's 5 s timeouts, `aiter_sse()` until `data: [DONE]`
or the end), on one `httpx.AsyncClient(http2=True)`: against a TLS proxy that offers `h2`
in ALPN every concurrent request of the workload is a stream on one multiplexed connection
(httpcore queues streams beyond the server's SETTINGS_MAX_CONCURRENT_STREAMS). A reset
stream raises `httpx.RemoteProtocolError`, a dropped connection fails every stream on it.
It trusts `MIDDLEBOX_CA_FILE` when set (the runner sets it for `proxy: {tls: ...}`).
"""

from __future__ import annotations

import json
import os
import ssl
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import httpx
from httpx_sse import aconnect_sse

from middlebox.clients.contract import (
    ClientEnv,
    Handler,
    Recorder,
    RequestSpec,
    apply_chunk,
    auth_headers,
    chunk_info,
    non_stream_info,
    run_client,
)


def trust() -> ssl.SSLContext | bool:
    cafile = os.environ.get("MIDDLEBOX_CA_FILE")
    return ssl.create_default_context(cafile=cafile) if cafile else True


@asynccontextmanager
async def session(env: ClientEnv) -> AsyncIterator[Handler]:
    async with httpx.AsyncClient(http2=True, verify=trust()) as http:

        async def handle(spec: RequestSpec, rec: Recorder) -> None:
            rec.attempts += 1
            url = env.url(spec.endpoint)
            if not spec.streaming:
                response = await http.post(url, json=spec.body, headers=auth_headers(env))
                response.raise_for_status()
                apply_chunk(rec, non_stream_info(response.json()))
                return
            async with aconnect_sse(
                http, "POST", url, json=spec.body, headers=auth_headers(env)
            ) as source:
                async for sse in source.aiter_sse():
                    if sse.data == "[DONE]":
                        rec.saw_done = True
                        break
                    apply_chunk(rec, chunk_info(json.loads(sse.data)))

        yield handle


def main() -> int:
    return run_client("httpx-h2", session)


if __name__ == "__main__":
    raise SystemExit(main())
