"""`tools-naive`: an agent loop that acts on whatever the stream has given it so far.

The shape of many hand-written agent loops and streaming UIs (the seed article's failure
modes, all at once):

- Tool calls: after **every argument fragment** it parses the arguments so far with a
  partial-JSON parser (what streaming UIs render partial arguments with, e.g. the Vercel AI
  SDK's `parsePartialJson`) and keeps the last value that parsed; it executes a call as soon
  as the call's fragments stop: when the next call starts, when a `finish_reason` comes, or
  when the stream ends in any way (clean close, cut body, RST). A stream cut inside the
  arguments therefore runs the tool with a repaired prefix (`acted_on_partial_call`).
- Retries: a transport error (RST, cut body) or an error status makes it run the whole turn
  again, up to 2 more times, as an agent framework's retry wrapper does, with no idempotency
  key: a call already executed runs again (`side_effect_repeated`).
- JSON answers (`response_format`): it acts on the partial-JSON parse of the content at the
  end of the stream, complete or not (`acted_on_invalid_json`).
- Reasoning: it shows `delta.reasoning` in the answer text, as a client that prints
  `delta.content or delta.reasoning` does (`reasoning_as_answer`).

It never checks `[DONE]`, and reports the last error only when every attempt failed.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from typing import Any

import httpx

from middlebox.clients.agent_stream import (
    ToolCall,
    ToolCallAccumulator,
    parse_partial_json,
    wants_json,
)
from middlebox.clients.contract import (
    ChunkInfo,
    ClientEnv,
    Handler,
    Recorder,
    RequestSpec,
    run_client,
)
from middlebox.clients.plain_http import answer_info, auth_headers, event_info, show_info
from middlebox.core.sse import SseFramer

RETRIES = 2


@dataclass
class _Turn:
    """One attempt of the agent turn: the calls streamed so far, what parsed last."""

    rec: Recorder
    calls: ToolCallAccumulator = field(default_factory=ToolCallAccumulator)
    last_parse: dict[int, Any] = field(default_factory=dict)
    executed: set[int] = field(default_factory=set)
    answer: list[str] = field(default_factory=list)

    def on_chunk(self, info: ChunkInfo) -> None:
        if info.tool_calls:
            before = set(self.calls.calls)
            for call in self.calls.feed(info.tool_calls):
                ok, value = parse_partial_json(call.arguments)
                if ok:
                    self.last_parse[call.index] = value
            for index in set(self.calls.calls) - before:
                # a new call started: the earlier ones are "done"
                for earlier in self.calls.ordered():
                    if earlier.index < index:
                        self.execute(earlier)
        self.answer.append(info.text)
        # reasoning shown as part of the answer, before or instead of the content
        show_info(self.rec, info, reasoning_as_answer=True)
        if info.finish_reason is not None:
            self.finish()

    def execute(self, call: ToolCall) -> None:
        if call.index in self.executed or call.index not in self.last_parse:
            return
        self.executed.add(call.index)
        self.rec.executed_tool_call(call.name, self.last_parse[call.index], None, call.index)

    def finish(self) -> None:
        """The stream stopped (a finish_reason, or any end): act on what it has."""
        for call in self.calls.ordered():
            self.execute(call)

    def act_on_json(self) -> None:
        text = "".join(self.answer)
        ok, value = parse_partial_json(text)
        if text and ok:
            self.rec.acted_on_json(text, value)


async def _attempt(
    http: httpx.AsyncClient, env: ClientEnv, spec: RequestSpec, rec: Recorder
) -> None:
    turn = _Turn(rec)
    rec.attempts += 1
    try:
        async with http.stream(
            "POST", env.url(spec.endpoint), json=spec.body, headers=auth_headers(env)
        ) as response:
            if response.status_code >= 300:
                body = (await response.aread()).decode("utf-8", "replace")
                raise httpx.HTTPStatusError(
                    f"HTTP {response.status_code}: {body[:200]}",
                    request=response.request,
                    response=response,
                )
            if not spec.streaming:
                turn.on_chunk(answer_info(await response.aread()))
                return
            framer = SseFramer()
            async for data in response.aiter_bytes():
                for piece in framer.feed(data):
                    event = piece.event
                    if event is None or event.is_done:
                        continue
                    try:
                        turn.on_chunk(event_info(event.data))
                    except ValueError:
                        continue
    finally:
        # however the stream ended, the calls it began are "done" and the JSON is acted on
        turn.finish()
        if wants_json(spec.body):
            turn.act_on_json()


@asynccontextmanager
async def session(env: ClientEnv) -> AsyncIterator[Handler]:
    async with httpx.AsyncClient(timeout=httpx.Timeout(60.0, connect=10.0)) as http:

        async def handle(spec: RequestSpec, rec: Recorder) -> None:
            for attempt in range(RETRIES + 1):
                try:
                    await _attempt(http, env, spec, rec)
                    return
                except (httpx.TransportError, httpx.HTTPStatusError):
                    if attempt == RETRIES:
                        raise
                    rec.replace()  # the turn runs again from the start

        yield handle


def main() -> int:
    return run_client("tools-naive", session)


if __name__ == "__main__":
    raise SystemExit(main())
