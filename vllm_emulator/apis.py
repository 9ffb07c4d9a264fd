"""vLLM 0.32's Responses API (`/v1/responses`) and Anthropic Messages API (`/v1/messages`):
request validation and wire shapes, byte for byte (pure).

Checked against a running vLLM 0.32.0 (CPU, no tool-call or reasoning parser) by
tests/real_vllm/; recordings in tests/core/streams/. What a stream's events mean is
middlebox.core.dialects; this module only writes them.

Responses (vLLM's `openai/responses/serving.py`, `api_router.py`): named events
`event: <type>\\ndata: <json>\\n\\n`, the JSON compact (pydantic's `model_dump_json`) with
`sequence_number` counted from 0 and `type` last. `response.created` and
`response.in_progress` go out before the first token; `response.output_item.added` and
`response.content_part.added` with the first text; one `response.output_text.delta` per
engine output whose text is not empty (`resolve_target_state` skips empty content);
then `output_text.done`, `content_part.done`, `output_item.done` and `response.completed`,
whose `response.status` is `incomplete` with `incomplete_details.reason:
"max_output_tokens"` when the length limit cut it. No `[DONE]`.

Messages (vLLM's `entrypoints/anthropic/serving.py`, which converts its chat stream):
`message_start` at the first engine output, `content_block_start` with the first text,
one `content_block_delta` (`text_delta`) per non-empty output, `content_block_stop`,
`message_delta` (`stop_reason` end_turn / max_tokens, usage), `message_stop`. Errors the
Anthropic handler raises are `{"type":"error","error":{"type","message"}}`; FastAPI's
validation errors keep the OpenAI shape (validation.py).

Without a tool-call parser (the tier's server) vLLM 0.32 streams a Responses function tool
as plain text, whatever `tool_choice`, and rejects a Messages request with tools
(400: `"auto" tool choice requires --enable-auto-tool-choice and --tool-call-parser to be
set`, or `tool_choice=function "f" requires --tool-call-parser to be set`); that is what
this module does. Reasoning is requested but not parsed either (`reasoning` is echoed).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal

from vllm_emulator import textgen, wire
from vllm_emulator.validation import (
    ApiError,
    ParsedRequest,
    _as_bool,
    _as_int,
    _bad_request,
    _validation_error,
    load_body,
)
from vllm_emulator.wire import Profile

Api = Literal["responses", "messages"]

# The background/store switch: vLLM answers this when VLLM_ENABLE_RESPONSES_API_STORE is off
# and a request asks for `background` with `store` (true by default).
STORE_DISABLED_MESSAGE = (
    "This vLLM engine does not support `store=True` and therefore does not support the "
    "background mode. To enable these features, set the environment variable "
    "`VLLM_ENABLE_RESPONSES_API_STORE=1` when launching the vLLM server."
)
CANNOT_CANCEL_MESSAGE = "Cannot cancel a synchronous response."


def named_event(kind: str, payload: dict[str, Any]) -> bytes:
    """`_convert_stream_to_sse_events`: `event: <type>` then the compact JSON."""
    return f"event: {kind}\ndata: {wire.dumps(payload)}\n\n".encode()


def not_found_body(response_id: str) -> bytes:
    message = f"Response with id '{response_id}' not found."
    return wire.error_body("vllm-0.32", message, "invalid_request_error", 404, "response_id")


def cannot_cancel_body() -> bytes:
    return wire.error_body(
        "vllm-0.32", CANNOT_CANCEL_MESSAGE, "invalid_request_error", 400, "response_id"
    )


def anthropic_error_body(message: str, error_type: str) -> bytes:
    """The Anthropic handler's ErrorResponse: type first, then the error's type and message."""
    return wire.dumps({"type": "error", "error": {"type": error_type, "message": message}}).encode()


# ------------------------------------------------------------------------ requests


@dataclass(frozen=True)
class ApiRequest:
    """A valid Responses or Messages request: the chat request it is generated as, and the
    fields the answer echoes."""

    api: Api
    parsed: ParsedRequest
    body: dict[str, Any]
    background: bool = False
    store: bool = False
    max_output_tokens: int | None = None


def _messages_of(value: Any, instructions: Any = None) -> list[dict[str, Any]]:
    messages: list[dict[str, Any]] = []
    if isinstance(instructions, str):
        messages.append({"role": "system", "content": instructions})
    if isinstance(value, str):
        messages.append({"role": "user", "content": value})
    elif isinstance(value, list):
        messages.extend(m for m in value if isinstance(m, dict))
    return messages


def _field_error(
    errors: list[dict[str, Any] | str], body: dict[str, Any], name: str, problem: dict[str, str]
) -> None:
    errors.append({"type": problem["type"], "loc": ("body", name), "msg": problem["msg"],
                   "input": body.get(name)})  # fmt: skip


def _limits(
    profile: Profile,
    name: str,
    requested: int | None,
    prompt_tokens: int,
    max_model_len: int,
    anthropic: bool,
) -> int:
    """The context checks chat makes (validation.parse), under this API's field name."""

    def reject(message: str, param: str) -> ApiError:
        if anthropic:
            return ApiError(400, anthropic_error_body(message, "BadRequestError"))
        return _bad_request(profile, message, param)

    if prompt_tokens >= max_model_len:
        counted = max_model_len + 1  # 0.32 tokenizes with truncation at max_model_len + 1
        raise reject(
            f"This model's maximum context length is {max_model_len} tokens. However, your "
            f"prompt contains at least {counted} input tokens, which exceeds this limit even "
            "without any output tokens. Please reduce the length of the input prompt. "
            f"(parameter=input_tokens, value={counted})",
            "input_tokens",
        )
    if requested is not None and requested > max_model_len:
        raise reject(
            f"{name}={requested} cannot be greater than max_model_len={max_model_len}. "
            f"Please request fewer output tokens. (parameter={name}, value={requested})",
            name,
        )
    room = max_model_len - prompt_tokens
    return room if requested is None else min(requested, room)


def _chat_request(
    body: dict[str, Any],
    messages: list[dict[str, Any]],
    model: str,
    stream: bool,
    max_tokens: int | None,
    limit: int,
    stop: tuple[str, ...],
    prompt_tokens: int,
    request_id: str | None,
    natural_ends: bool = True,
) -> ParsedRequest:
    # Planned as the chat request vLLM renders it into; tools are not planned as calls
    # (no tool-call parser), so only the sampling fields go along. With `natural_ends`
    # (the real-vLLM tier's emulator, whose tiny model stops at EOS) the length limit caps
    # the answer, which otherwise ends at its natural length, unless `ignore_eos` asks for
    # exactly the limit; without it a limit is generated in full, as a chat max_tokens
    # always is here, so a scenario's workload means the same generation in every API.
    if natural_ends and body.get("ignore_eos") is not True:
        max_tokens = None
    chat = {"model": model, "messages": messages}
    for name in ("temperature", "top_p", "seed"):
        if name in body:
            chat[name] = body[name]
    return ParsedRequest(
        endpoint="chat", body=chat, model=model, stream=stream, include_usage=False,
        continuous_usage=False, n=1, max_tokens=max_tokens, limit=limit, stop=stop,
        prompt=messages, prompt_tokens=prompt_tokens, request_id=request_id,
    )  # fmt: skip


def parse_responses(
    profile: Profile,
    content_type: str,
    raw: bytes,
    served_model: str,
    max_model_len: int,
    store_enabled: bool,
    header_request_id: str | None,
    natural_ends: bool = True,
) -> ApiRequest:
    """Validate `POST /v1/responses` as vLLM 0.32 does, or raise ApiError with its answer."""
    body = load_body(profile, content_type, raw)
    errors: list[dict[str, Any] | str] = []
    if "input" not in body:
        errors.append({"type": "missing", "loc": ("body", "input"), "msg": "Field required",
                       "input": body})  # fmt: skip
    elif not isinstance(body["input"], (str, list)):
        _field_error(
            errors, body, "input", {"type": "string_type", "msg": "Input should be a valid string"}
        )
        _field_error(
            errors, body, "input", {"type": "list_type", "msg": "Input should be a valid list"}
        )
    requested: int | None = None
    if body.get("max_output_tokens") is not None:
        requested, problem = _as_int(body["max_output_tokens"])
        if problem:
            _field_error(errors, body, "max_output_tokens", problem)
    flags: dict[str, bool] = {"stream": False, "background": False, "store": True}
    for name in flags:
        if body.get(name) is not None:
            value, problem = _as_bool(body[name])
            if problem:
                _field_error(errors, body, name, problem)
            flags[name] = bool(value)
    if errors:
        raise _validation_error(profile, errors)
    model = body.get("model") or served_model
    if model != served_model:
        message = f"The model `{model}` does not exist. Valid aliases: {served_model}."
        raise ApiError(404, wire.error_body(profile, message, "NotFoundError", 404, "model"))
    if flags["store"] and flags["background"] and not store_enabled:
        body_bytes = wire.error_body(profile, STORE_DISABLED_MESSAGE, "invalid_request_error",
                                     400, "background")  # fmt: skip
        raise ApiError(400, body_bytes)
    messages = _messages_of(body["input"], body.get("instructions"))
    prompt_tokens = textgen.count_prompt_tokens(messages, chat=True)
    limit = _limits(profile, "max_output_tokens", requested, prompt_tokens, max_model_len, False)
    max_tokens = None if requested is None else limit
    parsed = _chat_request(body, messages, model, flags["stream"], max_tokens, limit, (),
                           prompt_tokens, header_request_id, natural_ends)  # fmt: skip
    return ApiRequest("responses", parsed, body, flags["background"],
                      flags["store"] and store_enabled, requested)  # fmt: skip


def parse_messages(
    profile: Profile,
    content_type: str,
    raw: bytes,
    served_model: str,
    max_model_len: int,
    header_request_id: str | None,
    natural_ends: bool = True,
) -> ApiRequest:
    """Validate `POST /v1/messages` as vLLM 0.32 does, or raise ApiError with its answer."""
    body = load_body(profile, content_type, raw)
    errors: list[dict[str, Any] | str] = []
    if "messages" not in body:
        errors.append({"type": "missing", "loc": ("body", "messages"), "msg": "Field required",
                       "input": body})  # fmt: skip
    elif not isinstance(body["messages"], list):
        _field_error(
            errors, body, "messages", {"type": "list_type", "msg": "Input should be a valid list"}
        )
    requested: int | None = None
    if "max_tokens" not in body:
        errors.append({"type": "missing", "loc": ("body", "max_tokens"), "msg": "Field required",
                       "input": body})  # fmt: skip
    else:
        requested, problem = _as_int(body["max_tokens"])
        if problem:
            _field_error(errors, body, "max_tokens", problem)
    stream = False
    if body.get("stream") is not None:
        value, problem = _as_bool(body["stream"])
        if problem:
            _field_error(errors, body, "stream", problem)
        stream = bool(value)
    thinking = body.get("thinking")
    if not errors and isinstance(thinking, dict) and requested is not None:
        budget = thinking.get("budget_tokens")
        if isinstance(budget, int) and budget >= requested:
            problem_text = "thinking.budget_tokens must be less than max_tokens"
            errors.append({"type": "value_error", "loc": ("body",),
                           "msg": f"Value error, {problem_text}", "input": body,
                           "ctx": {"error": _Repr(f"ValueError({problem_text!r})")}})  # fmt: skip
    if errors:
        raise _validation_error(profile, errors)
    model = body.get("model") or served_model
    if model != served_model:
        message = f"The model `{model}` does not exist. Valid aliases: {served_model}."
        raise ApiError(404, anthropic_error_body(message, "NotFoundError"))
    if body.get("tools"):
        choice = body.get("tool_choice")
        if isinstance(choice, dict) and choice.get("type") == "tool":
            message = (
                f'tool_choice=function "{choice.get("name")}" requires --tool-call-parser to be set'
            )
        else:
            message = (
                '"auto" tool choice requires --enable-auto-tool-choice and '
                "--tool-call-parser to be set"
            )
        raise ApiError(400, anthropic_error_body(message, "BadRequestError"))
    messages = _messages_of(body["messages"])
    system = body.get("system")
    if isinstance(system, str):
        messages.insert(0, {"role": "system", "content": system})
    prompt_tokens = textgen.count_prompt_tokens(messages, chat=True)
    limit = _limits(profile, "max_completion_tokens", requested, prompt_tokens, max_model_len,
                    True)  # fmt: skip
    stops = body.get("stop_sequences")
    stop = tuple(s for s in stops if isinstance(s, str)) if isinstance(stops, list) else ()
    parsed = _chat_request(body, messages, model, stream, limit, limit, stop, prompt_tokens,
                           header_request_id, natural_ends)  # fmt: skip
    return ApiRequest("messages", parsed, body, max_output_tokens=requested)


class _Repr:
    """A value whose str() in a listed validation error is its repr (pydantic's ctx error)."""

    def __init__(self, text: str) -> None:
        self.text = text

    def __repr__(self) -> str:
        return self.text


# ------------------------------------------------------------------------ Responses


def _float(value: Any, default: float) -> float:
    return (
        float(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else default
    )


_TOOL_NULLS = ("allowed_callers", "async", "defer_loading", "description", "output_schema")


def _tool(tool: Any) -> Any:
    """A function tool as FunctionTool dumps it (fields in the openai SDK's order)."""
    if not isinstance(tool, dict) or tool.get("type") != "function":
        return tool
    out = {"name": tool.get("name"), "parameters": tool.get("parameters"),
           "strict": tool.get("strict"), "type": "function"}  # fmt: skip
    for name in _TOOL_NULLS:
        out[name] = tool.get(name)
    return out


def _tool_choice(value: Any) -> Any:
    """A named choice as ToolChoiceFunction dumps it: name, then type."""
    if isinstance(value, dict) and value.get("type") == "function":
        return {"name": value.get("name"), "type": "function"}
    return value


def _reasoning(value: Any) -> Any:
    if not isinstance(value, dict):
        return None
    return {"context": value.get("context"), "effort": value.get("effort"),
            "generate_summary": value.get("generate_summary"), "mode": value.get("mode"),
            "summary": value.get("summary")}  # fmt: skip


@dataclass(frozen=True)
class ResponseHead:
    """What every Responses body of one response repeats (ResponsesResponse.from_request)."""

    id: str
    created_at: int
    model: str
    request: dict[str, Any]
    background: bool
    max_output_tokens: int | None

    def body(
        self,
        status: str,
        output: list[dict[str, Any]],
        usage: dict[str, Any] | None,
        incomplete: bool = False,
    ) -> dict[str, Any]:
        request = self.request
        listed = request.get("tools")
        tools: list[Any] = listed if isinstance(listed, list) else []
        default_choice = "auto" if tools else "none"
        return {
            "id": self.id,
            "created_at": self.created_at,
            "incomplete_details": {"reason": "max_output_tokens"} if incomplete else None,
            "instructions": request.get("instructions"),
            "metadata": request.get("metadata"),
            "model": self.model,
            "object": "response",
            "output": output,
            "parallel_tool_calls": request.get("parallel_tool_calls", True),
            "temperature": _float(request.get("temperature"), 1.0),
            "tool_choice": _tool_choice(request.get("tool_choice", default_choice))
            if tools
            else "none",
            "tools": [_tool(t) for t in tools],
            "top_p": _float(request.get("top_p"), 1.0),
            "background": self.background,
            "max_output_tokens": self.max_output_tokens,
            "max_tool_calls": request.get("max_tool_calls"),
            "previous_response_id": request.get("previous_response_id"),
            "prompt": None,
            "reasoning": _reasoning(request.get("reasoning")),
            "service_tier": "auto",
            "status": status,
            "text": None,
            "top_logprobs": request.get("top_logprobs"),
            "truncation": "disabled",
            "usage": usage,
            "user": request.get("user"),
            "presence_penalty": _float(request.get("presence_penalty"), 0.0),
            "frequency_penalty": _float(request.get("frequency_penalty"), 0.0),
            "kv_transfer_params": None,
            "ec_transfer_params": None,
            "input_messages": None,
            "output_messages": None,
        }


def responses_usage(input_tokens: int, output_tokens: int) -> dict[str, Any]:
    return {
        "input_tokens": input_tokens,
        "input_tokens_details": {"cached_tokens": 0, "cache_write_tokens": 0,
                                 "input_tokens_per_turn": [], "cached_tokens_per_turn": []},
        "output_tokens": output_tokens,
        "output_tokens_details": {"reasoning_tokens": 0, "tool_output_tokens": 0,
                                  "output_tokens_per_turn": [],
                                  "tool_output_tokens_per_turn": []},
        "total_tokens": input_tokens + output_tokens,
    }  # fmt: skip


def _text_part(text: str, logprobs: list[Any] | None) -> dict[str, Any]:
    return {"annotations": [], "text": text, "type": "output_text", "logprobs": logprobs}


def message_item(item_id: str, text: str | None, status: str = "completed") -> dict[str, Any]:
    """A ResponseOutputMessage; its content is empty while in progress or without text."""
    content = [_text_part(text, None)] if text else []
    return {"id": item_id, "content": content, "role": "assistant", "status": status,
            "type": "message", "phase": None}  # fmt: skip


def response_output(item_id: str, text: str, streamed: bool) -> list[dict[str, Any]]:
    """A finished response's `output`. A streamed one holds the items its stream sent
    (responses_full_generator: `output = context.streamed_output_items`), so steps that made no
    text leave it empty; otherwise it is the message, whose content is empty without text."""
    if streamed and not text:
        return []
    return [message_item(item_id, text)]


def response_body(
    head: ResponseHead,
    item_id: str,
    text: str,
    finish_reason: str | None,
    input_tokens: int,
    output_tokens: int,
    streamed: bool = False,
) -> bytes:
    """A finished response (non-streaming POST, or GET of a stored one)."""
    incomplete = finish_reason == "length"
    body = head.body("incomplete" if incomplete else "completed",
                     response_output(item_id, text, streamed),
                     responses_usage(input_tokens, output_tokens), incomplete)  # fmt: skip
    return wire.dumps(body).encode()


@dataclass
class ResponsesEncoder:
    """Engine outputs to Responses events (the StreamEncoder interface the engine drives)."""

    head: ResponseHead
    item_id: str
    prompt_tokens: int
    sequence: int = 0
    _tokens: int = 0
    _text: str = ""
    _opened: bool = False
    _finish: str | None = None

    @property
    def completion_tokens(self) -> int:
        return self._tokens

    def _event(self, kind: str, payload: dict[str, Any]) -> bytes:
        # The openai SDK's event models declare their fields in alphabetical order.
        fields = {**payload, "sequence_number": self.sequence, "type": kind}
        data = {name: fields[name] for name in sorted(fields)}
        self.sequence += 1
        return named_event(kind, data)

    def start(self) -> list[bytes]:
        """`response.created` and `response.in_progress`, before the first token."""
        initial = self.head.body("in_progress", [], None)
        return [self._event("response.created", {"response": initial}),
                self._event("response.in_progress", {"response": initial})]  # fmt: skip

    def output(
        self,
        index: int,
        text: str,
        num_tokens: int = 1,
        finish_reason: str | None = None,
        stop_reason: wire.StopReason = None,
        channel: str = "",
        tool: Any = None,
    ) -> list[bytes]:
        self._tokens += num_tokens
        if finish_reason is not None:
            self._finish = finish_reason
        if not text:
            return []
        frames: list[bytes] = []
        if not self._opened:
            self._opened = True
            frames.append(
                self._event(
                    "response.output_item.added",
                    {"item": message_item(self.item_id, None, "in_progress"), "output_index": 0},
                )
            )
            frames.append(self._event("response.content_part.added", {
                "content_index": 0, "item_id": self.item_id, "output_index": 0,
                "part": _text_part("", [])}))  # fmt: skip
        self._text += text
        frames.append(self._event("response.output_text.delta", {
            "content_index": 0, "delta": text, "item_id": self.item_id, "logprobs": [],
            "output_index": 0}))  # fmt: skip
        return frames

    def end(self) -> list[bytes]:
        frames: list[bytes] = []
        text = self._text
        if self._opened:
            frames.append(
                self._event(
                    "response.output_text.done",
                    {
                        "content_index": 0,
                        "item_id": self.item_id,
                        "logprobs": [],
                        "output_index": 0,
                        "text": text,
                    },
                )
            )
            frames.append(
                self._event(
                    "response.content_part.done",
                    {
                        "content_index": 0,
                        "item_id": self.item_id,
                        "output_index": 0,
                        "part": _text_part(text, None),
                    },
                )
            )
            frames.append(self._event("response.output_item.done", {
                "item": message_item(self.item_id, text), "output_index": 0}))  # fmt: skip
        incomplete = self._finish == "length"
        final = self.head.body(
            "incomplete" if incomplete else "completed",
            response_output(self.item_id, text, streamed=True),
            responses_usage(self.prompt_tokens, self._tokens), incomplete,
        )  # fmt: skip
        frames.append(self._event("response.completed", {"response": final}))
        return frames

    def error(
        self,
        message: str = "Internal server error",
        error_type: str = "InternalServerError",
        code: int = 500,
    ) -> list[bytes]:
        # vLLM 0.32 builds its error JSON (`{"error": {...}}`) and validates it as one of
        # the stream's event types, which it is not: the ValidationError ends the generator
        # after the 200, and the connection breaks off with no event (api_handlers.py).
        return []


# ------------------------------------------------------------------------ Messages


def messages_body(
    message_id: str,
    model: str,
    text: str,
    finish_reason: str | None,
    input_tokens: int,
    output_tokens: int,
) -> bytes:
    """A non-streaming Messages answer (vLLM 0.32 leaves `stop_sequence` out here)."""
    return wire.dumps({
        "id": message_id, "type": "message", "role": "assistant",
        "content": [{"type": "text", "text": text}], "model": model,
        "stop_reason": stop_reason(finish_reason),
        "usage": {"input_tokens": input_tokens, "output_tokens": output_tokens},
    }).encode()  # fmt: skip


def stop_reason(finish_reason: str | None) -> str:
    """The Anthropic converter's map: length is max_tokens, a stop string stop_sequence."""
    return {"length": "max_tokens", "tool_calls": "tool_use"}.get(finish_reason or "", "end_turn")


@dataclass
class MessagesEncoder:
    """Engine outputs to Anthropic events (the StreamEncoder interface the engine drives)."""

    id: str
    model: str
    prompt_tokens: int
    _tokens: int = 0
    _started: bool = False
    _opened: bool = False
    _finish: str | None = None
    _stop: wire.StopReason = None

    @property
    def completion_tokens(self) -> int:
        return self._tokens

    def start(self) -> list[bytes]:
        return []

    def output(
        self,
        index: int,
        text: str,
        num_tokens: int = 1,
        finish_reason: str | None = None,
        stop_reason: wire.StopReason = None,
        channel: str = "",
        tool: Any = None,
    ) -> list[bytes]:
        self._tokens += num_tokens
        if finish_reason is not None:
            self._finish, self._stop = finish_reason, stop_reason
        frames: list[bytes] = []
        if not self._started:  # the chat stream's role chunk, at the first engine output
            self._started = True
            message: dict[str, Any] = {
                "id": self.id,
                "type": "message",
                "role": "assistant",
                "content": [],
                "model": self.model,
                "stop_reason": None,
                "stop_sequence": None,
                "usage": {"input_tokens": self.prompt_tokens, "output_tokens": 0},
            }
            frames.append(named_event("message_start", {"type": "message_start",
                                                        "message": message}))  # fmt: skip
        if not text:
            return frames
        if not self._opened:
            self._opened = True
            frames.append(named_event("content_block_start", {
                "type": "content_block_start", "content_block": {"type": "text", "text": ""},
                "index": 0}))  # fmt: skip
        frames.append(named_event("content_block_delta", {
            "type": "content_block_delta", "delta": {"type": "text_delta", "text": text},
            "index": 0}))  # fmt: skip
        return frames

    def end(self) -> list[bytes]:
        frames: list[bytes] = []
        if self._opened:
            frames.append(
                named_event("content_block_stop", {"type": "content_block_stop", "index": 0})
            )
        matched = self._stop if isinstance(self._stop, str) else None
        reason = "stop_sequence" if matched is not None else stop_reason(self._finish)
        frames.append(
            named_event(
                "message_delta",
                {
                    "type": "message_delta",
                    "delta": {"stop_reason": reason, "stop_sequence": matched},
                    "usage": {"input_tokens": self.prompt_tokens, "output_tokens": self._tokens},
                },
            )
        )
        frames.append(named_event("message_stop", {"type": "message_stop"}))
        return frames

    def error(
        self,
        message: str = "Internal server error",
        error_type: str = "InternalServerError",
        code: int = 500,
    ) -> list[bytes]:
        # The converter cannot read the chat stream's in-band `{"error": ...}` frame as a
        # chunk; its ValidationError becomes an `internal_error` event and the stream ends
        # (vLLM 0.32 `anthropic/serving.py`; the message, pydantic's text, is not copied).
        del error_type, code
        error = {"type": "internal_error", "message": message}
        return [named_event("error", {"type": "error", "error": error})]
