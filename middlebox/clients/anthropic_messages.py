"""`anthropic-messages`: the anthropic Python SDK's `messages.stream`, as its README shows.

`AsyncAnthropic(base_url=..., api_key=...)` with the SDK's defaults (10 min timeout, 2
retries before a stream starts), pointed at the server's root: the SDK appends
`/v1/messages` itself, so the contract's `OPENAI_BASE_URL` loses its `/v1`. Then

    async with client.messages.stream(max_tokens=..., messages=[...], model=...) as stream:
        async for text in stream.text_stream:
            print(text, end="", flush=True)
    message = await stream.get_final_message()

each piece of `text_stream` shown; `finish_reason` is the final message's `stop_reason`
(`end_turn`, `max_tokens`, ...; None when the stream ended before its `message_delta`),
usage its `usage`. What the SDK raises is surfaced as the error (`event: error` raises
`APIStatusError`; an RST lets httpx's `ReadError` escape unwrapped, measured in
reset-mid-stream); when it raises, the stop reason is read from the snapshot the stream
accumulated. A stream that closes cleanly before `message_stop` ends `text_stream` without a
word and
`get_final_message` returns that snapshot (`stop_reason` None): the client reports what it
had. The workload's chat request becomes a Messages request
(`middlebox.clients.api_requests`). The SDK lives in its own environment
(`middlebox.clients.envs`, lock `locks/anthropic-messages.txt`): no dependency of middlebox.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import anthropic

from middlebox.clients.api_requests import messages_request, root_url
from middlebox.clients.contract import ClientEnv, Handler, Recorder, RequestSpec, run_client


def _usage(message: Any) -> dict[str, Any] | None:
    usage = getattr(message, "usage", None)
    return usage.to_dict() if usage is not None else None


def _settle(rec: Recorder, message: Any) -> None:
    rec.finish_reason = getattr(message, "stop_reason", None)
    rec.usage = _usage(message)


def _snapshot(stream: Any) -> Any:
    """What the stream accumulated so far, or None before `message_start` (the SDK asserts)."""
    try:
        return stream.current_message_snapshot
    except AssertionError:
        return None


@asynccontextmanager
async def session(env: ClientEnv) -> AsyncIterator[Handler]:
    async with anthropic.AsyncAnthropic(base_url=root_url(env.base_url), api_key=env.api_key) as (
        client
    ):

        async def handle(spec: RequestSpec, rec: Recorder) -> None:
            rec.attempts += 1  # a floor: the SDK's own retries happen out of sight
            request = messages_request(spec)
            if not spec.streaming:
                message = await client.messages.create(**request)
                rec.show("".join(b.text for b in message.content if b.type == "text"))
                _settle(rec, message)
                return
            async with client.messages.stream(**request) as stream:
                try:
                    async for text in stream.text_stream:
                        rec.show(text)
                finally:
                    _settle(rec, _snapshot(stream))
                _settle(rec, await stream.get_final_message())

        yield handle


def main() -> int:
    return run_client("anthropic-messages", session)


if __name__ == "__main__":
    raise SystemExit(main())
