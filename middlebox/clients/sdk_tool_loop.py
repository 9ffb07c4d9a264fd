"""`openai-tools`: the openai SDK's documented streaming tool-call loop, as users copy it.

openai-python's function-calling guide accumulates streamed calls by `index`, the first
delta of each call giving its `id` and `function.name` and later ones appending
`function.arguments`, and runs the calls once the stream says it finished. That is what
this client does, with `AsyncOpenAI()`'s defaults (`openai` client: 600 s read timeout, 2
retries before the stream starts, none after):

- on the chunk that carries a `finish_reason`, whatever its value (`tool_calls`, `stop`,
  or `length` when `max_tokens` cut the arguments), it runs every accumulated call with
  `json.loads(arguments)`; arguments that do not parse raise, and the error is surfaced;
- a `response_format` answer is `json.loads`ed and acted on at the same point;
- the loop shows `delta.content` only: a reasoning model's `delta.reasoning` is never shown,
  so the user waits through the reasoning phase with nothing on screen
  (`reasoning_hidden`);
- no idempotency key: nothing here runs a call twice, since the SDK retries only before
  the stream starts and the loop never retries a turn.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from typing import Any

from middlebox.clients.agent_stream import ToolCallAccumulator, wants_json
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
from middlebox.clients.openai_sdk import _CountingOpenAI, _current, split_body


def run_calls(rec: Recorder, calls: ToolCallAccumulator) -> None:
    """The guide's "after the stream": `json.loads` each call's arguments and run it."""
    for call in calls.ordered():
        arguments = json.loads(call.arguments)  # raises on a partial call: surfaced
        rec.executed_tool_call(call.name, arguments, None, call.index)


@asynccontextmanager
async def session(env: ClientEnv) -> AsyncIterator[Handler]:
    async with _CountingOpenAI(base_url=env.base_url, api_key=env.api_key) as client:

        async def handle(spec: RequestSpec, rec: Recorder) -> None:
            _current.set(rec)
            create: Callable[..., Any] = client.chat.completions.create
            response = await create(**split_body(create, spec.body))
            calls = ToolCallAccumulator()
            if not spec.streaming:
                info = non_stream_info(response.to_dict())
                apply_chunk(rec, info)
                return
            async with response:
                async for chunk in response:
                    info = chunk_info(chunk.to_dict())
                    calls.feed(info.tool_calls)
                    apply_chunk(rec, info)
                    if info.finish_reason is not None:
                        run_calls(rec, calls)
                        if wants_json(spec.body) and rec.text:
                            rec.acted_on_json(rec.text, json.loads(rec.text))

        yield handle


def main() -> int:
    return run_client("openai-tools", session)


if __name__ == "__main__":
    raise SystemExit(main())
