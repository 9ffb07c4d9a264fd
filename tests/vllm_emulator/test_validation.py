"""validation.parse per profile: the 0.32 bodies are literal answers of a running vLLM 0.32.0.

Captured from the CPU build the real-vLLM tier starts (served name `chat`, max_model_len 8192),
with `curl` on the requests below; tests/real_vllm/test_conformance.py compares the same cases
live. The 0.33 expectations follow shared/reference/vllm-wire.md §2.
"""

from __future__ import annotations

import json
from typing import Any

import pytest

from vllm_emulator.validation import ApiError, ParsedRequest, parse
from vllm_emulator.wire import Endpoint, Profile

MODEL = "chat"
HI = [{"role": "user", "content": "hi"}]


def _parse(
    profile: Profile,
    body: Any,
    endpoint: Endpoint = "chat",
    content_type: str = "application/json",
) -> ParsedRequest:
    raw = body if isinstance(body, bytes) else json.dumps(body).encode()
    return parse(profile, endpoint, content_type, raw, MODEL, 8192, None, None)


def _rejected(profile: Profile, body: Any, **kwargs: Any) -> tuple[int, str]:
    with pytest.raises(ApiError) as caught:
        _parse(profile, body, **kwargs)
    return caught.value.status, caught.value.body.decode()


def _bad_request(message: str, param: str | None, kind: str = "Bad Request") -> str:
    error = {"message": message, "type": kind, "param": param, "code": 400}
    return json.dumps({"error": error}, separators=(",", ":"))


REAL_032: list[tuple[str, Any, Endpoint, str]] = [
    ("wrong type", {"model": "chat", "messages": "x", "max_tokens": "y"}, "chat",
     _bad_request("2 validation errors:\n  {'type': 'list_type', 'loc': 'body.messages', 'msg': "
                  "'Input should be a valid list', 'input': 'x'}\n  {'type': 'int_parsing', 'loc': "
                  "'body.max_tokens', 'msg': 'Input should be a valid integer, unable to parse "
                  "string as an integer', 'input': 'y'}", "body.messages")),
    ("missing field", {"model": "chat"}, "chat",
     _bad_request("1 validation error:\n  {'type': 'missing', 'loc': 'body.messages', 'msg': "
                  "'Field required', 'input': '<dict of 1 items>'}", "body.messages")),
    ("not an object", [1, 2], "chat",
     _bad_request("1 validation error:\n  {'type': 'model_attributes_type', 'loc': 'body', 'msg': "
                  "'Input should be a valid dictionary or object to extract fields from', "
                  "'input': '<list of 2 items>'}", "body")),
    ("a number as model", {"model": 5, "messages": HI}, "chat",
     _bad_request("1 validation error:\n  {'type': 'string_type', 'loc': 'body.model', 'msg': "
                  "'Input should be a valid string', 'input': '5'}", "body.model")),
    ("fractional max_tokens", {"model": "chat", "messages": HI, "max_tokens": 1.5}, "chat",
     _bad_request("1 validation error:\n  {'type': 'int_from_float', 'loc': 'body.max_tokens', "
                  "'msg': 'Input should be a valid integer, got a number with a fractional part', "
                  "'input': '1.5'}", "body.max_tokens")),
    ("stop of the wrong type (one error per union branch)",
     {"model": "chat", "messages": HI, "stop": 5}, "chat",
     _bad_request("2 validation errors:\n  {'type': 'string_type', 'loc': 'body.stop', 'msg': "
                  "'Input should be a valid string', 'input': '5'}\n  {'type': 'list_type', "
                  "'loc': 'body.stop', 'msg': 'Input should be a valid list', 'input': '5'}",
                  "body.stop")),
    ("not JSON", b"{not json", "completions",
     _bad_request("1 validation error:\n  {'type': 'json_invalid', 'loc': 'body.1', 'msg': 'JSON "
                  "decode error', 'input': '<dict of 0 items>', 'ctx': {'error': 'Expecting "
                  "property name enclosed in double quotes'}}", "body.1")),
    ("an empty body", b"", "chat",
     _bad_request("1 validation error:\n  {'type': 'missing', 'loc': 'body', 'msg': 'Field "
                  "required', 'input': 'None'}", "body")),
    ("stream_options without stream, before any field error",
     {"model": "nope", "messages": "x", "stream_options": {"include_usage": True}}, "chat",
     _bad_request("Stream options can only be defined when `stream=True`. "
                  "(parameter=stream_options)", "stream_options", "BadRequestError")),
    ("stream_options with stream 0 (completions)",
     {"prompt": "x", "stream_options": {"a": 1}, "stream": 0}, "completions",
     _bad_request("Stream options can only be defined when `stream=True`. "
                  "(parameter=stream_options)", "stream_options", "BadRequestError")),
    ("max_tokens over max_model_len", {"model": "chat", "prompt": "hi", "max_tokens": 9000},
     "completions",
     _bad_request("max_tokens=9000 cannot be greater than max_model_len=8192. Please request "
                  "fewer output tokens. (parameter=max_tokens, value=9000)", "max_tokens",
                  "BadRequestError")),
    ("max_completion_tokens over max_model_len",
     {"model": "chat", "messages": HI, "max_completion_tokens": 9000}, "chat",
     _bad_request("max_completion_tokens=9000 cannot be greater than max_model_len=8192. Please "
                  "request fewer output tokens. (parameter=max_completion_tokens, value=9000)",
                  "max_completion_tokens", "BadRequestError")),
    ("max_completion_tokens 0", {"model": "chat", "messages": HI, "max_completion_tokens": 0},
     "chat",
     _bad_request("max_tokens must be at least 1, got 0. (parameter=max_tokens, value=0)",
                  "max_tokens", "BadRequestError")),
    ("n 0", {"model": "chat", "messages": HI, "n": 0}, "chat",
     _bad_request("n must be at least 1, got 0.", None, "BadRequestError")),
    ("a prompt over the context", {"model": "chat", "prompt": "stream " * 9192}, "completions",
     _bad_request("This model's maximum context length is 8192 tokens. However, your prompt "
                  "contains at least 8193 input tokens, which exceeds this limit even without any "
                  "output tokens. Please reduce the length of the input prompt. "
                  "(parameter=input_tokens, value=8193)", "input_tokens", "BadRequestError")),
]  # fmt: skip


@pytest.mark.parametrize(("name", "body", "endpoint", "expected"), REAL_032,
                         ids=[case[0] for case in REAL_032])  # fmt: skip
def test_032_rejects_as_the_real_server_does(
    name: str, body: Any, endpoint: Endpoint, expected: str
) -> None:
    assert _rejected("vllm-0.32", body, endpoint=endpoint) == (400, expected)


def test_032_unknown_model_names_the_valid_alias() -> None:
    body = {"model": "no-such-model", "messages": HI, "max_tokens": 0}  # model is checked first
    message = "The model `no-such-model` does not exist. Valid aliases: chat."
    error = {"message": message, "type": "NotFoundError", "param": "model", "code": 404}
    assert _rejected("vllm-0.32", body) == (
        404,
        json.dumps({"error": error}, separators=(",", ":")),
    )


def test_032_wrong_content_type_is_a_one_error_validation_message() -> None:
    message = "1 validation error:\n  Unsupported Media Type: Only 'application/json' is allowed"
    got = _rejected("vllm-0.32", {"model": "chat", "messages": []}, content_type="text/plain")
    assert got == (400, _bad_request(message, None))


def test_033_keeps_its_reference_content_type_message() -> None:
    message = "Unsupported Media Type: Only 'application/json' is allowed"
    got = _rejected("vllm-0.33", {"model": "chat", "messages": []}, content_type="text/plain")
    assert got == (400, _bad_request(message, None))


@pytest.mark.parametrize("stream_options", [{}, None])
def test_032_lets_empty_stream_options_through_without_stream(stream_options: Any) -> None:
    # Seen on the real server: 200 for `{}` and null (the check is on the raw value's truth).
    parsed = _parse(
        "vllm-0.32", {"model": "chat", "messages": HI, "stream_options": stream_options}
    )
    assert not parsed.stream and not parsed.include_usage


def test_032_and_033_clamp_max_tokens_to_the_room_left() -> None:
    for profile in ("vllm-0.32", "vllm-0.33"):
        parsed = _parse(profile, {"model": "chat", "messages": HI, "max_tokens": 8190})
        assert parsed.max_tokens == 8192 - parsed.prompt_tokens


def test_pydantic_errors_list_type_loc_msg_input_in_that_order() -> None:
    _, body = _rejected("vllm-0.33", {"model": "chat", "messages": HI, "max_tokens": "four"})
    message = json.loads(body)["error"]["message"]
    assert message == (
        "1 validation error:\n  {'type': 'int_parsing', 'loc': ('body', 'max_tokens'), 'msg': "
        "'Input should be a valid integer, unable to parse string as an integer', "
        "'input': 'four'}"
    )


def test_032_lists_ten_errors_and_counts_the_rest() -> None:
    with pytest.raises(ApiError) as caught:
        _parse("vllm-0.32", {"model": "chat", "messages": HI, "max_tokens": "x"})
    assert "...and" not in caught.value.body.decode()
    from vllm_emulator.validation import MAX_REPORTED_ERRORS, _validation_error

    errors: list[dict[str, Any] | str] = [
        {"type": "missing", "loc": ("body", f"f{i}"), "msg": "Field required", "input": {}}
        for i in range(MAX_REPORTED_ERRORS + 2)
    ]
    message = json.loads(_validation_error("vllm-0.32", errors).body)["error"]["message"]
    assert message.startswith("12 validation errors:\n")
    assert message.endswith("'input': '<dict of 0 items>'}\n  ...and 2 more errors")
    assert message.count("'type': 'missing'") == MAX_REPORTED_ERRORS
