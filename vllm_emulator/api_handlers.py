"""The Responses API and Anthropic Messages routes of vLLM 0.32 (aiohttp), over the engine.

`POST /v1/responses` (stream or not, `background`), `GET /v1/responses/{id}` (with
`stream=true` and `starting_after=N`), `POST /v1/responses/{id}/cancel`, and
`POST /v1/messages`. The bytes come from apis.py; the engine plans and times the text as
for chat, and the ledger records each request with its API as `endpoint`.

What the store does, as vLLM 0.32's `OpenAIServingResponses` (measured on 0.32.0 with
VLLM_ENABLE_RESPONSES_API_STORE=1; `responses_store: true` here):
- a background response is stored at once with status `queued`, which GET answers until it
  ends (then the final body); a foreground one is stored only when it ends;
- a background stream keeps every event; `GET ...?stream=true&starting_after=N` writes
  events N+1.. and follows the live ones, returning only after `response.completed`: a
  reader that starts after that event, or follows a cancelled response, gets the headers
  and then waits for ever (the quirk the tier checks);
- GET with `stream=true` of a response that has no event store (not a background stream)
  sends the headers and then drops the connection (vLLM's generator raises after the 200);
- cancel of a `queued` background response aborts it and answers the stored body with
  status `cancelled` (output `[]`, usage null); of anything else: 400 "Cannot cancel a
  synchronous response."; of an unknown id: 404.
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass
from typing import Any

from aiohttp import web

from vllm_emulator import apis, wire
from vllm_emulator.apis import ApiRequest, MessagesEncoder, ResponseHead, ResponsesEncoder
from vllm_emulator.engine import Engine, Job
from vllm_emulator.handlers import (
    SseResponse,
    _date,
    _engine,
    _serve_stream,
    _unparsed_entry,
    json_response,
)
from vllm_emulator.ledger import Api
from vllm_emulator.validation import ApiError, _as_bool, _as_int, _validation_error


@dataclass
class Stored:
    """One response in the store: its job and how GET answers it."""

    job: Job
    head: ResponseHead
    item_id: str
    cancelled: bool = False

    def body(self) -> bytes:
        job = self.job
        entry = job.entry
        if self.cancelled:
            return wire.dumps(self.head.body("cancelled", [], None)).encode()
        if job.state == "running" or not job.done.is_set():
            return wire.dumps(self.head.body("queued", [], None)).encode()
        if job.state == "failed":
            # vLLM marks a failed background request `failed`; a failed background stream's
            # task dies without touching the store, which keeps saying `queued`.
            status = "queued" if job.retain else "failed"
            return wire.dumps(self.head.body(status, [], None)).encode()
        return apis.response_body(self.head, self.item_id, entry.texts[0] if entry.texts else "",
                                  entry.finish_reason, entry.prompt_tokens,
                                  entry.completion_tokens, entry.stream)  # fmt: skip


async def _admit(
    request: web.Request, api: Api, parse: Any
) -> tuple[Engine, ApiRequest, float] | web.Response:
    engine = _engine(request)
    received = time.time()
    raw = await request.read()
    try:
        admitted: ApiRequest = parse(raw)
    except ApiError as error:
        entry = _unparsed_entry(engine, "chat", raw, received, request.headers.get("X-Request-Id"),
                                error.status)  # fmt: skip
        entry.endpoint = api
        entry.finished_at = time.time()
        return json_response(error.status, error.body)
    return engine, admitted, received


async def _wait(engine: Engine, job: Job, api: Api) -> web.Response | None:
    """Wait for a non-streaming request to end; its error answer if generation failed."""
    try:
        await job.done.wait()
    except asyncio.CancelledError:
        engine.client_left(job)
        raise
    if job.state != "failed":
        return None
    message, error_type, code = wire.failure("completions", engine.config.fail_kind)
    if api == "messages":
        body = apis.anthropic_error_body(message, error_type)
    else:
        body = wire.error_body(engine.config.profile, message, error_type, code)
    job.entry.status = code
    return json_response(code, body)


async def create_response(request: web.Request) -> web.StreamResponse:
    config = _engine(request).config
    admitted = await _admit(
        request,
        "responses",
        lambda raw: apis.parse_responses(
            config.profile,
            request.headers.get("Content-Type", ""),
            raw,
            config.model,
            config.max_model_len,
            config.responses_store,
            request.headers.get("X-Request-Id"),
            config.natural_ends,
        ),
    )
    if isinstance(admitted, web.Response):
        return admitted
    engine, api, received = admitted
    previous = api.body.get("previous_response_id")
    if previous is not None and previous not in engine.stored:
        # vLLM looks the previous response up in its store (which it continues from; the
        # emulator's text does not depend on it): unknown, or no store, is a 404.
        return json_response(404, apis.not_found_body(str(previous)))
    parsed = api.parsed
    response_id = "resp_" + engine.new_id()
    item_id = "msg_" + engine.new_id()
    created = config.created if config.created is not None else int(received)
    head = ResponseHead(response_id, created, parsed.model, api.body, api.background,
                        api.max_output_tokens)  # fmt: skip
    encoder = ResponsesEncoder(head, item_id, parsed.prompt_tokens)
    job = engine.start(parsed, received, "responses", response_id, encoder, api.background)
    job.entry.status = 200
    job.entry.max_tokens = api.max_output_tokens
    stored = Stored(job, head, item_id)
    if api.background:
        engine.stored[response_id] = stored
    elif api.store:
        job.done_callbacks.append(lambda: engine.stored.setdefault(response_id, stored))
    if parsed.stream:
        job.prime(encoder.start())
        return await _serve_stream(engine, job, request, 0, {}, replay=api.background)
    if api.background:
        return json_response(200, stored.body())
    failed = await _wait(engine, job, "responses")
    if failed is not None:
        return failed
    body = stored.body()
    job.entry.bytes_written = len(body)
    job.entry.delivered_tokens = job.entry.completion_tokens
    return json_response(200, body)


def _query_errors(request: web.Request) -> tuple[bool, int | None]:
    """`stream` and `starting_after` as FastAPI parses query parameters."""
    errors: list[dict[str, Any] | str] = []
    stream = False
    starting_after: int | None = None
    raw_stream = request.query.get("stream")
    if raw_stream is not None:
        value, problem = _as_bool(raw_stream)
        if problem:
            errors.append({"type": problem["type"], "loc": ("query", "stream"),
                           "msg": problem["msg"], "input": raw_stream})  # fmt: skip
        stream = bool(value)
    raw_after = request.query.get("starting_after")
    if raw_after is not None:
        starting_after, problem = _as_int(raw_after)
        if problem:
            errors.append({"type": problem["type"], "loc": ("query", "starting_after"),
                           "msg": problem["msg"], "input": raw_after})  # fmt: skip
    if errors:
        raise _validation_error("vllm-0.32", errors)
    return stream, starting_after


async def retrieve_response(request: web.Request) -> web.StreamResponse:
    engine = _engine(request)
    response_id = request.match_info["response_id"]
    try:
        stream, starting_after = _query_errors(request)
    except ApiError as error:
        return json_response(error.status, error.body)
    stored: Stored | None = engine.stored.get(response_id)
    if stored is None:
        return json_response(404, apis.not_found_body(response_id))
    if not stream:
        return json_response(200, stored.body())
    job = stored.job
    if not job.retain:
        # No event store for it: vLLM's generator raises once the 200 is out.
        headers = {"date": _date(), "server": "uvicorn", "content-type": wire.SSE_CONTENT_TYPE}
        resp = SseResponse(status=200, headers=headers)
        await resp.prepare(request)
        if request.transport is not None:
            request.transport.abort()
        return resp
    after = 0 if starting_after is None else max(0, starting_after + 1)
    job.entry.resumes += 1
    job.entry.resumed_from = starting_after
    return await _serve_stream(engine, job, request, after, {}, replay=True)


async def cancel_response(request: web.Request) -> web.Response:
    engine = _engine(request)
    response_id = request.match_info["response_id"]
    stored: Stored | None = engine.stored.get(response_id)
    if stored is None:
        return json_response(404, apis.not_found_body(response_id))
    if stored.cancelled or not stored.job.background or stored.job.done.is_set():
        return json_response(400, apis.cannot_cancel_body())
    stored.cancelled = True
    engine.cancel(stored.job)
    return json_response(200, stored.body())


async def create_message(request: web.Request) -> web.StreamResponse:
    config = _engine(request).config
    admitted = await _admit(
        request,
        "messages",
        lambda raw: apis.parse_messages(
            config.profile,
            request.headers.get("Content-Type", ""),
            raw,
            config.model,
            config.max_model_len,
            request.headers.get("X-Request-Id"),
            config.natural_ends,
        ),
    )
    if isinstance(admitted, web.Response):
        return admitted
    engine, api, received = admitted
    parsed = api.parsed
    message_id = "chatcmpl-" + engine.new_id()  # the chat request's id, as vLLM converts
    encoder = MessagesEncoder(message_id, parsed.model, parsed.prompt_tokens)
    job = engine.start(parsed, received, "messages", message_id, encoder)
    job.entry.status = 200
    job.entry.max_tokens = api.max_output_tokens
    if parsed.stream:
        return await _serve_stream(engine, job, request, 0, {})
    failed = await _wait(engine, job, "messages")
    if failed is not None:
        return failed
    entry = job.entry
    body = apis.messages_body(message_id, parsed.model, entry.texts[0] if entry.texts else "",
                              entry.finish_reason, parsed.prompt_tokens,
                              entry.completion_tokens)  # fmt: skip
    entry.bytes_written = len(body)
    entry.delivered_tokens = entry.completion_tokens
    return json_response(200, body)


def add_routes(app: web.Application) -> None:
    app.router.add_post("/v1/responses", create_response)
    app.router.add_get("/v1/responses/{response_id}", retrieve_response)
    app.router.add_post("/v1/responses/{response_id}/cancel", cancel_response)
    app.router.add_post("/v1/messages", create_message)
