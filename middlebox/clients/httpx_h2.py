"""`httpx-h2`: httpx with `http2=True` plus httpx-sse, a client that speaks HTTP/2.

The same reading as `httpx-sse` (httpx's 5 s timeouts, `aiter_sse()` until `data: [DONE]`
or the end), on one `httpx.AsyncClient(http2=True)`: against a TLS proxy that offers `h2`
in ALPN every concurrent request of the workload is a stream on one multiplexed connection
(httpcore queues streams beyond the server's SETTINGS_MAX_CONCURRENT_STREAMS). A reset
stream raises `httpx.RemoteProtocolError`, a dropped connection fails every stream on it.
It trusts `MIDDLEBOX_CA_FILE` when set (the runner sets it for `proxy: {tls: ...}`).
"""

from __future__ import annotations

import os
import ssl
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

from middlebox.clients import httpx_sse_reader
from middlebox.clients.contract import ClientEnv, Handler, run_client


def trust() -> ssl.SSLContext | bool:
    cafile = os.environ.get("MIDDLEBOX_CA_FILE")
    return ssl.create_default_context(cafile=cafile) if cafile else True


@asynccontextmanager
async def session(env: ClientEnv) -> AsyncIterator[Handler]:
    # httpx-sse's reading, on a client that offers h2 (the reading is one function)
    async with httpx_sse_reader.session(env, http2=True, verify=trust()) as handle:
        yield handle


def main() -> int:
    return run_client("httpx-h2", session)


if __name__ == "__main__":
    raise SystemExit(main())
