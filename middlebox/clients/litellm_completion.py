"""`litellm`: LiteLLM's `acompletion(stream=True)` against an OpenAI-compatible base.

`litellm.acompletion(model="openai/<model>", api_base=..., api_key=..., messages=...,
stream=True)`, the README's form for any OpenAI-compatible server, with LiteLLM's
defaults: `num_retries` unset, so no retries of LiteLLM's own; the openai SDK client it
builds keeps the SDK's 2 retries; `request_timeout` 6000 s. `acompletion` is
`completion`'s asyncio twin (same provider code, async transport): the contract runs
every request on one asyncio loop and an abandoning user must close the connection, which
cancelling the stream does. Each chunk's `choices[0].delta.content` is shown; LiteLLM's
stream wrapper may supply a `finish_reason` the server never sent, which the scorer
reports as invented. Workload fields LiteLLM does not name travel in `extra_body`.

`LITELLM_LOCAL_MODEL_COST_MAP=True` is set before import: LiteLLM otherwise fetches its
model price list from the internet at import, and a client under test talks only to the
proxy.
"""

from __future__ import annotations

import os
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")

import litellm  # after the environment variable above: litellm reads it at import

from middlebox.clients.contract import (
    ClientEnv,
    Handler,
    Recorder,
    RequestSpec,
    apply_chunk,
    chunk_info,
    non_stream_info,
    run_client_and_leave,
    split_options,
)

# OpenAI body fields litellm takes as keyword arguments of the same name
NAMED = {
    "max_tokens", "max_completion_tokens", "temperature", "top_p", "seed", "n", "stop",
    "stream_options", "logprobs", "tools", "tool_choice", "response_format",
}  # fmt: skip
CALL = {"model", "messages", "prompt", "stream"}


def call_options(body: dict[str, Any]) -> dict[str, Any]:
    """Keyword arguments of the call for the workload's request body."""
    return split_options(body, NAMED, CALL)


def as_dict(obj: Any) -> Any:
    return obj.model_dump() if hasattr(obj, "model_dump") else obj


@asynccontextmanager
async def session(env: ClientEnv) -> AsyncIterator[Handler]:
    async def handle(spec: RequestSpec, rec: Recorder) -> None:
        rec.attempts += 1  # a floor: the SDK's own retries happen out of sight
        body = spec.body
        common: dict[str, Any] = {
            "model": f"openai/{body['model']}",
            "api_base": env.base_url,
            "api_key": env.api_key,
            "stream": spec.streaming,
            **call_options(body),
        }
        if spec.endpoint == "completions":
            response = await litellm.atext_completion(prompt=body["prompt"], **common)
        else:
            response = await litellm.acompletion(messages=body["messages"], **common)
        if not spec.streaming:
            apply_chunk(rec, non_stream_info(as_dict(response)))
            return
        async for chunk in response:
            apply_chunk(rec, chunk_info(as_dict(chunk)))

    yield handle


def main() -> None:
    run_client_and_leave("litellm", session)


if __name__ == "__main__":
    main()
