"""Cassettes: a recorded HTTP response's status, headers and body writes with timings.

The emulator replays one (config `cassette: FILE`) instead of generating, so a
stream captured from a real vLLM on a GPU plays back in CI with its original
timing. The file is JSON:

    {"status": 200,
     "headers": [["content-type", "text/event-stream; charset=utf-8"], ...],
     "writes": [[0.0213, "<base64 of the first body chunk>"], ...]}

`writes` offsets are seconds from when the request was received (replay) or sent
(recording); a chunked response replays one HTTP chunk per write, as recorded.

`python -m vllm_emulator.cassette URL BODY.json OUT.json` records one response from
an HTTP/1.1 server (plain TCP; point it at a vLLM, or at this emulator), parsing
the chunked framing so each recorded write is one chunk's payload.
"""

from __future__ import annotations

import asyncio
import base64
import json
import sys
import time
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit


async def record(
    url: str, body: dict[str, Any], headers: dict[str, str] | None = None
) -> dict[str, Any]:
    """POST `body` to `url` and return the response as a cassette dict."""
    parts = urlsplit(url)
    host, port = parts.hostname or "127.0.0.1", parts.port or 80
    data = json.dumps(body).encode()
    lines = [f"POST {parts.path or '/'} HTTP/1.1", f"Host: {host}:{port}",
             "Content-Type: application/json", f"Content-Length: {len(data)}",
             "Connection: close"]  # fmt: skip
    lines += [f"{k}: {v}" for k, v in (headers or {}).items()]
    reader, writer = await asyncio.open_connection(host, port)
    start = time.monotonic()
    writer.write(("\r\n".join(lines) + "\r\n\r\n").encode() + data)
    head = await reader.readuntil(b"\r\n\r\n")
    status_line, *header_lines = head.decode("latin-1").split("\r\n")
    pairs = [line.split(": ", 1) for line in header_lines if ": " in line]
    chunked = any(k.lower() == "transfer-encoding" and "chunked" in v for k, v in pairs)
    writes: list[list[Any]] = []
    try:
        while True:
            if chunked:
                size = int((await reader.readuntil(b"\r\n")).split(b";")[0], 16)
                payload = await reader.readexactly(size + 2)
                if size == 0:
                    break
                payload = payload[:-2]
            else:
                payload = await reader.read(65536)
                if not payload:
                    break
            writes.append([round(time.monotonic() - start, 6), base64.b64encode(payload).decode()])
    finally:
        writer.close()
    return {"status": int(status_line.split(" ")[1]), "headers": pairs, "writes": writes}


def main(argv: list[str]) -> int:
    if len(argv) != 3:
        print("usage: python -m vllm_emulator.cassette URL BODY.json OUT.json", file=sys.stderr)
        return 2
    url, body_file, out = argv
    cassette = asyncio.run(record(url, json.loads(Path(body_file).read_text())))
    Path(out).write_text(json.dumps(cassette, indent=1) + "\n")
    print(f"recorded {len(cassette['writes'])} writes, status {cassette['status']} -> {out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
