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


# A prompt vLLM's test model answers in ~21 tokens at temperature 0 (then EOS), so a
# response ends `completed` / `end_turn` within 64 tokens; the emulator's natural length in
# the tier is set below that (test_conformance.py). The model's weights are random, so its
# greedy path is the host's: where a CPU's kernels round a close argmax the other way, SHORT
# may run to the cut. Its cases then ask the first of NATURAL_PROMPTS that ends by EOS with
# text on this server (`natural_prompt`): on the tier's host 4 of the first 15 do, so
# 30 leave about one host in 10,000 without one, if hosts' paths are independent.
SHORT = "Say hello."
NATURAL_PROMPTS = (
    SHORT, "Name a colour.", "Say goodbye.", "Greet me.", "Hi.", "Say yes.", "Count to three.",
    "Thanks!", "What is 2+2?", "Reply with one word.", "Good morning.", "Tell me a joke.",
    "Say ok.", "Name a fruit.", "Hello there.", "Name an animal.", "Say thank you.",
    "What day is it?", "Pick a number.", "Say something short.", "Name a city.", "Good night.",
    "How are you?", "Describe the sky.", "Name a tree.", "Say welcome.", "What is water?",
    "Name a planet.", "Say please.", "Give me a word.",
)  # fmt: skip


def asking(body: Any, prompt: str) -> Any:
    """`body` with SHORT replaced by `prompt` (a Responses `input`, a Messages message)."""
    if body == SHORT:
        return prompt
    if isinstance(body, dict):
        return {key: asking(value, prompt) for key, value in body.items()}
    if isinstance(body, list):
        return [asking(value, prompt) for value in body]
    return body


def asks_short(body: Any) -> bool:
    return bool(asking(body, "") != body)


TOOL = {"type": "function", "name": "get_weather",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}}}}  # fmt: skip


def response(**fields: Any) -> dict[str, Any]:
    return {"model": MODEL, "input": USER[0]["content"], "max_output_tokens": 4,
            "ignore_eos": True, **fields}  # fmt: skip


def message(**fields: Any) -> dict[str, Any]:
    return {"model": MODEL, "messages": USER, "max_tokens": 4, "ignore_eos": True, **fields}


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
    # The Responses API (vLLM 0.32, no tool-call or reasoning parser).
    ("responses-nonstream", "POST", "/v1/responses", response()),
    ("responses-stream", "POST", "/v1/responses", response(stream=True)),
    ("responses-nonstream-completed", "POST", "/v1/responses",
     response(input=SHORT, max_output_tokens=64, temperature=0, ignore_eos=False)),
    ("responses-stream-completed", "POST", "/v1/responses",
     response(input=SHORT, max_output_tokens=64, temperature=0, ignore_eos=False, stream=True)),
    ("responses-stream-instructions-sampling", "POST", "/v1/responses",
     response(stream=True, instructions="Be brief.", temperature=0.5, top_p=0.9,
              metadata={"k": "v"}, user="u1")),
    # Without a tool parser a function tool and a named tool_choice stream plain text.
    ("responses-stream-named-tool", "POST", "/v1/responses",
     response(stream=True, tools=[TOOL], tool_choice={"type": "function", "name": "get_weather"})),
    ("responses-nonstream-auto-tool", "POST", "/v1/responses", response(tools=[TOOL])),
    ("responses-reasoning-effort", "POST", "/v1/responses",
     response(reasoning={"effort": "low"})),
    ("responses-unknown-model", "POST", "/v1/responses", response(model="no-such-model")),
    ("responses-wrong-type-max-output-tokens", "POST", "/v1/responses",
     response(max_output_tokens="four")),
    ("responses-wrong-type-input", "POST", "/v1/responses", response(input=5)),
    ("responses-missing-input", "POST", "/v1/responses",
     {"model": MODEL, "max_output_tokens": 4}),
    ("responses-not-json", "POST", "/v1/responses", b"{not json"),
    ("responses-max-output-tokens-beyond-context", "POST", "/v1/responses",
     response(max_output_tokens=MAX_MODEL_LEN + 100)),
    ("responses-prompt-over-context", "POST", "/v1/responses", response(input=LONG_PROMPT)),
    ("responses-previous-response-unknown", "POST", "/v1/responses",
     response(previous_response_id="resp_0123456789abcdef")),
    ("responses-get-unknown", "GET", "/v1/responses/resp_0123456789abcdef", None),
    ("responses-cancel-unknown", "POST", "/v1/responses/resp_0123456789abcdef/cancel", None),
    # Anthropic's Messages API.
    ("messages-nonstream", "POST", "/v1/messages", message()),
    ("messages-stream", "POST", "/v1/messages", message(stream=True)),
    ("messages-nonstream-end-turn", "POST", "/v1/messages",
     message(messages=[{"role": "user", "content": SHORT}], max_tokens=64, temperature=0,
             ignore_eos=False)),
    ("messages-stream-end-turn", "POST", "/v1/messages",
     message(messages=[{"role": "user", "content": SHORT}], max_tokens=64, temperature=0,
             ignore_eos=False, stream=True)),
    ("messages-stream-system", "POST", "/v1/messages", message(stream=True, system="Be brief.")),
    ("messages-unknown-model", "POST", "/v1/messages", message(model="no-such-model")),
    ("messages-stream-unknown-model", "POST", "/v1/messages",
     message(model="no-such-model", stream=True)),
    ("messages-missing-max-tokens", "POST", "/v1/messages", {"model": MODEL, "messages": USER}),
    ("messages-wrong-type-max-tokens", "POST", "/v1/messages", message(max_tokens="four")),
    ("messages-wrong-type-messages", "POST", "/v1/messages", message(messages="hello")),
    ("messages-not-json", "POST", "/v1/messages", b"{not json"),
    ("messages-max-tokens-beyond-context", "POST", "/v1/messages",
     message(max_tokens=MAX_MODEL_LEN + 100)),
    ("messages-prompt-over-context", "POST", "/v1/messages",
     message(messages=[{"role": "user", "content": LONG_PROMPT}])),
    ("messages-tools-auto", "POST", "/v1/messages",
     message(tools=[{"name": "f", "input_schema": {"type": "object", "properties": {}}}])),
    ("messages-tools-named", "POST", "/v1/messages",
     message(tools=[{"name": "f", "input_schema": {"type": "object", "properties": {}}}],
             tool_choice={"type": "tool", "name": "f"})),
    ("messages-thinking-budget-over-max-tokens", "POST", "/v1/messages",
     message(thinking={"type": "enabled", "budget_tokens": 1024})),
    ("models", "GET", "/v1/models", None),
    ("health", "GET", "/health", None),
    ("version", "GET", "/version", None),
]  # fmt: skip
