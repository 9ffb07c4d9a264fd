"""`langchain-openai`: LangChain's `ChatOpenAI` streaming an answer, as its README shows.

`ChatOpenAI(model=..., base_url=..., api_key=...)` with LangChain's defaults
(`max_retries=None` and `timeout=None`, which leave the openai SDK's own: 2 retries,
600 s read timeout, 5 s connect), then `async for chunk in llm.astream(messages)`, each
`AIMessageChunk`'s `content` shown. `astream` is `stream`'s asyncio twin (same payload,
same SDK client, async transport): the contract runs every request on one asyncio loop and
an abandoning user must close the connection, which cancelling `astream` does. The
`finish_reason` comes from the last chunk's `response_metadata`, usage from
`usage_metadata` (renamed to OpenAI's `prompt_tokens`/`completion_tokens`). Workload
fields `ChatOpenAI` does not name (vLLM's `top_k`, `ignore_eos`, ...) go in `extra_body`,
as LangChain documents for vLLM. A stream that closes without `[DONE]` ends as silently
as in the SDK it wraps; what the SDK raises on a broken stream reaches the caller as is.
The completions endpoint uses `langchain_openai.OpenAI`, the same way.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

from langchain_openai import ChatOpenAI, OpenAI

from middlebox.clients.contract import (
    ChunkInfo,
    ClientEnv,
    Handler,
    Recorder,
    RequestSpec,
    apply_chunk,
    run_client_and_leave,
    split_options,
)

# body fields ChatOpenAI / OpenAI take as constructor arguments of the same name
NAMED = {"model", "max_tokens", "temperature", "top_p", "seed", "n", "stop", "logprobs"}
# body fields that are the call itself, not options
CALL = {"messages", "prompt", "stream", "stream_options"}


def model_options(body: dict[str, Any]) -> dict[str, Any]:
    """Constructor arguments for the workload's request body."""
    return split_options(body, NAMED, CALL)


def usage_of(metadata: Any) -> dict[str, Any] | None:
    """LangChain's `usage_metadata` under OpenAI's names (what the contract reports)."""
    if not isinstance(metadata, dict) or not metadata:
        return None
    return {
        "prompt_tokens": metadata.get("input_tokens"),
        "completion_tokens": metadata.get("output_tokens"),
        "total_tokens": metadata.get("total_tokens"),
    }


def chat_chunk_info(chunk: Any) -> ChunkInfo:
    content = chunk.content if isinstance(chunk.content, str) else ""
    finish = (chunk.response_metadata or {}).get("finish_reason")
    return ChunkInfo(
        text=content,
        finish_reason=finish if isinstance(finish, str) else None,
        usage=usage_of(getattr(chunk, "usage_metadata", None)),
    )


@asynccontextmanager
async def session(env: ClientEnv) -> AsyncIterator[Handler]:
    async def handle(spec: RequestSpec, rec: Recorder) -> None:
        rec.attempts += 1  # a floor: the SDK's own retries happen out of sight
        body = spec.body
        include_usage = bool((body.get("stream_options") or {}).get("include_usage"))
        connection = {"base_url": env.base_url, "api_key": env.api_key}
        if spec.endpoint == "completions":
            llm = OpenAI(**connection, **model_options(body))
            if not spec.streaming:
                apply_chunk(rec, ChunkInfo(text=await llm.ainvoke(body["prompt"])))
                return
            async for text in llm.astream(body["prompt"]):
                apply_chunk(rec, ChunkInfo(text=text))
            return
        chat = ChatOpenAI(**connection, stream_usage=include_usage, **model_options(body))
        messages = [(m["role"], m["content"]) for m in body["messages"]]
        if not spec.streaming:
            apply_chunk(rec, chat_chunk_info(await chat.ainvoke(messages)))
            return
        async for chunk in chat.astream(messages):
            apply_chunk(rec, chat_chunk_info(chunk))

    yield handle


def main() -> None:
    run_client_and_leave("langchain-openai", session)


if __name__ == "__main__":
    main()
