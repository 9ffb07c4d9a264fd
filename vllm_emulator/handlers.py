"""vLLM's HTTP routes (aiohttp) over the engine: requests in, frames and JSON bodies out.

Handlers only write: one `resp.write()` per frame, so each frame is its own HTTP/1.1
chunk, as Starlette's StreamingResponse does with each `yield` of vLLM's generator.
Headers are uvicorn's (`date`, `server: uvicorn`, lower-case `transfer-encoding`), and the
200 goes out before the first token, as in vLLM. A disconnect cancels the handler (the
server runs with handler cancellation, serve.py), which tells the engine the client left.
Also here: resumable streams (`GET /v1/streams/{id}`, or the POST again with `X-Stream-Id`
and `Last-Event-ID`) and cassette replay.
"""

from __future__ import annotations

import asyncio
import email.utils
import itertools
import json
import time

from aiohttp import web
from aiohttp.client_exceptions import ClientConnectionResetError

from vllm_emulator import wire
from vllm_emulator.cassette import Cassette, load_cassette
from vllm_emulator.config import EmulatorConfig
from vllm_emulator.engine import Engine, Job
from vllm_emulator.ledger import LedgerEntry
from vllm_emulator.schedule import KeepAlive
from vllm_emulator.validation import ApiError, parse
from vllm_emulator.wire import Choice, Endpoint, Usage


def _date() -> str:
    return email.utils.formatdate(usegmt=True)


def json_response(status: int, body: bytes, extra: dict[str, str] | None = None) -> web.Response:
    """Starlette's JSONResponse as served by uvicorn: date, server, length, type."""
    headers = {"date": _date(), "server": "uvicorn", "content-length": str(len(body)),
               "content-type": wire.JSON_CONTENT_TYPE, **(extra or {})}  # fmt: skip
    return web.Response(status=status, body=body, headers=headers)


class SseResponse(web.StreamResponse):
    """A chunked response whose header names are lower-case, as uvicorn writes them.

    aiohttp names the header it adds `Transfer-Encoding`; uvicorn sends
    `transfer-encoding`. Header names are case-insensitive, but a byte-exact
    upstream lets byte-matching faults and journals compare like with like.
    """

    async def _write_headers(self) -> None:
        encoding = self._headers.popall("Transfer-Encoding", [])
        for value in encoding:
            self._headers.add("transfer-encoding", value)
        await super()._write_headers()


ENGINE_KEY = web.AppKey("engine", Engine)
CASSETTE_KEY = web.AppKey("cassette", Cassette)


def _engine(request: web.Request) -> Engine:
    return request.app[ENGINE_KEY]


async def _write(resp: web.StreamResponse, entry: LedgerEntry, data: bytes) -> None:
    await resp.write(data)
    entry.bytes_written += len(data)
    entry.write_times.append(time.time())


class _BrokenOff(Exception):
    """The stream ends without its terminating chunk: the connection is dropped."""


class _Evicted(Exception):
    """Frames a live reader had not got yet were evicted from the resume buffer."""


TERMINAL = b"event: response.completed\n"


async def _stream_frames(
    engine: Engine, job: Job, resp: web.StreamResponse, after: int, replay: bool = False
) -> None:
    """Write the job's frames after event `after` as they come, with keep-alives.

    `replay`: a background response's event store, read as vLLM's
    `responses_background_stream_generator` reads it: it returns only after writing
    `response.completed`, and otherwise waits for another event, so a reader that starts
    after that event, or follows a cancelled response, waits for ever (the headers went out,
    no byte follows: seen on vLLM 0.32.0, docs/emulator.md)."""
    config = engine.config
    resumable = job.retain
    wrote_terminal = False
    entry = job.entry
    loop = asyncio.get_running_loop()
    keep = KeepAlive(config.sse_keep_alive_interval, loop.time())
    wake = asyncio.Event()
    job.watchers.add(wake)
    position = after
    try:
        while True:
            wake.clear()
            if not resumable:
                job.pull(False, 0)
            first = job.log[0][0] if job.log else position + 1
            if position + 1 < first:
                raise _Evicted  # this reader lagged past the resume buffer
            # Event ids are consecutive, so the frames after `position` start at this index.
            for event_id, data, tokens in list(
                itertools.islice(job.log, max(0, position + 1 - first), None)
            ):
                await _write(resp, entry, data)
                wrote_terminal = wrote_terminal or data.startswith(TERMINAL)
                position = event_id
                entry.delivered_tokens = max(entry.delivered_tokens, tokens)
                keep.wrote(loop.time())
            if not resumable:
                job.trim(position)
            if replay and wrote_terminal:
                break
            if job.closed and position >= job.next_event_id - 1 and not replay:
                break
            deadline = keep.deadline()
            if deadline is None:
                await wake.wait()
                continue
            try:
                await asyncio.wait_for(wake.wait(), max(0.0, deadline - loop.time()))
            except TimeoutError:
                await _write(resp, entry, wire.KEEP_ALIVE)
                keep.wrote(loop.time())
    finally:
        job.watchers.discard(wake)
    if job.state == "failed" and job.entry.endpoint == "responses":
        raise _BrokenOff  # vLLM 0.32 cannot write its error as a Responses event (apis.py)
    if job.state != "aborted":
        await resp.write_eof()


async def _serve_stream(
    engine: Engine,
    job: Job,
    request: web.Request,
    after: int,
    extra: dict[str, str],
    replay: bool = False,
) -> web.StreamResponse:
    headers = {"date": _date(), "server": "uvicorn", "content-type": wire.SSE_CONTENT_TYPE,
               **extra}  # fmt: skip
    resp = SseResponse(status=200, headers=headers)
    try:
        await resp.prepare(request)  # the 200 and headers go out before TTFT, as in vLLM
        await _stream_frames(engine, job, resp, after, replay)
    except asyncio.CancelledError:
        engine.client_left(job)
        raise
    except (ConnectionResetError, ClientConnectionResetError):
        engine.client_left(job)
    except _BrokenOff:
        if request.transport is not None:
            request.transport.abort()
    except _Evicted:
        # Cut the connection rather than end it cleanly over a gap; the client can
        # resume and will be told the events are gone.
        if request.transport is not None:
            request.transport.abort()
        engine.client_left(job)
    return resp


async def _generate(request: web.Request, endpoint: Endpoint) -> web.StreamResponse:
    engine = _engine(request)
    config = engine.config
    received = time.time()
    raw = await request.read()
    if CASSETTE_KEY in request.app:
        cassette = request.app[CASSETTE_KEY]
        return await _serve_cassette(engine, cassette, request, endpoint, raw, received)
    header_id = request.headers.get("X-Request-Id")
    extra = {"x-request-id": header_id} if header_id and config.enable_request_id_headers else {}
    try:
        parsed = parse(
            config.profile,
            endpoint,
            request.headers.get("Content-Type", ""),
            raw,
            config.model,
            config.max_model_len,
            config.default_max_tokens,
            header_id,
        )
    except ApiError as error:
        entry = _unparsed_entry(engine, endpoint, raw, received, header_id, error.status)
        entry.finished_at = time.time()
        return json_response(error.status, error.body, extra)
    queue_limit = config.max_num_queued_reqs
    if queue_limit is not None and engine.scheduler.num_waiting >= queue_limit:
        body = wire.error_body(config.profile, wire.QUEUE_FULL_MESSAGE, "Service Unavailable", 503)
        entry = _unparsed_entry(engine, endpoint, raw, received, header_id, 503)
        entry.finished_at = time.time()
        return json_response(503, body, extra)
    job = engine.start(parsed, received)
    job.entry.status = 200
    if config.enable_request_id_headers and not extra:
        extra = {"x-request-id": job.entry.request_id}
    if parsed.stream:
        if job.entry.stream_id is not None:
            extra["x-stream-id"] = job.entry.stream_id
        return await _serve_stream(engine, job, request, 0, extra)
    try:
        await job.done.wait()
    except asyncio.CancelledError:
        engine.client_left(job)
        raise
    if job.state == "failed":
        # Without a stream the exception mapping runs, as for completions (§2.1).
        message, error_type, code = wire.failure("completions", config.fail_kind)
        body = wire.error_body(config.profile, message, error_type, code)
        job.entry.status = code
        job.entry.bytes_written = len(body)
        return json_response(code, body, extra)
    choices = [
        Choice(i, plan.text, plan.finish_reason, plan.stop_reason)
        if planned is None
        else wire.agent_choice(i, planned)
        for i, (plan, planned) in enumerate(zip(job.plans, job.agents, strict=True))
    ]
    usage = Usage(parsed.prompt_tokens, job.entry.completion_tokens)
    build = wire.chat_response if endpoint == "chat" else wire.completion_response
    created = config.created if config.created is not None else int(received)
    body = build(config.profile, job.entry.id or "", created, parsed.model, choices, usage,
                 engine.fingerprint)  # fmt: skip
    job.entry.bytes_written = len(body)
    job.entry.delivered_tokens = job.entry.completion_tokens
    return json_response(200, body, extra)


def _unparsed_entry(
    engine: Engine, endpoint: Endpoint, raw: bytes, received: float, rid: str | None, status: int
) -> LedgerEntry:
    """A ledger entry for a request the engine does not generate for (rejected, cassette)."""
    try:
        body = json.loads(raw)
    except ValueError:
        body = None
    body = body if isinstance(body, dict) else {}
    max_tokens = body.get("max_tokens")
    entry = LedgerEntry(
        request_id=rid or engine.new_id(),
        endpoint=endpoint,
        model=body.get("model") if isinstance(body.get("model"), str) else None,
        stream=body.get("stream") is True,
        prompt=body.get("messages" if endpoint == "chat" else "prompt"),
        prompt_tokens=0,
        max_tokens=max_tokens if isinstance(max_tokens, int) else None,
        received_at=received,
        status=status,
    )
    engine.ledger.append(entry)
    return entry


def _resume_request(request: web.Request) -> str | None:
    """The stream a re-sent POST asks to resume: `X-Stream-Id` plus `Last-Event-ID`.

    Gateways that make streams resumable accept the original request again with these
    headers (the form the resilient client and EventSource-style retries use) as well as
    `GET /v1/streams/{id}`; both land in the same replay.
    """
    if not _engine(request).config.resumable:
        return None
    stream_id = request.headers.get("X-Stream-Id")
    if stream_id and "Last-Event-ID" in request.headers:
        return stream_id
    return None


async def chat_completions(request: web.Request) -> web.StreamResponse:
    stream_id = _resume_request(request)
    if stream_id is not None:
        return await _resume(request, stream_id)
    return await _generate(request, "chat")


async def completions(request: web.Request) -> web.StreamResponse:
    stream_id = _resume_request(request)
    if stream_id is not None:
        return await _resume(request, stream_id)
    return await _generate(request, "completions")


async def resume_stream(request: web.Request) -> web.StreamResponse:
    """GET /v1/streams/{stream_id} with `Last-Event-ID`: replay the buffer, then follow."""
    return await _resume(request, request.match_info["stream_id"])


async def _resume(request: web.Request, stream_id: str) -> web.StreamResponse:
    engine = _engine(request)
    profile = engine.config.profile
    job = engine.find_stream(stream_id) if engine.config.resumable else None
    if job is None:
        message = (
            f"Stream `{stream_id}` is unknown or has expired (streams are kept "
            f"{engine.config.resume_ttl:g}s after they end; resumable streams are "
            f"{'on' if engine.config.resumable else 'off'})."
        )
        return json_response(404, wire.error_body(profile, message, "NotFoundError", 404,
                                                  "stream_id"))  # fmt: skip
    raw_last = request.headers.get("Last-Event-ID", "0").strip() or "0"
    try:
        last = int(raw_last)
    except ValueError:
        message = f"Last-Event-ID must be an event id (an integer), got {raw_last!r}."
        return json_response(400, wire.error_body(profile, message, "BadRequestError", 400,
                                                  "Last-Event-ID"))  # fmt: skip
    oldest = job.log[0][0] if job.log else job.next_event_id
    if last + 1 < oldest:
        message = (
            f"Events {last + 1}..{oldest - 1} of stream `{stream_id}` are no longer buffered "
            f"(resume_buffer_size={engine.config.resume_buffer_size} bytes); restart the request."
        )
        return json_response(409, wire.error_body(profile, message, "ConflictError", 409,
                                                  "Last-Event-ID"))  # fmt: skip
    job.entry.resumed_from = last
    job.entry.resumes += 1
    return await _serve_stream(engine, job, request, last, {"x-stream-id": stream_id})


async def _serve_cassette(
    engine: Engine,
    cassette: Cassette,
    request: web.Request,
    endpoint: Endpoint,
    raw: bytes,
    received: float,
) -> web.StreamResponse:
    """Replay a recorded response: its status, headers and writes at their offsets."""
    rid = request.headers.get("X-Request-Id")
    entry = _unparsed_entry(engine, endpoint, raw, received, rid, cassette.status)
    entry.cassette = True
    headers = cassette.headers
    chunked = any(k.lower() == "transfer-encoding" and "chunked" in v.lower() for k, v in headers)
    kept = [(k, v) for k, v in headers if k.lower() not in ("transfer-encoding", "content-length")]
    writes = cassette.writes
    resp = web.StreamResponse(status=entry.status or 200, headers=dict(kept))
    if chunked:
        resp.enable_chunked_encoding()
    else:
        resp.content_length = sum(len(data) for _, data in writes)
    start = asyncio.get_running_loop().time()
    try:
        await resp.prepare(request)
        for offset, data in writes:
            delay = start + offset - asyncio.get_running_loop().time()
            if delay > 0:
                await asyncio.sleep(delay)
            await _write(resp, entry, data)
        await resp.write_eof()
        entry.finished_at = time.time()
    except (asyncio.CancelledError, ConnectionResetError, ClientConnectionResetError):
        entry.disconnected_at = time.time()
        raise
    return resp


async def models(request: web.Request) -> web.Response:
    config = _engine(request).config
    created = int(time.time())
    card = {
        "id": config.model, "object": "model", "created": created, "owned_by": "vllm",
        "root": config.model, "parent": None, "max_model_len": config.max_model_len,
        "permission": [{
            "id": f"modelperm-{_engine(request).new_id()}", "object": "model_permission",
            "created": created, "allow_create_engine": False, "allow_sampling": True,
            "allow_logprobs": True, "allow_search_indices": False, "allow_view": True,
            "allow_fine_tuning": False, "organization": "*", "group": None,
            "is_blocking": False,
        }],
    }  # fmt: skip
    return json_response(200, wire.dumps({"object": "list", "data": [card]}).encode())


async def health(request: web.Request) -> web.Response:
    return web.Response(status=200, headers={"date": _date(), "server": "uvicorn"})


async def version(request: web.Request) -> web.Response:
    profile = _engine(request).config.profile
    return json_response(200, wire.dumps({"version": wire.VLLM_VERSION[profile]}).encode())


async def metrics(request: web.Request) -> web.Response:
    text = _engine(request).render_metrics()
    return web.Response(
        status=200,
        body=text.encode(),
        headers={"date": _date(), "server": "uvicorn",
                 "content-type": "text/plain; version=0.0.4; charset=utf-8"},
    )  # fmt: skip


async def ledger(request: web.Request) -> web.Response:
    entries = [entry.to_json() for entry in _engine(request).ledger]
    return json_response(200, wire.dumps({"requests": entries}).encode())


async def reset(request: web.Request) -> web.Response:
    _engine(request).reset()
    return json_response(200, b'{"reset":true}')


async def _middleware_headers(request: web.Request, response: web.StreamResponse) -> None:
    """vLLM's middleware headers (wire.middleware_headers), after the handler's own.

    Runs once the response's headers are prepared; SseResponse then moves
    `transfer-encoding` last, as uvicorn writes it. A cassette's recorded ones stay.
    """
    for name, value in wire.middleware_headers(_engine(request).config.profile):
        if name not in response.headers:
            response.headers[name] = value


def make_app(config: EmulatorConfig) -> web.Application:
    app = web.Application(client_max_size=64 * 1024 * 1024)
    app[ENGINE_KEY] = Engine(config)
    if config.cassette:
        # read and checked once, at start: a bad file is refused here, not in every request
        app[CASSETTE_KEY] = load_cassette(config.cassette)
    app.on_response_prepare.append(_middleware_headers)
    app.router.add_post("/v1/chat/completions", chat_completions)
    app.router.add_post("/v1/completions", completions)
    app.router.add_get("/v1/streams/{stream_id}", resume_stream)
    app.router.add_get("/v1/models", models)
    app.router.add_get("/health", health)
    app.router.add_get("/version", version)
    app.router.add_get("/metrics", metrics)
    app.router.add_get("/emulator/requests", ledger)
    app.router.add_post("/emulator/reset", reset)
    return app
