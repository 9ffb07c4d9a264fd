"""The requests the conformance test sends to both servers (same bytes to each).

Each is (name, method, path, body). Streams use `ignore_eos` so both servers produce exactly
`max_tokens` tokens; the emulator ignores the field (it is vLLM's own sampling parameter).
"""

from __future__ import annotations

from typing import Any

from realvllm.serve import MAX_MODEL_LEN, SERVED_NAME

MODEL = SERVED_NAME
__all__ = ["CASES", "MAX_MODEL_LEN", "MODEL"]
USER = [{"role": "user", "content": "Say something about streams."}]
# Over MAX_MODEL_LEN tokens for vLLM's tokenizer (" stream" is one token) and the emulator's.
LONG_PROMPT = "stream " * (MAX_MODEL_LEN + 1000)


def chat(**fields: Any) -> dict[str, Any]:
    return {"model": MODEL, "messages": USER, "max_tokens": 4, "ignore_eos": True, **fields}


def completion(**fields: Any) -> dict[str, Any]:
    return {"model": MODEL, "prompt": "Streams are", "max_tokens": 4, "ignore_eos": True, **fields}


CASES: list[tuple[str, str, str, Any]] = [
    ("chat-nonstream", "POST", "/v1/chat/completions", chat()),
    ("chat-stream", "POST", "/v1/chat/completions", chat(stream=True)),
    ("chat-stream-include-usage", "POST", "/v1/chat/completions",
     chat(stream=True, stream_options={"include_usage": True})),
    ("chat-stream-continuous-usage", "POST", "/v1/chat/completions",
     chat(stream=True, stream_options={"include_usage": True, "continuous_usage_stats": True})),
    ("chat-stream-n2", "POST", "/v1/chat/completions",
     chat(stream=True, n=2, stream_options={"include_usage": True})),
    ("chat-nonstream-n2", "POST", "/v1/chat/completions", chat(n=2)),
    ("completions-nonstream", "POST", "/v1/completions", completion()),
    ("completions-stream", "POST", "/v1/completions", completion(stream=True)),
    ("completions-stream-include-usage", "POST", "/v1/completions",
     completion(stream=True, stream_options={"include_usage": True})),
    ("completions-stream-continuous-usage", "POST", "/v1/completions",
     completion(stream=True, stream_options={"include_usage": True,
                                             "continuous_usage_stats": True})),
    ("completions-stream-n2", "POST", "/v1/completions", completion(stream=True, n=2)),
    # A stop string nobody generates: the shape of a request with `stop` (finish "length").
    ("chat-stream-stop-string", "POST", "/v1/chat/completions",
     chat(stream=True, stop=["\u2603never\u2603"])),
    ("chat-max-tokens-beyond-context", "POST", "/v1/chat/completions",
     chat(max_tokens=MAX_MODEL_LEN + 100)),
    ("completions-max-tokens-beyond-context", "POST", "/v1/completions",
     completion(max_tokens=MAX_MODEL_LEN + 100)),
    ("chat-unknown-model", "POST", "/v1/chat/completions", chat(model="no-such-model")),
    ("completions-unknown-model", "POST", "/v1/completions", completion(model="no-such-model")),
    ("chat-wrong-type-max-tokens", "POST", "/v1/chat/completions", chat(max_tokens="four")),
    ("chat-wrong-type-messages", "POST", "/v1/chat/completions", chat(messages="hello")),
    ("chat-wrong-type-stream", "POST", "/v1/chat/completions", chat(stream="maybe")),
    ("chat-prompt-over-context", "POST", "/v1/chat/completions",
     chat(messages=[{"role": "user", "content": LONG_PROMPT}])),
    ("completions-prompt-over-context", "POST", "/v1/completions",
     completion(prompt=LONG_PROMPT)),
    ("chat-stream-options-without-stream", "POST", "/v1/chat/completions",
     chat(stream_options={"include_usage": True})),
    ("chat-not-json", "POST", "/v1/chat/completions", b"{not json"),
    ("models", "GET", "/v1/models", None),
    ("health", "GET", "/health", None),
    ("version", "GET", "/version", None),
]  # fmt: skip
