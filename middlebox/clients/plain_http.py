"""What the clients that write their own HTTP requests share, whichever library they drive.

`raw`, `httpx-sse`, `aiohttp-lines`, `resilient` and `tools-naive` build the POST themselves
(the SDK clients hand the key to their library instead): each sends the API key as a bearer
token and shows what a streamed `data:` chunk or a whole `stream: false` answer brings.
Library-free, so a client importing it still imports only the one library it drives.
"""

from __future__ import annotations

from typing import Any

from middlebox.clients.contract import (
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
