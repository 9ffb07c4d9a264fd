"""`openai`: the official openai-python SDK exactly as a user runs it.

`AsyncOpenAI()` with its defaults (openai `_constants.py`: 600 s read timeout, 5 s
connect, 2 retries with backoff that honours `retry-after`), `stream=True`, deltas
reassembled, and whatever the SDK raises shown as the error. What that gives, per
vllm-wire.md §6.1: an RST or a truncated chunked body mid-stream raises
(`APIConnectionError` in 3.x), an in-band error frame raises `APIError`, but a stream that
closes cleanly without `[DONE]` ends **silently**, because the SDK checks neither
`[DONE]` nor `finish_reason`; nothing is retried once the stream has been returned.

The only addition is an override of the SDK's documented `_prepare_request` hook, which
counts HTTP attempts per logical request without changing what is sent. The SDK consumes
`[DONE]` internally and never tells its caller, so `saw_done` is always false here.
"""

from __future__ import annotations

import contextvars
import inspect
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from typing import Any

import openai

from middlebox.clients.contract import (
    ClientEnv,
    Handler,
    Recorder,
    RequestSpec,
    apply_chunk,
    chunk_info,
    non_stream_info,
    run_client,
)

_current: contextvars.ContextVar[Recorder] = contextvars.ContextVar("middlebox_recorder")

# Keyword arguments of `create()` that are SDK options rather than request-body fields.
_SDK_OPTIONS = {"extra_headers", "extra_query", "extra_body", "timeout"}


class _CountingOpenAI(openai.AsyncOpenAI):
    async def _prepare_request(self, request: Any) -> None:
        rec = _current.get(None)
        if rec is not None:
            rec.attempts += 1
        await super()._prepare_request(request)


def split_body(create: Callable[..., Any], body: dict[str, Any]) -> dict[str, Any]:
    """Body fields the SDK names become keyword arguments; vLLM extensions it does not
    know (top_k, ignore_eos, ...) travel in `extra_body`, as users pass them."""
    known = set(inspect.signature(create).parameters) - _SDK_OPTIONS
    kwargs = {k: v for k, v in body.items() if k in known}
    extra = {k: v for k, v in body.items() if k not in known}
    if extra:
        kwargs["extra_body"] = extra
    return kwargs


@asynccontextmanager
async def session(env: ClientEnv) -> AsyncIterator[Handler]:
    async with _CountingOpenAI(base_url=env.base_url, api_key=env.api_key) as client:

        async def handle(spec: RequestSpec, rec: Recorder) -> None:
            _current.set(rec)  # each request runs in its own task, hence its own context
            create: Callable[..., Any] = (
                client.chat.completions.create
                if spec.endpoint == "chat"
                else client.completions.create
            )
            response = await create(**split_body(create, spec.body))
            if not spec.streaming:
                apply_chunk(rec, non_stream_info(response.to_dict()))
                return
            async with response:
                async for chunk in response:
                    apply_chunk(rec, chunk_info(chunk.to_dict()))

        yield handle


def main() -> int:
    return run_client("openai", session)


if __name__ == "__main__":
    raise SystemExit(main())
