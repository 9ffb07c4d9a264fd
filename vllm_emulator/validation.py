"""Request validation with vLLM's status codes and error bodies (pure).

Mirrors the order vLLM rejects things before the stream starts (reference §2):
content type and JSON body (FastAPI/pydantic `RequestValidationError`: 400 with
type "Bad Request" in 0.33, its message "N validation error(s):\\n  {...}" and
`param` the dotted location), field types with pydantic's lax coercion, the
`stream_options`-without-`stream` validator, the model name (404), then the
token limits, which differ most between versions: 0.33 clamps `max_tokens` to
the room left and only rejects `max_tokens > max_model_len` or a prompt that
fills the context; 0.11 rejects `prompt + max_tokens > max_model_len`, and its
chat handler appends `" None"` (`f"{e} {e.__cause__}"`) to preprocessing errors.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from vllm_emulator import textgen, wire
from vllm_emulator.wire import Endpoint, Profile


@dataclass(frozen=True)
class ApiError(Exception):
    """A rejected request: HTTP status and the exact JSON body."""

    status: int
    body: bytes


@dataclass(frozen=True)
class ParsedRequest:
    """A valid generation request, with everything the engine and encoder need."""

    endpoint: Endpoint
    body: dict[str, Any]
    model: str
    stream: bool
    include_usage: bool
    continuous_usage: bool
    n: int
    max_tokens: int | None  # None: generate to a natural EOS
    limit: int  # the most tokens this request may produce
    stop: tuple[str, ...]
    prompt: Any
    prompt_tokens: int
    request_id: str | None


def _bad_request(profile: Profile, message: str, param: str | None = None) -> ApiError:
    return ApiError(400, wire.error_body(profile, message, "BadRequestError", 400, param))


def _validation_error(profile: Profile, errors: list[dict[str, Any]]) -> ApiError:
    """FastAPI's RequestValidationError as vLLM's handler reports it (at most 10 listed)."""
    count = len(errors)
    message = f"{count} validation error{'s' if count != 1 else ''}:\n" + "\n".join(
        f"  {error}" for error in errors[:10]
    )
    if profile == "vllm-0.11":  # str(exc) into create_error_response defaults
        return ApiError(400, wire.error_body(profile, message + "\n", "BadRequestError", 400))
    loc = errors[0]["loc"]
    param = ".".join(str(part) for part in loc)
    return ApiError(400, wire.error_body(profile, message, "Bad Request", 400, param))


# pydantic v2 lax-mode coercions, with its error types and messages.
def _as_int(value: Any) -> tuple[int | None, dict[str, str] | None]:
    if isinstance(value, bool):
        return int(value), None
    if isinstance(value, int):
        return value, None
    if isinstance(value, float):
        if value.is_integer():
            return int(value), None
        fractional = "Input should be a valid integer, got a number with a fractional part"
        return None, {"type": "int_from_float", "msg": fractional}
    if isinstance(value, str):
        try:
            return int(value.strip()), None
        except ValueError:
            message = "Input should be a valid integer, unable to parse string as an integer"
            return None, {"type": "int_parsing", "msg": message}
    return None, {"type": "int_type", "msg": "Input should be a valid integer"}


_TRUE = {"true", "1", "yes", "on", "t", "y"}
_FALSE = {"false", "0", "no", "off", "f", "n"}


def _as_bool(value: Any) -> tuple[bool | None, dict[str, str] | None]:
    if isinstance(value, bool):
        return value, None
    if isinstance(value, int) and value in (0, 1):
        return bool(value), None
    if isinstance(value, str) and value.lower() in _TRUE | _FALSE:
        return value.lower() in _TRUE, None
    if isinstance(value, str):
        message = "Input should be a valid boolean, unable to interpret input"
        return None, {"type": "bool_parsing", "msg": message}
    return None, {"type": "bool_type", "msg": "Input should be a valid boolean"}


def parse(
    profile: Profile,
    endpoint: Endpoint,
    content_type: str,
    raw: bytes,
    served_model: str,
    max_model_len: int,
    default_max_tokens: int | None,
    header_request_id: str | None,
) -> ParsedRequest:
    """Validate a generation request or raise ApiError with vLLM's status and body."""
    if content_type.split(";")[0].strip().lower() != "application/json":
        raise ApiError(
            400,
            wire.error_body(
                profile,
                "Unsupported Media Type: Only 'application/json' is allowed",
                "Bad Request" if profile == "vllm-0.33" else "BadRequestError",
                400,
            ),
        )
    try:
        body = json.loads(raw)
    except (ValueError, UnicodeDecodeError) as error:
        reason = getattr(error, "msg", str(error))
        position = getattr(error, "pos", 0)
        raise _validation_error(
            profile,
            [{"type": "json_invalid", "loc": ("body", position), "msg": "JSON decode error",
              "input": {}, "ctx": {"error": reason}}],
        ) from None  # fmt: skip
    if not isinstance(body, dict):
        raise _validation_error(
            profile,
            [{"type": "model_attributes_type", "loc": ("body",),
              "msg": "Input should be a valid dictionary or object to extract fields from",
              "input": body}],
        )  # fmt: skip

    errors: list[dict[str, Any]] = []

    def field_error(name: str, problem: dict[str, str]) -> None:
        errors.append({**problem, "loc": ("body", name), "input": body.get(name)})

    prompt_field = "messages" if endpoint == "chat" else "prompt"
    if prompt_field not in body:
        errors.append({"type": "missing", "loc": ("body", prompt_field), "msg": "Field required",
                       "input": body})  # fmt: skip
    elif endpoint == "chat" and not isinstance(body[prompt_field], list):
        field_error(prompt_field, {"type": "list_type", "msg": "Input should be a valid list"})
    if "model" in body and body["model"] is not None and not isinstance(body["model"], str):
        field_error("model", {"type": "string_type", "msg": "Input should be a valid string"})
    ints: dict[str, int | None] = {}
    for name in ("max_tokens", "max_completion_tokens", "n", "seed"):
        if body.get(name) is not None:
            ints[name], problem = _as_int(body[name])
            if problem:
                field_error(name, problem)
    stream = False
    if body.get("stream") is not None:
        parsed_stream, problem = _as_bool(body["stream"])
        if problem:
            field_error("stream", problem)
        stream = bool(parsed_stream)
    stop_value = body.get("stop")
    stop: tuple[str, ...] = ()
    if isinstance(stop_value, str):
        stop = (stop_value,)
    elif isinstance(stop_value, list) and all(isinstance(s, str) for s in stop_value):
        stop = tuple(stop_value)
    elif stop_value is not None:
        field_error("stop", {"type": "string_type", "msg": "Input should be a valid string"})
    options = body.get("stream_options")
    if options is not None and not isinstance(options, dict):
        message = "Input should be a valid dictionary or instance of StreamOptions"
        field_error("stream_options", {"type": "model_type", "msg": message})
    if errors:
        raise _validation_error(profile, errors)
    if options is not None and not stream:
        raise _validation_error(
            profile,
            [{"type": "value_error", "loc": ("body",),
              "msg": "Value error, Stream options can only be defined when `stream=True`.",
              "input": body, "ctx": {"error": "Stream options can only be defined when "
                                               "`stream=True`."}}],
        )  # fmt: skip

    model = body.get("model") or served_model
    if model != served_model:
        if profile == "vllm-0.33":
            message = f"The model `{model}` does not exist. Valid aliases: {served_model}."
            raise ApiError(404, wire.error_body(profile, message, "NotFoundError", 404, "model"))
        message = f"The model `{model}` does not exist."
        raise ApiError(404, wire.error_body(profile, message, "NotFoundError", 404))

    prompt = body[prompt_field]
    prompt_tokens = textgen.count_prompt_tokens(prompt, chat=endpoint == "chat")
    requested = ints.get("max_completion_tokens") if endpoint == "chat" else None
    if requested is None:
        requested = ints.get("max_tokens")
    suffix = " None" if endpoint == "chat" and profile == "vllm-0.11" else ""
    if requested is not None and requested < 1:
        if profile == "vllm-0.33":
            message = (
                f"max_tokens must be at least 1, got {requested}. "
                f"(parameter=max_tokens, value={requested})"
            )
            raise _bad_request(profile, message, "max_tokens")
        raise _bad_request(profile, f"max_tokens must be at least 1, got {requested}.")
    if prompt_tokens >= max_model_len:
        if profile == "vllm-0.33":
            message = (
                f"This model's maximum context length is {max_model_len} tokens. However, your "
                f"prompt contains {prompt_tokens} input tokens, which exceeds this limit even "
                "without any output tokens. Please reduce the length of the input prompt. "
                f"(parameter=input_tokens, value={prompt_tokens})"
            )
            raise _bad_request(profile, message, "input_tokens")
        message = (
            f"This model's maximum context length is {max_model_len} tokens. However, your "
            f"request has {prompt_tokens} input tokens. Please reduce the length of the input "
            "messages."
        )
        raise _bad_request(profile, message + suffix)
    n = ints.get("n")
    if n is not None and n < 1:  # SamplingParams._verify_args
        raise _bad_request(profile, f"n must be at least 1, got {n}.")
    room = max_model_len - prompt_tokens
    if requested is not None and profile == "vllm-0.33" and requested > max_model_len:
        message = (
            f"max_tokens={requested} cannot be greater than max_model_len={max_model_len}. "
            f"Please request fewer output tokens. (parameter=max_tokens, value={requested})"
        )
        raise _bad_request(profile, message, "max_tokens")
    if requested is not None and profile == "vllm-0.11" and requested > room:
        message = (
            f"'max_tokens' or 'max_completion_tokens' is too large: {requested}. This model's "
            f"maximum context length is {max_model_len} tokens and your request has "
            f"{prompt_tokens} input tokens ({requested} > {max_model_len} - {prompt_tokens})."
        )
        raise _bad_request(profile, message + suffix)
    limit = room if default_max_tokens is None else min(room, default_max_tokens)
    max_tokens = None if requested is None else min(requested, room)  # 0.33 clamps

    include_usage = bool(options and options.get("include_usage"))
    continuous = bool(options and options.get("continuous_usage_stats"))
    body_request_id = body.get("request_id") if isinstance(body.get("request_id"), str) else None
    return ParsedRequest(
        endpoint=endpoint,
        body=body,
        model=model,
        stream=stream,
        include_usage=include_usage,
        continuous_usage=continuous,
        n=max(1, ints.get("n") or 1),
        max_tokens=max_tokens,
        limit=limit if max_tokens is None else max_tokens,
        stop=stop,
        prompt=prompt,
        prompt_tokens=prompt_tokens,
        request_id=header_request_id or body_request_id,
    )
