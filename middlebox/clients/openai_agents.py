"""`openai-agents`: the OpenAI Agents SDK streaming an agent's run, as its README shows.

    agent = Agent(name=..., model=OpenAIResponsesModel(model=..., openai_client=client))
    result = Runner.run_streamed(agent, input)
    async for event in result.stream_events():
        if event.type == "raw_response_event" and isinstance(event.data, ResponseTextDeltaEvent):
            print(event.data.delta, end="", flush=True)

The model is the SDK's default kind, `OpenAIResponsesModel` (the Responses API), given an
`AsyncOpenAI(base_url=..., api_key=...)` pointed at the server, as the SDK's docs show for
an OpenAI-compatible endpoint. It is given as a model object, not as the name: a name goes
through the SDK's `MultiProvider`, which reads `Qwen/Qwen3-0.6B` as provider `Qwen` and
raises `UserError: Unknown prefix`, and vLLM's model names are Hugging Face paths. Defaults
kept: the openai client's (600 s read timeout, 5 s connect, 2 retries before a stream
starts), the runner's (no retries of its own: `ModelSettings.retry` is unset; one turn
here, since the agent has no tools). The workload's request becomes the run's input and
`ModelSettings` (`max_output_tokens` as `max_tokens`, vLLM's extensions in `extra_body`).

Each raw Responses event is read with `middlebox.core.dialects` (the scorer's rule, as
`openai-responses` reads it): the `response.output_text.delta` pieces are shown (exactly
the README's `ResponseTextDeltaEvent`s), reasoning apart, and `finish_reason` is the
terminal event's status or `incomplete_details.reason` (vLLM ends a `max_output_tokens`
cut with `response.completed` whose status is `incomplete`: the SDK accepts it as the
final response). What `stream_events()` raises is surfaced as the error, which is where
this client differs from `openai-responses`: the runner needs a final response, so a
stream that closes cleanly before its terminal event raises `ModelBehaviorError: Model did
not produce a final response!` (no silent truncation), an RST raises the openai client's
`APIConnectionError`, and an `error` or `response.failed` event raises `ModelBehaviorError`
naming it. A user who leaves (`abandon_after_*`) calls `result.cancel()`, the SDK's way
to stop a streamed run: leaving the loop alone does not, since the run goes on reading
the stream in its own task (with a second request in flight the server generated the
abandoned answer to its end).

Tracing is disabled with the SDK's own switch, `set_tracing_disabled(True)`. Its default
(on, whatever the model's endpoint) posts every run's spans, prompt and answer included,
to `https://api.openai.com/v1/traces/ingest` with `OPENAI_API_KEY` (the runner sets one),
from a worker thread every 5 s and once more at exit, where an `atexit` hook waits up to
5 s for it. Measured here without a network, default against disabled: the stream is the
same (an 8 s answer of 159 deltas: mean gap 49.5 ms either way, the same text, end and
verdict), but the worker tried api.openai.com three times per batch (1 s and 2 s back-off,
"[non-fatal] Tracing request failed" on stderr), and the process outlived its result by
3.5-3.9 s instead of 0.35 s. The runner counts the whole process against the scenario's
client bound (20 s by default), so the default would score a hang where the user saw the
answer; and on a machine with a network it would send the scenario's prompts to OpenAI,
where a client under test talks to the proxy alone (as `litellm`'s cost-map fetch is
turned off).

`attempts` counts HTTP requests through the openai client's `_prepare_request` hook (as
`openai` does); `saw_done` is always false (no `[DONE]` in the Responses API). The SDK
lives in its own environment (`middlebox.clients.envs`, lock `locks/openai-agents.txt`):
no dependency of middlebox.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

from agents import Agent, ModelSettings, Runner, set_tracing_disabled
from agents.models.openai_responses import OpenAIResponsesModel

from middlebox.clients.api_requests import responses_request
from middlebox.clients.contract import (
    Abandoned,
    ClientEnv,
    Handler,
    Recorder,
    RequestSpec,
    run_client,
)
from middlebox.clients.openai_responses import Cursor, record_event
from middlebox.clients.openai_sdk import _CountingOpenAI, _current

AGENT_NAME = "middlebox"

# `responses_request` names these; ModelSettings calls two of them differently.
_SETTINGS = {"temperature": "temperature", "top_p": "top_p", "metadata": "metadata",
             "max_output_tokens": "max_tokens", "extra_body": "extra_body"}  # fmt: skip


def agent_settings(request: dict[str, Any]) -> ModelSettings:
    """The run's `ModelSettings` from `client.responses.create` keyword arguments; what
    ModelSettings does not name (`user`) rides in `extra_args`, passed to the call as is."""
    named = {_SETTINGS[k]: v for k, v in request.items() if k in _SETTINGS}
    rest = {k: v for k, v in request.items() if k not in _SETTINGS and k not in ("model", "input")}
    return ModelSettings(**named, extra_args=rest or None)


@asynccontextmanager
async def session(env: ClientEnv) -> AsyncIterator[Handler]:
    set_tracing_disabled(True)
    async with _CountingOpenAI(base_url=env.base_url, api_key=env.api_key) as client:

        async def handle(spec: RequestSpec, rec: Recorder) -> None:
            _current.set(rec)
            request = responses_request(spec)
            agent = Agent(
                name=AGENT_NAME,
                model=OpenAIResponsesModel(model=request["model"], openai_client=client),
                model_settings=agent_settings(request),
            )
            if not spec.streaming:
                done = await Runner.run(agent, request["input"])
                rec.show(str(done.final_output))
                # the SDK raises on a `failed` or `incomplete` response: what it returns
                # completed
                rec.finish_reason = "completed"
                return
            result = Runner.run_streamed(agent, request["input"])
            cursor = Cursor()
            try:
                async for event in result.stream_events():
                    if event.type == "raw_response_event":
                        record_event(event.data.to_dict(), rec, cursor)
            except (Abandoned, asyncio.CancelledError):
                result.cancel()  # the user left: stop the run and its stream
                raise

        yield handle


def main() -> int:
    return run_client("openai-agents", session)


if __name__ == "__main__":
    raise SystemExit(main())
