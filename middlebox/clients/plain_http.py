"""What the clients that write their own HTTP requests share, whichever library they drive.

`raw`, `httpx-sse`, `aiohttp-lines`, `resilient` and `tools-naive` build the POST themselves
(the SDK clients hand the key to their library instead): each sends the API key as a bearer
token, reads a streamed `data:` chunk or a whole `stream: false` answer from its JSON, and
shows what it brings. Library-free, so a client importing it still imports only the one
library it drives.
"""

from __future__ import annotations

import dataclasses
import json
from typing import Any

from middlebox.clients.contract import (
    ChunkInfo,
    ClientEnv,
    Recorder,
    apply_chunk,
    chunk_info,
    non_stream_info,
)


def auth_headers(env: ClientEnv) -> dict[str, str]:
    """The key as OpenAI sends it (vLLM with `--api-key` checks it; without, ignores it)."""
    return {"Authorization": f"Bearer {env.api_key}"}


def show_chunk(rec: Recorder, chunk: Any) -> None:
    """Show one decoded streamed chunk (a `data:` line's JSON) and keep its finish_reason
    and usage."""
    apply_chunk(rec, chunk_info(chunk))


def show_answer(rec: Recorder, body: Any) -> None:
    """Show a decoded `stream: false` response body whole, as one piece."""
    apply_chunk(rec, non_stream_info(body))


def event_info(data: str | bytes) -> ChunkInfo:
    """One streamed event's `data:` JSON read as a chunk; ValueError when it is no JSON."""
    return chunk_info(json.loads(data))


def answer_info(body: str | bytes) -> ChunkInfo:
    """A `stream: false` body read as one chunk; ValueError when it is no JSON."""
    return non_stream_info(json.loads(body))


def show_info(rec: Recorder, info: ChunkInfo, *, reasoning_as_answer: bool = False) -> None:
    """Show a chunk read by the client itself, its `delta.reasoning` apart from the answer
    (a "thinking" pane), or in it as a client printing `content or reasoning` does."""
    if reasoning_as_answer:
        info = dataclasses.replace(info, text=info.reasoning + info.text)
    else:
        rec.show_reasoning(info.reasoning)
    apply_chunk(rec, info)
