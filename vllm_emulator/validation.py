"""Request validation with vLLM's status codes and error bodies (pure).

Mirrors the order vLLM rejects things before the stream starts (reference §2):
content type and JSON body (FastAPI/pydantic `RequestValidationError`: 400 with
type "Bad Request" from 0.32 on, its message "N validation error(s):\\n  {...}" and
`param` the dotted location), field types with pydantic's lax coercion, the
`stream_options`-without-`stream` validator, the model name (404), then the
token limits, which differ most between versions: 0.32 and 0.33 clamp `max_tokens`
to the room left and only reject `max_tokens > max_model_len` or a prompt that
fills the context; 0.11 rejects `prompt + max_tokens > max_model_len`, and its
chat handler appends `" None"` (`f"{e} {e.__cause__}"`) to preprocessing errors.

vLLM 0.32.0 (checked against the running server, tests/real_vllm/): its validation
handler (`serve/exception_handling/handlers/validation.py`) writes each pydantic
error with `loc` joined into the dotted param ('body.max_tokens', union-branch
markers dropped) and `input` summarised (`'<dict of N items>'`, `str()` of scalars);
a wrong Content-Type is a one-error validation message; `stream_options` with a
falsy `stream` is checked on the raw body before any field (BadRequestError,
`param: "stream_options"`); a prompt over the context is reported as "at least
max_model_len + 1" tokens (it stops tokenizing there).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from vllm_emulator import agent, textgen, wire
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


MAX_REPORTED_ERRORS = 10  # vLLM lists at most this many validation errors
_MAX_ERROR_INPUT_CHARS = 200  # 0.32's bounds on one error's echoed input and its text
_MAX_ERROR_CHARS = 1000
# pydantic-core's schema-kind names that show up in a `loc` for union branches; 0.32's
# clean_loc_for_param drops them (and anything bracketed, such as "list[str]").
_INTERNAL_LOC_MARKERS = frozenset({"str", "int", "float", "bool", "list", "dict", "nullable",
                                   "union", "tagged-union", "function-wrap", "function-after",
                                   "function-before", "function-plain", "none"})  # fmt: skip


def _clean_loc(loc: tuple[Any, ...]) -> str:
    """0.32's `clean_loc_for_param`: the dotted loc without pydantic's internal markers."""
    parts = [str(part) for part in loc]
    kept = [p for p in parts if not any(c in p for c in "[]{}()") and
            p.lower() not in _INTERNAL_LOC_MARKERS]  # fmt: skip
    return ".".join(kept or parts)


def _summarised_input(value: Any) -> str:
    """0.32's `_summarize_error_input`: containers described, scalars as `str()`, bounded."""
    if isinstance(value, (list, tuple, dict)):
        return f"<{type(value).__name__} of {len(value)} items>"
    text = str(value)
    if len(text) > _MAX_ERROR_INPUT_CHARS:
        return text[:_MAX_ERROR_INPUT_CHARS] + "...[truncated]"
    return text


def _format_error(profile: Profile, error: dict[str, Any] | str) -> str:
    """One listed error: pydantic's dict (type, loc, msg, input[, ctx]) as `str()` gives it."""
    if isinstance(error, str) or profile != "vllm-0.32":
        return str(error)
    shown = dict(error)
    shown["loc"] = _clean_loc(tuple(error["loc"]))
    shown["input"] = _summarised_input(error["input"])
    text = str(shown)
    return text if len(text) <= _MAX_ERROR_CHARS else text[:_MAX_ERROR_CHARS] + "...[truncated]"


def _validation_error(profile: Profile, errors: list[dict[str, Any] | str]) -> ApiError:
    """FastAPI's RequestValidationError as vLLM's handler reports it (at most 10 listed)."""
    count = len(errors)
    label = "error" if count == 1 else "errors"
    lines = [f"  {_format_error(profile, error)}" for error in errors[:MAX_REPORTED_ERRORS]]
    if profile == "vllm-0.32" and count > MAX_REPORTED_ERRORS:
        lines.append(f"  ...and {count - MAX_REPORTED_ERRORS} more {label}")
    message = f"{count} validation {label}:\n" + "\n".join(lines)
    if profile == "vllm-0.11":  # str(exc) into create_error_response defaults
        return ApiError(400, wire.error_body(profile, message + "\n", "BadRequestError", 400))
    first = errors[0]
    param = None
    if isinstance(first, dict):
        loc = tuple(first["loc"])
        param = _clean_loc(loc) if profile == "vllm-0.32" else ".".join(str(p) for p in loc)
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


def load_body(profile: Profile, content_type: str, raw: bytes) -> dict[str, Any]:
    """The JSON object of a request, or ApiError as FastAPI and vLLM's handlers reject it."""
    media_error = "Unsupported Media Type: Only 'application/json' is allowed"
    if content_type.split(";")[0].strip().lower() != "application/json":
        if profile == "vllm-0.32":  # validate_json_request: RequestValidationError(errors=[str])
            raise _validation_error(profile, [media_error])
        raise ApiError(
            400,
            wire.error_body(
                profile,
                media_error,
                "Bad Request" if profile == "vllm-0.33" else "BadRequestError",
                400,
            ),
        )
    if not raw and profile == "vllm-0.32":  # FastAPI: no body at all is a missing one
        raise _validation_error(
            profile, [{"type": "missing", "loc": ("body",), "msg": "Field required", "input": None}]
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
    return body


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
    body = load_body(profile, content_type, raw)

    if profile == "vllm-0.32" and body.get("stream_options") and not body.get("stream"):
        # 0.32 checks the raw body (truthiness, so `{}` and `"false"` pass) before any field.
        message = (
            "Stream options can only be defined when `stream=True`. (parameter=stream_options)"
        )
        raise _bad_request(profile, message, "stream_options")

    errors: list[dict[str, Any] | str] = []

    def field_error(name: str, problem: dict[str, str], *branch: str) -> None:
        # pydantic's ErrorDetails order: type, loc, msg, input.
        errors.append({"type": problem["type"], "loc": ("body", name, *branch),
                       "msg": problem["msg"], "input": body.get(name)})  # fmt: skip

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
        # `stop: str | list[str] | None`: pydantic reports one error per union branch (seen
        # on 0.32, whose handler drops the branch names from loc; other profiles: one error).
        string_error = {"type": "string_type", "msg": "Input should be a valid string"}
        if profile == "vllm-0.32":
            field_error("stop", string_error, "str")
            field_error("stop", {"type": "list_type", "msg": "Input should be a valid list"},
                        "list[str]")  # fmt: skip
        else:
            field_error("stop", string_error)
    options = body.get("stream_options")
    if options is not None and not isinstance(options, dict):
        message = "Input should be a valid dictionary or instance of StreamOptions"
        field_error("stream_options", {"type": "model_type", "msg": message})
    if errors:
        raise _validation_error(profile, errors)
    tool_problem = agent.tool_choice_error(body) if endpoint == "chat" else None
    if tool_problem is not None:
        # check_tool_usage, a model validator: 0.32+ raise it as a VLLMValidationError naming
        # the parameter, as they do stream_options (the wording is vLLM's; the parameter
        # suffix is inferred from that sibling, not captured); 0.11 as pydantic's value_error.
        if wire.modern(profile):
            raise _bad_request(profile, f"{tool_problem} (parameter=tool_choice)", "tool_choice")
        raise _validation_error(
            profile,
            [{"type": "value_error", "loc": ("body",), "msg": f"Value error, {tool_problem}",
              "input": body, "ctx": {"error": tool_problem}}],
        )  # fmt: skip
    if options is not None and not stream and profile != "vllm-0.32":  # 0.32: checked above
        raise _validation_error(
            profile,
            [{"type": "value_error", "loc": ("body",),
              "msg": "Value error, Stream options can only be defined when `stream=True`.",
              "input": body, "ctx": {"error": "Stream options can only be defined when "
                                               "`stream=True`."}}],
        )  # fmt: skip

    model = body.get("model") or served_model
    if model != served_model:
        if wire.modern(profile):
            message = f"The model `{model}` does not exist. Valid aliases: {served_model}."
            raise ApiError(404, wire.error_body(profile, message, "NotFoundError", 404, "model"))
        message = f"The model `{model}` does not exist."
        raise ApiError(404, wire.error_body(profile, message, "NotFoundError", 404))

    prompt = body[prompt_field]
    prompt_tokens = textgen.count_prompt_tokens(prompt, chat=endpoint == "chat")
    requested = ints.get("max_completion_tokens") if endpoint == "chat" else None
    requested_field = "max_completion_tokens"
    if requested is None:
        requested, requested_field = ints.get("max_tokens"), "max_tokens"
    suffix = " None" if endpoint == "chat" and profile == "vllm-0.11" else ""
    if requested is not None and requested < 1:
        if wire.modern(profile):  # both name max_tokens, even for max_completion_tokens
            message = (
                f"max_tokens must be at least 1, got {requested}. "
                f"(parameter=max_tokens, value={requested})"
            )
            raise _bad_request(profile, message, "max_tokens")
        raise _bad_request(profile, f"max_tokens must be at least 1, got {requested}.")
    if prompt_tokens >= max_model_len:
        if profile == "vllm-0.32":
            # 0.32 tokenizes with truncation at max_model_len + 1, so it only knows "at least".
            counted = max_model_len + 1
            message = (
                f"This model's maximum context length is {max_model_len} tokens. However, your "
                f"prompt contains at least {counted} input tokens, which exceeds this limit even "
                "without any output tokens. Please reduce the length of the input prompt. "
                f"(parameter=input_tokens, value={counted})"
            )
            raise _bad_request(profile, message, "input_tokens")
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
    if requested is not None and wire.modern(profile) and requested > max_model_len:
        # 0.32 names the field the request used (max_completion_tokens too); 0.33's literal
        # in the reference shows max_tokens only.
        name = requested_field if profile == "vllm-0.32" else "max_tokens"
        message = (
            f"{name}={requested} cannot be greater than max_model_len={max_model_len}. "
            f"Please request fewer output tokens. (parameter={name}, value={requested})"
        )
        raise _bad_request(profile, message, name)
    if requested is not None and profile == "vllm-0.11" and requested > room:
        message = (
            f"'max_tokens' or 'max_completion_tokens' is too large: {requested}. This model's "
            f"maximum context length is {max_model_len} tokens and your request has "
            f"{prompt_tokens} input tokens ({requested} > {max_model_len} - {prompt_tokens})."
        )
        raise _bad_request(profile, message + suffix)
    limit = room if default_max_tokens is None else min(room, default_max_tokens)
    max_tokens = None if requested is None else min(requested, room)  # 0.32+ clamp

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
