"""inband_error: an error frame in the event stream after N events, as a server that
fails mid-generation sends it, in the error shape of the API the request asked.

Once vLLM's `StreamingResponse` has begun, the 200 and the headers are on the wire, so
a later failure (an engine error, a KV-load failure, `EngineDeadError`) can only be
reported inside the stream. Clients must notice it although the status said 200: the
OpenAI SDK raises `APIError` on a chat data frame with an `error` key and on a Responses
`error` event, the anthropic SDK raises on `event: error`; naive clients print the error
as text or take the stream as complete.

The frame is written in the dialect of the request's API (`middlebox.core.dialects`:
`POST /v1/chat/completions` or `/v1/completions`, `/v1/responses` or a `GET
/v1/responses/{id}?stream=true` replay, `/v1/messages`; a path that names none reads the
stream's events by their shape), and `shape` says whose server writes it. Left unset, the
dialect's own: `vllm` on chat, completions and Messages, `openai` on Responses.

- Chat and completions: one `data: {"error": {...}}` frame (reference §2.3):
  - `vllm`: 0.33 chat, compact pydantic JSON, `{"error":{"message":"Internal server
    error","type":"InternalServerError","param":null,"code":500}}`;
  - `vllm-spaced`: 0.33 completions and 0.10.1-0.11 (`json.dumps`, spaced; 0.10.1-0.11
    report BadRequestError/400 whatever the failure, set `error_type`/`code` for that);
  - `vllm-legacy`: up to 0.10.0, with `"object": "error"` inside and BadRequestError/400;
  - `openai`: OpenAI's `server_error` frame (spaced, `code: null`).
- Responses: a named event carrying the next `sequence_number` (one past the last the
  stream carried; before any, 0, or N+1 on a replay `starting_after=N`), as the OpenAI
  API writes it and openai-python types it:
  - `openai`: `event: error` + `{"type":"error","code":"server_error","message":...,
    "param":null,"sequence_number":N}` (`ResponseErrorEvent`);
  - `openai-failed`: `event: response.failed` + `{"type":"response.failed",
    "sequence_number":N,"response":{...,"status":"failed","error":{"code":"server_error",
    "message":...},...}}` (`ResponseFailedEvent`; the response is the one
    `response.created` announced, failed).
  `error_type` sets the error's `code` (a string in this API); `code` is not used.
  vLLM's own Responses serving has no error event to write, as its source reads
  (`openai/responses/serving.py`: a `GenerationError` becomes the chat error body, which is
  then validated as a streaming event that no event type of its union accepts), so its
  stream would end without a terminal event: that is `cut` with `end: truncated_chunked`.
- Messages: `event: error` + `{"type":"error","error":{"type":...,"message":...}}`:
  - `vllm`: vLLM's Anthropic converter (`entrypoints/anthropic/serving.py`: an exception
    while converting the chat stream becomes `AnthropicError(type="internal_error",
    message=str(e))`, compact pydantic JSON; the message defaults to "Internal server
    error" here, where vLLM puts the exception's text);
  - `anthropic`: the Anthropic API's (spaced, `overloaded_error`, "Overloaded").
  `error_type` sets the error's `type`; `code` is not used.
A shape of another dialect (`anthropic` on a chat stream, `vllm-spaced` on Messages)
writes the dialect's own; the report names the dialect and the shape written.

`events` counts dispatched data events of the response, `[DONE]` excluded; vLLM's
first chat event is the role chunk (`delta: {"role": "assistant"}`), so `events: 1` fails
before the first token; a Responses stream starts with `response.created` and
`response.in_progress`, a Messages stream with `message_start`. `after_tool_fragments: N`
instead injects the frame after the event carrying the Nth tool-call argument fragment
(chat `function.arguments`, Responses `response.function_call_arguments.delta`, Messages
`input_json_delta`): the server fails in the middle of a tool call, whose arguments are
not valid JSON yet (a client that executes what it has acts on a partial call).

After the frame: `then: done` ends the stream as the dialect's server does after an
error, then ends the chunked body with its last chunk: chat and completions send
`data: [DONE]` (vLLM's generators always do), Responses and Messages send nothing more
(the `error` / `response.failed` event is their last: vLLM's Anthropic converter returns
after its error event, and no `message_stop` follows). Then the connection closes both
ways: a server that failed stops generating, and a gateway that fails a stream does not
read the rest of its upstream's response (nginx closes an upstream connection whose
response it did not read to the end; LiteLLM and Envoy close or reset the upstream
stream), so the upstream is told to stop (vLLM aborts on the disconnect) instead of
generating the rest for nobody while the client's next request waits behind it. Such a
gateway keeps the client's connection and takes another upstream one for the next
request; the middlebox has one upstream connection per client connection, so the
client's connection closes after its complete response and its next request opens a new
one, as a keep-alive connection a server closed when idle. `close` ends the connection
without the last chunk (a truncated body) and closes toward the server too, as a proxy
giving up does; `continue` lets the server's events go on (on Responses they keep their
own sequence numbers, so the error's number repeats). Each frame is its own chunk, as
each `yield` is in vLLM. A Content-Length response is left alone (its length is already
on the wire) and reported as skipped.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any, ClassVar, Literal, cast

from faults._lib.checks import check_choice, check_positive
from faults._lib.events import response_dialect
from faults._lib.sse_edit import SseBodyEditor, SseRewriter
from middlebox.core.dialects import Dialect, json_payload, read, starting_after
from middlebox.core.fault import Fault
from middlebox.core.sse import SseEvent, SseKind, SsePiece

__all__ = ["InbandError", "dialect_error_frame", "error_frame"]

Shape = Literal["vllm", "vllm-spaced", "vllm-legacy", "openai", "openai-failed", "anthropic"]
Then = Literal["done", "close", "continue"]

DONE_FRAME = b"data: [DONE]\n\n"

_OPENAI_MESSAGE = "The server had an error while processing your request. Sorry about that!"

# shape -> (message, type, code) by default.
_DEFAULTS: dict[str, tuple[str, str, int | None]] = {
    "vllm": ("Internal server error", "InternalServerError", 500),
    "vllm-spaced": ("Internal server error", "InternalServerError", 500),
    "vllm-legacy": ("Internal server error", "BadRequestError", 400),
    "openai": (_OPENAI_MESSAGE, "server_error", None),
}


def error_frame(
    shape: Shape,
    message: str | None = None,
    error_type: str | None = None,
    code: int | None = None,
) -> bytes:
    """The exact `data: {"error": ...}\\n\\n` frame a `shape` server sends."""
    default_message, default_type, default_code = _DEFAULTS[shape]
    error: dict[str, Any] = {
        "message": message if message is not None else default_message,
        "type": error_type if error_type is not None else default_type,
        "param": None,
        "code": code if code is not None else default_code,
    }
    if shape == "vllm-legacy":
        error = {"object": "error", **error}
    if shape == "vllm":
        text = json.dumps({"error": error}, ensure_ascii=False, separators=(",", ":"))
    else:
        text = json.dumps({"error": error})
    return b"data: " + text.encode() + b"\n\n"


# The shapes each dialect writes, its own first (the one an unset or foreign shape gets).
SHAPES: dict[Dialect, tuple[str, ...]] = {
    Dialect.CHAT: ("vllm", "vllm-spaced", "vllm-legacy", "openai"),
    Dialect.COMPLETIONS: ("vllm", "vllm-spaced", "vllm-legacy", "openai"),
    Dialect.RESPONSES: ("openai", "openai-failed"),
    Dialect.MESSAGES: ("vllm", "anthropic"),
}


def shape_for(dialect: Dialect, shape: str | None) -> str:
    """The shape written on a `dialect` stream when `shape` is asked (module docstring)."""
    shapes = SHAPES[dialect]
    return shape if shape in shapes else shapes[0]


def _compact(payload: dict[str, Any]) -> str:
    return json.dumps(payload, ensure_ascii=False, separators=(",", ":"))


def dialect_error_frame(
    dialect: Dialect,
    shape: str | None = None,
    message: str | None = None,
    error_type: str | None = None,
    code: int | None = None,
    *,
    sequence: int = 0,
    response: dict[str, Any] | None = None,
) -> bytes:
    """The exact error event a `shape` server writes on a `dialect` stream (one SSE event
    with its blank line). On Responses, `sequence` is its `sequence_number` and `response`
    the response object the stream announced (`response.created`), which a
    `response.failed` event carries with `status: failed` and the error."""
    shape = shape_for(dialect, shape)
    if dialect in (Dialect.CHAT, Dialect.COMPLETIONS):
        return error_frame(cast(Shape, shape), message, error_type, code)
    if dialect is Dialect.RESPONSES:
        error_code = error_type if error_type is not None else "server_error"
        text = message if message is not None else _OPENAI_MESSAGE
        if shape == "openai":
            payload: dict[str, Any] = {
                "type": "error",
                "code": error_code,
                "message": text,
                "param": None,
                "sequence_number": sequence,
            }
        else:
            failed = {"id": "resp_0", "object": "response", "output": [], **(response or {})}
            failed.update(
                status="failed",
                error={"code": error_code, "message": text},
                incomplete_details=None,
            )
            payload = {"type": "response.failed", "sequence_number": sequence}
            payload["response"] = failed
        name = str(payload["type"])
        return f"event: {name}\ndata: {_compact(payload)}\n\n".encode()
    kind, text = ("overloaded_error", "Overloaded") if shape == "anthropic" else (
        "internal_error", "Internal server error")  # fmt: skip
    error = {
        "type": error_type if error_type is not None else kind,
        "message": message if message is not None else text,
    }
    payload = {"type": "error", "error": error}
    data = json.dumps(payload) if shape == "anthropic" else _compact(payload)
    return f"event: error\ndata: {data}\n\n".encode()


@dataclass
class InbandError(SseRewriter, Fault):
    """After `events` data events of a matched response, inject an error frame."""

    name: ClassVar[str] = "inband_error"

    events: int = 3
    shape: Shape | None = None
    message: str | None = None
    error_type: str | None = None
    code: int | None = None
    then: Then = "done"
    after_tool_fragments: int | None = None

    _seen: int = field(init=False, repr=False, compare=False, default=0)
    _fragments: int = field(init=False, repr=False, compare=False, default=0)
    _injected: bool = field(init=False, repr=False, compare=False, default=False)
    _dialect: Dialect | None = field(init=False, repr=False, compare=False, default=None)
    _shown: Dialect | None = field(init=False, repr=False, compare=False, default=None)
    _sequence: int | None = field(init=False, repr=False, compare=False, default=None)
    _response: dict[str, Any] | None = field(init=False, repr=False, compare=False, default=None)

    def __post_init__(self) -> None:
        check_positive("events", self.events, allow_zero=True)
        if self.after_tool_fragments is not None and self.after_tool_fragments < 1:
            raise ValueError(
                f"after_tool_fragments must be at least 1, got {self.after_tool_fragments!r}"
            )
        if self.shape is not None:
            check_choice("shape", self.shape, Shape)
        check_choice("then", self.then, Then)

    @property
    def dialect(self) -> Dialect:
        """The edited stream's dialect: its request's, else what its events showed (chat
        before any)."""
        return self._dialect or self._shown or Dialect.CHAT

    @property
    def frame(self) -> bytes:
        """The error event for the edited stream, as it stands now."""
        return dialect_error_frame(
            self.dialect,
            self.shape,
            self.message,
            self.error_type,
            self.code,
            sequence=0 if self._sequence is None else self._sequence + 1,
            response=self._response,
        )

    def begin(self, editor: SseBodyEditor, now: float) -> None:
        self._seen = self._fragments = 0
        self._injected = False
        self._dialect = response_dialect(self._flow.position.up, self.response_index)
        self._shown = self._response = None
        # A replay of a background response (`starting_after=N`) goes on from N+1.
        asked = self.request(self.response_index)
        self._sequence = None if asked is None else starting_after(asked.method, asked.target)
        if self.events == 0 and self.after_tool_fragments is None:
            self._inject(editor, 0, now)

    def edit(self, editor: SseBodyEditor, line: SsePiece, now: float) -> None:
        if line.kind is SseKind.BLANK and line.event is not None and not line.event.is_done:
            self._seen += 1
            meaning = read(line.event, self._dialect)
            self._shown = self._shown or meaning.dialect
            self._fragments += meaning.tool_fragments
            if meaning.sequence is not None:
                self._sequence = meaning.sequence
            if self._response is None and self.dialect is Dialect.RESPONSES:
                self._response = _announced(line.event)
            if self.after_tool_fragments is None:
                reached = self._seen == self.events
            else:
                reached = not self._injected and self._fragments >= self.after_tool_fragments
            if reached:
                self._inject(editor, line.offset + len(line.data), now)

    def _inject(self, editor: SseBodyEditor, offset: int, now: float) -> None:
        self._injected = True
        editor.insert(offset, self.frame)
        details = {"tool_fragments": self._fragments} if self.after_tool_fragments else {}
        self.report(
            now,
            "injected",
            request=self.request_index,
            message=self.response_index,
            event=self._seen,
            body_offset=offset,
            then=self.then,
            dialect=self.dialect.value,
            shape=shape_for(self.dialect, self.shape),
            **details,
        )
        if self.then == "done" and self.dialect in (Dialect.CHAT, Dialect.COMPLETIONS):
            editor.insert(offset, DONE_FRAME)
        if self.then != "continue":
            # both close the upstream leg, so the model stops (module docstring)
            self.cut(editor, offset, last_chunk=self.then == "done", close=True)


def _announced(event: SseEvent) -> dict[str, Any] | None:
    """The response object a Responses event carries (`response.created` does)."""
    payload = json_payload(event)
    response = payload.get("response") if payload is not None else None
    return response if isinstance(response, dict) else None
