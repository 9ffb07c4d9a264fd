"""Golden tests: the emulator's frames equal, byte for byte, the literal examples in
shared/reference/vllm-wire.md (copied verbatim below) for profiles vllm-0.33 and vllm-0.11."""

# ruff: noqa: E501
from __future__ import annotations

import json
from typing import Any

from vllm_emulator import wire
from vllm_emulator.wire import Choice, StreamEncoder, Usage

CHAT33_ROLE = 'data: {"id":"chatcmpl-8c1e6f0a3b2d4e95","object":"chat.completion.chunk","created":1764400000,"model":"Qwen/Qwen3-0.6B","choices":[{"index":0,"delta":{"role":"assistant","content":""},"logprobs":null,"finish_reason":null}],"prompt_token_ids":null,"prompt_text":null}'
CHAT33_HELLO = 'data: {"id":"chatcmpl-8c1e6f0a3b2d4e95","object":"chat.completion.chunk","created":1764400000,"model":"Qwen/Qwen3-0.6B","choices":[{"index":0,"delta":{"content":"Hello"},"logprobs":null,"finish_reason":null,"token_ids":null}],"kv_transfer_params":null}'
CHAT33_BANG = 'data: {"id":"chatcmpl-8c1e6f0a3b2d4e95","object":"chat.completion.chunk","created":1764400000,"model":"Qwen/Qwen3-0.6B","choices":[{"index":0,"delta":{"content":"!"},"logprobs":null,"finish_reason":null,"token_ids":null}],"kv_transfer_params":null}'
CHAT33_FINISH_LENGTH = 'data: {"id":"chatcmpl-8c1e6f0a3b2d4e95","object":"chat.completion.chunk","created":1764400000,"model":"Qwen/Qwen3-0.6B","choices":[{"index":0,"delta":{"content":" How"},"logprobs":null,"finish_reason":"length","stop_reason":null,"token_ids":null,"weight_versions":null}],"system_fingerprint":"vllm-0.33.0-1a2b3c4d","kv_transfer_params":null}'
CHAT33_FINISH_WITH_USAGE = 'data: {"id":"chatcmpl-8c1e6f0a3b2d4e95","object":"chat.completion.chunk","created":1764400000,"model":"Qwen/Qwen3-0.6B","choices":[{"index":0,"delta":{"content":" How"},"logprobs":null,"finish_reason":"length","stop_reason":null,"token_ids":null,"weight_versions":null}],"kv_transfer_params":null}'
CHAT33_USAGE = 'data: {"id":"chatcmpl-8c1e6f0a3b2d4e95","object":"chat.completion.chunk","created":1764400000,"model":"Qwen/Qwen3-0.6B","choices":[],"usage":{"prompt_tokens":12,"total_tokens":15,"completion_tokens":3},"system_fingerprint":"vllm-0.33.0-1a2b3c4d"}'
CHAT33_ROLE_CONTINUOUS = 'data: {"id":"chatcmpl-8c1e6f0a3b2d4e95","object":"chat.completion.chunk","created":1764400000,"model":"Qwen/Qwen3-0.6B","choices":[{"index":0,"delta":{"role":"assistant","content":""},"logprobs":null,"finish_reason":null}],"usage":{"prompt_tokens":12,"total_tokens":12,"completion_tokens":0,"completion_tokens_details":null},"prompt_token_ids":null,"prompt_text":null}'
CHAT33_HELLO_CONTINUOUS = 'data: {"id":"chatcmpl-8c1e6f0a3b2d4e95","object":"chat.completion.chunk","created":1764400000,"model":"Qwen/Qwen3-0.6B","choices":[{"index":0,"delta":{"content":"Hello"},"logprobs":null,"finish_reason":null,"token_ids":null}],"usage":{"prompt_tokens":12,"total_tokens":13,"completion_tokens":1,"completion_tokens_details":null},"kv_transfer_params":null}'
CHAT11_ROLE = 'data: {"id":"chatcmpl-3f2a9c7e5b1d4e8fa0c6b2d9e7f1a4c3","object":"chat.completion.chunk","created":1764400000,"model":"Qwen/Qwen3-0.6B","choices":[{"index":0,"delta":{"role":"assistant","content":""},"logprobs":null,"finish_reason":null}],"prompt_token_ids":null}'
CHAT11_HELLO = 'data: {"id":"chatcmpl-3f2a9c7e5b1d4e8fa0c6b2d9e7f1a4c3","object":"chat.completion.chunk","created":1764400000,"model":"Qwen/Qwen3-0.6B","choices":[{"index":0,"delta":{"content":"Hello"},"logprobs":null,"finish_reason":null,"token_ids":null}]}'
CHAT11_FINISH_EOS = 'data: {"id":"chatcmpl-3f2a9c7e5b1d4e8fa0c6b2d9e7f1a4c3","object":"chat.completion.chunk","created":1764400000,"model":"Qwen/Qwen3-0.6B","choices":[{"index":0,"delta":{"content":""},"logprobs":null,"finish_reason":"stop","stop_reason":null,"token_ids":null}]}'
CHAT11_USAGE = 'data: {"id":"chatcmpl-3f2a9c7e5b1d4e8fa0c6b2d9e7f1a4c3","object":"chat.completion.chunk","created":1764400000,"model":"Qwen/Qwen3-0.6B","choices":[],"usage":{"prompt_tokens":12,"total_tokens":15,"completion_tokens":3}}'
CMPL33_PARIS = 'data: {"id":"cmpl-8c1e6f0a3b2d4e95","object":"text_completion","created":1764400000,"model":"Qwen/Qwen3-0.6B","choices":[{"index":0,"text":" Paris","logprobs":null,"finish_reason":null,"stop_reason":null,"prompt_token_ids":null,"token_ids":null,"weight_versions":null}],"kv_transfer_params":null}'
CMPL33_FINISH_EOS = 'data: {"id":"cmpl-8c1e6f0a3b2d4e95","object":"text_completion","created":1764400000,"model":"Qwen/Qwen3-0.6B","choices":[{"index":0,"text":"","logprobs":null,"finish_reason":"stop","stop_reason":null,"prompt_token_ids":null,"token_ids":null,"weight_versions":null}],"kv_transfer_params":null}'
CMPL33_USAGE = 'data: {"id":"cmpl-8c1e6f0a3b2d4e95","object":"text_completion","created":1764400000,"model":"Qwen/Qwen3-0.6B","choices":[],"usage":{"prompt_tokens":5,"total_tokens":8,"completion_tokens":3},"system_fingerprint":"vllm-0.33.0-1a2b3c4d"}'
CHAT33_FULL_BODY = '{"id":"chatcmpl-8c1e6f0a3b2d4e95","object":"chat.completion","created":1764400000,"model":"Qwen/Qwen3-0.6B","choices":[{"index":0,"message":{"role":"assistant","content":"Hello! How can I help?","refusal":null,"annotations":null,"audio":null,"function_call":null,"reasoning":null},"logprobs":null,"finish_reason":"stop","stop_reason":null,"token_ids":null,"routed_experts":null,"weight_versions":null}],"service_tier":null,"system_fingerprint":"vllm-0.33.0-1a2b3c4d","usage":{"prompt_tokens":12,"total_tokens":19,"completion_tokens":7,"prompt_tokens_details":null,"completion_tokens_details":null},"prompt_logprobs":null,"prompt_token_ids":null,"prompt_text":null,"kv_transfer_params":null,"ec_transfer_params":null,"metrics":null}'
CMPL11_PARIS = 'data: {"id":"cmpl-…","object":"text_completion","created":…,"model":"…","choices":[{"index":0,"text":" Paris","logprobs":null,"finish_reason":null,"stop_reason":null,"prompt_token_ids":null,"token_ids":null}],"usage":null}'
CHAT11_CONTINUOUS_TAIL = (
    ',"token_ids":null}],"usage":{"prompt_tokens":12,"total_tokens":13,"completion_tokens":1}}'
)
CHAT33_ERROR_FRAME = 'data: {"error":{"message":"Internal server error","type":"InternalServerError","param":null,"code":500}}'
CMPL33_ERROR_FRAME = 'data: {"error": {"message": "Internal server error", "type": "InternalServerError", "param": null, "code": 500}}'
UNKNOWN_MODEL_33 = '{"error":{"message":"The model `foo` does not exist. Valid aliases: Qwen/Qwen3-0.6B.","type":"NotFoundError","param":"model","code":404}}'
MAX_TOKENS_TOO_LARGE_33 = '{"error":{"message":"max_tokens=100000 cannot be greater than max_model_len=4096. Please request fewer output tokens. (parameter=max_tokens, value=100000)","type":"BadRequestError","param":"max_tokens","code":400}}'

ID33 = "8c1e6f0a3b2d4e95"
ID11 = "3f2a9c7e5b1d4e8fa0c6b2d9e7f1a4c3"
CREATED = 1764400000
MODEL = "Qwen/Qwen3-0.6B"
FP = "vllm-0.33.0-1a2b3c4d"


def frame(line: str) -> bytes:
    return line.encode("utf-8") + b"\n\n"


def make_encoder(
    profile: wire.Profile, endpoint: wire.Endpoint, prompt_tokens: int, **kwargs: object
) -> StreamEncoder:
    base = ID33 if profile == "vllm-0.33" else ID11
    return StreamEncoder(
        profile=profile,
        endpoint=endpoint,
        id=wire.response_id(endpoint, base),
        created=CREATED,
        model=MODEL,
        prompt_tokens=prompt_tokens,
        system_fingerprint=wire.fingerprint(profile, MODEL) and FP,
        **kwargs,  # type: ignore[arg-type]
    )


def chat33(**kwargs: object) -> StreamEncoder:
    return make_encoder("vllm-0.33", "chat", 12, **kwargs)


def test_a_033_chat_stream_without_stream_options_is_byte_exact() -> None:
    encoder = chat33()
    out = encoder.output(0, "Hello") + encoder.output(0, "!")
    out += encoder.output(0, " How", finish_reason="length") + encoder.end()
    expected = [CHAT33_ROLE, CHAT33_HELLO, CHAT33_BANG, CHAT33_FINISH_LENGTH, "data: [DONE]"]
    assert out == [frame(line) for line in expected]


def test_a_033_chat_stream_with_include_usage_drops_the_fingerprint_from_the_finish_chunk_and_adds_a_usage_chunk() -> (
    None
):
    encoder = chat33(include_usage=True)
    out = encoder.output(0, "Hello") + encoder.output(0, "!")
    out += encoder.output(0, " How", finish_reason="length") + encoder.end()
    expected = [
        CHAT33_ROLE,
        CHAT33_HELLO,
        CHAT33_BANG,
        CHAT33_FINISH_WITH_USAGE,
        CHAT33_USAGE,
        "data: [DONE]",
    ]
    assert out == [frame(line) for line in expected]


def test_a_033_chat_stream_with_continuous_usage_puts_cumulative_usage_on_every_chunk() -> None:
    encoder = chat33(include_usage=True, continuous_usage=True)
    out = encoder.output(0, "Hello")
    assert out == [frame(CHAT33_ROLE_CONTINUOUS), frame(CHAT33_HELLO_CONTINUOUS)]
    encoder.output(0, "!")
    finish = json.loads(encoder.output(0, " How", finish_reason="length")[0][6:])
    assert finish["usage"] == {
        "prompt_tokens": 12,
        "total_tokens": 15,
        "completion_tokens": 3,
        "completion_tokens_details": None,
    }
    assert encoder.end() == [frame(CHAT33_USAGE), wire.DONE]


def test_continuous_usage_without_include_usage_is_ignored_like_should_include_usage() -> None:
    encoder = chat33(continuous_usage=True)
    assert encoder.output(0, "Hello") == [frame(CHAT33_ROLE), frame(CHAT33_HELLO)]


def test_a_011_chat_stream_ending_in_eos_is_byte_exact() -> None:
    encoder = make_encoder(
        "vllm-0.11",
        "chat",
        12,
        include_usage=True,
    )
    out = encoder.output(0, "Hello", num_tokens=2)
    out += encoder.output(0, "", finish_reason="stop") + encoder.end()
    expected = [CHAT11_ROLE, CHAT11_HELLO, CHAT11_FINISH_EOS, CHAT11_USAGE, "data: [DONE]"]
    assert out == [frame(line) for line in expected]


def test_a_011_chat_content_chunk_with_continuous_usage_has_no_completion_tokens_details() -> None:
    encoder = make_encoder(
        "vllm-0.11",
        "chat",
        12,
        include_usage=True,
        continuous_usage=True,
    )
    hello = encoder.output(0, "Hello")[1]
    assert hello.endswith(CHAT11_CONTINUOUS_TAIL.encode() + b"\n\n")
    assert hello.startswith(frame(CHAT11_HELLO)[:-4])


def test_a_033_completions_stream_has_no_role_chunk_and_is_byte_exact() -> None:
    encoder = make_encoder(
        "vllm-0.33",
        "completions",
        5,
        include_usage=True,
    )
    out = encoder.output(0, " Paris", num_tokens=2)
    out += encoder.output(0, "", finish_reason="stop") + encoder.end()
    expected = [CMPL33_PARIS, CMPL33_FINISH_EOS, CMPL33_USAGE, "data: [DONE]"]
    assert out == [frame(line) for line in expected]


def test_a_033_completions_finish_chunk_without_usage_carries_the_fingerprint_before_kv_transfer_params() -> (
    None
):
    encoder = make_encoder(
        "vllm-0.33",
        "completions",
        5,
    )
    encoder.output(0, " Paris")
    finish = encoder.output(0, "", finish_reason="stop")[0]
    assert finish == frame(
        CMPL33_FINISH_EOS.replace(
            '"kv_transfer_params"', f'"system_fingerprint":"{FP}","kv_transfer_params"'
        )
    )


def test_a_011_completions_chunk_ends_in_usage_null() -> None:
    encoder = StreamEncoder(
        profile="vllm-0.11",
        endpoint="completions",
        id="cmpl-x",
        created=7,
        model="m",
        prompt_tokens=5,
    )
    expected = (
        CMPL11_PARIS.replace('"cmpl-…"', '"cmpl-x"')
        .replace('"created":…', '"created":7')
        .replace('"model":"…"', '"model":"m"')
    )
    assert encoder.output(0, " Paris") == [frame(expected)]


def test_the_033_non_streaming_chat_body_is_byte_exact() -> None:
    body = wire.chat_response(
        "vllm-0.33",
        wire.response_id("chat", ID33),
        CREATED,
        MODEL,
        [Choice(0, "Hello! How can I help?", "stop")],
        Usage(12, 7),
        FP,
    )
    assert body == CHAT33_FULL_BODY.encode()


def test_in_band_error_frames_follow_each_profile() -> None:
    assert wire.error_frame("vllm-0.33", "chat") == frame(CHAT33_ERROR_FRAME)
    assert wire.error_frame("vllm-0.33", "completions") == frame(CMPL33_ERROR_FRAME)
    assert wire.error_frame("vllm-0.11", "chat") == frame(
        'data: {"error": {"message": "Internal server error", "type": "BadRequestError", "param": null, "code": 400}}'
    )
    assert chat33().error() == [frame(CHAT33_ERROR_FRAME), wire.DONE]


def test_http_error_bodies_use_the_nested_shape() -> None:
    body = wire.error_body(
        "vllm-0.33",
        "The model `foo` does not exist. Valid aliases: Qwen/Qwen3-0.6B.",
        "NotFoundError",
        404,
        "model",
    )
    assert body == UNKNOWN_MODEL_33.encode()
    message = "max_tokens=100000 cannot be greater than max_model_len=4096. Please request fewer output tokens. (parameter=max_tokens, value=100000)"
    assert (
        wire.error_body("vllm-0.33", message, "BadRequestError", 400, "max_tokens")
        == MAX_TOKENS_TOO_LARGE_33.encode()
    )


def test_n_greater_than_one_sends_every_role_chunk_first_then_one_choice_per_chunk() -> None:
    encoder = chat33(n=2, include_usage=True)
    out = encoder.output(1, "B")
    assert [json.loads(f[6:])["choices"][0]["index"] for f in out] == [0, 1, 1]
    assert json.loads(out[0][6:])["choices"][0]["delta"] == {"role": "assistant", "content": ""}
    encoder.output(0, "A", finish_reason="length")
    encoder.output(1, "C", finish_reason="stop", stop_reason="\n")
    usage = json.loads(encoder.end()[0][6:])["usage"]
    assert usage == {"prompt_tokens": 12, "total_tokens": 15, "completion_tokens": 3}


def test_a_stop_string_is_reported_as_stop_reason_on_the_finish_chunk() -> None:
    encoder = chat33()
    encoder.output(0, "Hi")
    chunk = json.loads(encoder.output(0, "!", finish_reason="stop", stop_reason="###")[0][6:])
    assert chunk["choices"][0]["stop_reason"] == "###"


def test_non_ascii_text_is_sent_raw_as_utf8() -> None:
    frame_bytes = chat33().output(0, "café 東京 🙂")[1]
    assert "café 東京 🙂".encode() in frame_bytes


def test_ids_have_16_hex_in_033_and_32_in_011() -> None:
    assert wire.id_hex_length("vllm-0.33") == 16
    assert wire.id_hex_length("vllm-0.11") == 32
    assert wire.fingerprint("vllm-0.11", MODEL) is None
    fp = wire.fingerprint("vllm-0.33", MODEL)
    assert fp is not None and fp.startswith("vllm-0.33.0-") and len(fp) == len(FP)


# End to end: the emulator itself, over a socket, with the reference's values pinned
# (model, script, created, fingerprint, X-Request-Id) and a 12-token prompt.

PINNED = {
    "model": MODEL,
    "created": CREATED,
    "system_fingerprint": FP,
    "script": ["Hello", "!", " How", " can", " I", " help?"],
    "itl": 0.05,  # wide gaps, so a busy host does not make the writer merge tokens
}
PROMPT_12 = [{"role": "user", "content": "Say hello to me now"}]  # 3 + 4 + 5 tokens


def test_the_emulator_streams_the_reference_033_chat_bytes(emulator: Any) -> None:
    server = emulator(**PINNED)
    body = {"model": MODEL, "messages": PROMPT_12, "max_tokens": 3, "stream": True}
    plain = server.raw("/v1/chat/completions", body, {"X-Request-Id": ID33})
    expected = [CHAT33_ROLE, CHAT33_HELLO, CHAT33_BANG, CHAT33_FINISH_LENGTH, "data: [DONE]"]
    assert plain.chunks == [frame(line) for line in expected]
    usage = {**body, "stream_options": {"include_usage": True}}
    with_usage = server.raw("/v1/chat/completions", usage, {"X-Request-Id": ID33})
    expected = [CHAT33_ROLE, CHAT33_HELLO, CHAT33_BANG, CHAT33_FINISH_WITH_USAGE, CHAT33_USAGE]
    assert with_usage.chunks == [frame(line) for line in [*expected, "data: [DONE]"]]


def test_the_emulator_answers_the_reference_033_chat_body(emulator: Any) -> None:
    server = emulator(**PINNED)
    body = {"model": MODEL, "messages": PROMPT_12}
    status, headers, payload = server.request(
        "POST", "/v1/chat/completions", body, {"X-Request-Id": ID33}
    )
    assert status == 200 and headers["content-type"] == "application/json"
    assert payload == CHAT33_FULL_BODY.encode()
