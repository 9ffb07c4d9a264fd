"""Cassettes: a recorded HTTP response's status, headers and body writes with timings.

The emulator replays one (config `cassette: FILE`) instead of generating, so a
stream captured from a real vLLM on a GPU plays back in CI with its original
timing. The file is JSON:

    {"status": 200,
     "headers": [["content-type", "text/event-stream; charset=utf-8"], ...],
     "writes": [[0.0213, "<base64 of the first body chunk>"], ...]}

`writes` offsets are seconds from when the request was received (replay) or sent
(recording); a chunked response replays one HTTP chunk per write, as recorded.

All three keys are required (`middlebox record` and `record` here always write them, and
`request` and `truncated` besides, which replay ignores): `load_cassette` refuses a
file without them when the emulator starts, in one line, rather than each request
failing or a bare `{"status": 200}` replaying as an empty answer nobody asked for.

`python -m vllm_emulator.cassette URL BODY.json OUT.json` records one response from
an HTTP/1.1 server (plain TCP; point it at a vLLM, or at this emulator), parsing
the chunked framing so each recorded write is one chunk's payload.
"""

from __future__ import annotations

import asyncio
import base64
import binascii
import json
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

SHAPE = '{"status": 200, "headers": [[name, value], ...], "writes": [[seconds, base64], ...]}'
REQUIRED = ("status", "headers", "writes")


@dataclass(frozen=True)
class Cassette:
    """A recorded response, decoded: what replay sends, and when."""

    status: int
    headers: list[tuple[str, str]]
    writes: list[tuple[float, bytes]]


def load_cassette(path: str | Path) -> Cassette:
    """Read and check a cassette file; ValueError in one line naming the file and the fault."""
    try:
        text = Path(path).read_text(encoding="utf-8")
    except OSError as error:
        reason = error.strerror or str(error)
        raise ValueError(f"{path}: cannot read it: {reason.lower()}") from None
    except UnicodeDecodeError:
        raise ValueError(f"{path}: not a JSON text file (not UTF-8)") from None
    try:
        data = json.loads(text)
    except json.JSONDecodeError as error:
        raise ValueError(f"{path}:{error.lineno}:{error.colno}: not JSON: {error.msg}") from None
    return parse_cassette(data, str(path))


def parse_cassette(data: object, where: str) -> Cassette:
    """A cassette from its JSON value; ValueError naming the first field that is wrong."""

    def refuse(problem: str) -> ValueError:
        return ValueError(f"{where}: not a cassette: {problem}")

    if not isinstance(data, dict):
        raise refuse(f"expected a JSON object {SHAPE}")
    missing = [name for name in REQUIRED if name not in data]
    if missing:
        raise refuse(
            f"missing {', '.join(missing)}; a cassette is {SHAPE} (`middlebox record` writes them)"
        )
    status = data["status"]
    if isinstance(status, bool) or not isinstance(status, int) or not 100 <= status <= 599:
        raise refuse(f"status: expected an HTTP status 100-599, got {status!r}")
    headers = data["headers"]
    if not isinstance(headers, list):
        raise refuse(f"headers: expected a list of [name, value], got {headers!r}")
    for index, pair in enumerate(headers):
        if not (
            isinstance(pair, list) and len(pair) == 2 and all(isinstance(p, str) for p in pair)
        ):
            raise refuse(f"headers[{index}]: expected [name, value] strings, got {pair!r}")
    writes = data["writes"]
    if not isinstance(writes, list):
        raise refuse(f"writes: expected a list of [seconds, base64], got {writes!r}")
    decoded: list[tuple[float, bytes]] = []
    for index, write in enumerate(writes):
        at, payload = write if isinstance(write, list) and len(write) == 2 else (None, None)
        if isinstance(at, bool) or not isinstance(at, int | float) or not 0 <= at < float("inf"):
            raise refuse(f"writes[{index}]: expected [seconds >= 0, base64], got {write!r}")
        try:
            body = base64.b64decode(payload, validate=True) if isinstance(payload, str) else None
        except binascii.Error:
            body = None
        if body is None:
            raise refuse(f"writes[{index}]: the body is not base64 text: {payload!r:.40}")
        decoded.append((float(at), body))
    return Cassette(status, [(name, value) for name, value in headers], decoded)


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
