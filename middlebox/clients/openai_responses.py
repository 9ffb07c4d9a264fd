"""`openai-responses`, `openai-responses-resume` and `openai-responses-restart`: the openai
SDK's Responses streaming.

`openai-responses` is the SDK's README: `AsyncOpenAI()` with its defaults (600 s read
timeout, 5 s connect, 2 retries before a stream starts), `await
client.responses.create(..., stream=True)`, then `async for event in stream`, each
`response.output_text.delta` shown (reasoning deltas apart from the answer). How the answer
ended comes from the terminal event, read with `middlebox.core.dialects` (the scorer's
rule): `finish_reason` is the response's status (`completed`, `cancelled`) or its
`incomplete_details.reason` (`max_output_tokens`); a `response.failed` or an `error` event
is surfaced as the error. The SDK raises on an RST or a cut chunked body
(`APIConnectionError`), but a stream that closes cleanly before its terminal event simply
ends: this client reports what it had, as the README's loop would (a silent truncation
when nothing says otherwise).

`openai-responses-resume` follows OpenAI's guide for background responses: create with
`background=True, store=True, stream=True`, remember the response id (from
`response.created`) and the last `sequence_number` seen, and when the stream breaks
(raises, or ends before its terminal event) reconnect with `client.responses.retrieve(id,
stream=True, starting_after=<last sequence_number>)`, which replays from the next event
and follows the live stream. An event at or before the cursor is never shown again, so
no text is shown twice. A resume that brings no new event counts toward a bound of
`MAX_IDLE_RESUMES` in a row; then the last error is surfaced. The user who leaves
(`abandon_after_*`) closes the stream and does not cancel the response: the guide's loop
has no cancel, and the server's waste after that is what a scenario measures.

`openai-responses-restart` is what a naive app does with the same background response when
its stream breaks: it never learned to resume, so it creates the response again (a new
`responses.create`, a new response id, a new generation) and keeps showing text on top of
what it had shown, so the user reads the start again, or a different answer from a
sampling server. The first response runs on unwatched in the background (nobody cancels
it). At most `MAX_RESTARTS` creates after the first; then the last error is surfaced.

`attempts` counts HTTP requests through the SDK's `_prepare_request` hook (as `openai`
does); `resumes` counts the `retrieve` reconnects. `saw_done` is always false: Responses
streams have no `[DONE]`.
"""

from __future__ import annotations

import sys
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from typing import Any

import openai

from middlebox.clients.api_requests import meaning, responses_request
from middlebox.clients.contract import ClientEnv, Handler, Recorder, RequestSpec, run_client
from middlebox.clients.openai_sdk import _CountingOpenAI, _current
from middlebox.core.dialects import Dialect, EndKind, Meaning, TokenKind

MAX_IDLE_RESUMES = 3
MAX_RESTARTS = 3


class ResponseFailed(Exception):
    """The stream said the response failed: an `error` event or `response.failed`."""


@dataclass
class Cursor:
    """Where a response stands: its id and the last `sequence_number` shown."""

    response_id: str | None = None
    sequence: int | None = None
    ended: bool = False


def _error_message(payload: dict[str, Any]) -> str:
    error = payload.get("error")
    if not isinstance(error, dict):
        response = payload.get("response")
        error = response.get("error") if isinstance(response, dict) else None
    message = (error or {}).get("message") if isinstance(error, dict) else None
    return str(message or payload.get("message") or "the response failed")


def on_event(event: Any, rec: Recorder, cursor: Cursor) -> None:
    """Show one SDK event and keep the cursor; raise ResponseFailed on a failure."""
    payload = event.to_dict()
    seen = record_event(payload, rec, cursor)
    failed = payload.get("type") in ("error", "response.failed")
    if seen is not None and seen.end is EndKind.ERROR and failed:
        raise ResponseFailed(_error_message(payload))


def record_event(payload: dict[str, Any], rec: Recorder, cursor: Cursor) -> Meaning | None:
    """Show one Responses event (its JSON data) and keep the cursor: the answer's text,
    reasoning apart, and how the answer ended as `finish_reason` with the response's
    usage. Returns what it meant, or None for a replayed event (already shown)."""
    seen = meaning(str(payload.get("type", "")), payload, Dialect.RESPONSES)
    if seen.sequence is not None:
        if cursor.sequence is not None and seen.sequence <= cursor.sequence:
            return None  # replayed: already shown
        cursor.sequence = seen.sequence
    response = payload.get("response")
    if cursor.response_id is None and isinstance(response, dict) and response.get("id"):
        cursor.response_id = str(response["id"])
    if seen.end is not None:
        cursor.ended = True
        rec.finish_reason = seen.reason
        if isinstance(response, dict) and isinstance(response.get("usage"), dict):
            rec.usage = response["usage"]
    if seen.token is TokenKind.ANSWER:
        rec.show(seen.text)
    elif seen.token is TokenKind.REASONING:
        rec.show_reasoning(seen.text)
    return seen


async def _read(stream: Any, rec: Recorder, cursor: Cursor) -> None:
    async with stream:
        async for event in stream:
            on_event(event, rec, cursor)


@asynccontextmanager
async def session(env: ClientEnv) -> AsyncIterator[Handler]:
    async with _CountingOpenAI(base_url=env.base_url, api_key=env.api_key) as client:

        async def handle(spec: RequestSpec, rec: Recorder) -> None:
            _current.set(rec)
            request = responses_request(spec)
            if not spec.streaming:
                answer = (await client.responses.create(**request)).to_dict()
                rec.show(str(answer.get("output_text") or _output_text(answer)))
                rec.finish_reason = _status(answer)
                rec.usage = answer.get("usage")
                return
            await _read(await client.responses.create(**request, stream=True), rec, Cursor())

        yield handle


@asynccontextmanager
async def resuming_session(env: ClientEnv) -> AsyncIterator[Handler]:
    async with _CountingOpenAI(base_url=env.base_url, api_key=env.api_key) as client:

        async def handle(spec: RequestSpec, rec: Recorder) -> None:
            _current.set(rec)
            request = responses_request(spec)
            cursor = Cursor()
            stream = await client.responses.create(
                **request, background=True, store=True, stream=True
            )
            idle = 0
            while True:
                before = cursor.sequence
                error: Exception | None = None
                try:
                    await _read(stream, rec, cursor)
                except openai.APIConnectionError as exc:  # an RST, a cut body, a timeout
                    error = exc
                if cursor.ended:
                    return
                if cursor.response_id is None:
                    raise error or ResponseFailed("the stream ended before response.created")
                idle = 0 if cursor.sequence != before else idle + 1
                if idle >= MAX_IDLE_RESUMES:
                    raise error or ResponseFailed(
                        f"{idle} resumes in a row brought nothing after event {cursor.sequence}"
                    )
                rec.resumes += 1
                options: dict[str, Any] = {"stream": True}
                if cursor.sequence is not None:
                    options["starting_after"] = cursor.sequence
                stream = await client.responses.retrieve(cursor.response_id, **options)

        yield handle


@asynccontextmanager
async def restarting_session(env: ClientEnv) -> AsyncIterator[Handler]:
    async with _CountingOpenAI(base_url=env.base_url, api_key=env.api_key) as client:

        async def handle(spec: RequestSpec, rec: Recorder) -> None:
            _current.set(rec)
            request = responses_request(spec)
            for _ in range(MAX_RESTARTS + 1):
                cursor = Cursor()  # a new response: its own id and sequence numbers
                error: Exception | None = None
                try:
                    stream = await client.responses.create(
                        **request, background=True, store=True, stream=True
                    )
                    await _read(stream, rec, cursor)
                except openai.APIConnectionError as exc:  # an RST, a cut body, a timeout
                    error = exc
                if cursor.ended:
                    return
            raise error or ResponseFailed(f"{MAX_RESTARTS} restarts ended before their end")

        yield handle


def _output_text(answer: dict[str, Any]) -> str:
    texts = []
    for item in answer.get("output") or []:
        for part in item.get("content") or [] if isinstance(item, dict) else []:
            if isinstance(part, dict) and part.get("type") == "output_text":
                texts.append(str(part.get("text") or ""))
    return "".join(texts)


def _status(answer: dict[str, Any]) -> str | None:
    details = answer.get("incomplete_details")
    if isinstance(details, dict) and details.get("reason"):
        return str(details["reason"])
    status = answer.get("status")
    return str(status) if status else None


def main() -> int:
    if "--resume" in sys.argv[1:]:
        return run_client("openai-responses-resume", resuming_session)
    if "--restart" in sys.argv[1:]:
        return run_client("openai-responses-restart", restarting_session)
    return run_client("openai-responses", session)


if __name__ == "__main__":
    raise SystemExit(main())
