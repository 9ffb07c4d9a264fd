"""Agent streams on the wire: tool-call, JSON and reasoning chunks as vLLM sends them.

Golden: the emulator's named tool-call and json_schema streams (profile vllm-0.32) have the
shapes of a real vLLM 0.32.0's, read from shared/reference/vllm-0.32-captures/ and masked as
tests/real_vllm/wirecompare.py masks them (ids, created, text, counts, fingerprint hash), plus
the argument fragments; runs of identical token-frame shapes count once (their number is the
token count). Then the encoder's frames byte for byte, and the emulator over a socket: ledger,
non-streaming bodies, 400s, metrics.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import pytest

from tests.real_vllm.wirecompare import skeleton, spacing
from vllm_emulator import agent, wire
from vllm_emulator.agent import REASONING, SILENT, TOOL_ARGS, TOOL_NAME, ToolCall
from vllm_emulator.wire import Choice, StreamEncoder, Usage

CAPTURES = Path(__file__).resolve().parents[3] / "shared" / "reference" / "vllm-0.32-captures"
if not CAPTURES.is_dir():
    CAPTURES = Path("/work/shared/reference/vllm-0.32-captures")
MODEL = "middlebox/emulated-7b"
WEATHER = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "Weather in a city",
        "parameters": {
            "type": "object",
            "properties": {"city": {"type": "string"}, "days": {"type": "integer"}},
            "required": ["city", "days"],
        },
    },
}
EMAIL = {
    "type": "function",
    "function": {
        "name": "send_email",
        "parameters": {
            "type": "object",
            "properties": {"to": {"type": "string"}},
            "required": ["to"],
        },
    },
}
NAMED = {"type": "function", "function": {"name": "get_weather"}}
SCHEMA = {
    "type": "object",
    "properties": {"city": {"type": "string"}, "temperature": {"type": "number"}},
    "required": ["city", "temperature"],
}


def capture(name: str) -> str:
    path = CAPTURES / name
    if not path.is_file():
        if os.environ.get("CI"):
            pytest.fail(f"{path} is missing (CI=true, so this fails)")
        pytest.skip(f"{path} is missing here; under CI=true this fails")
    return path.read_text(encoding="utf-8")


def masked_frames(body: str) -> list[Any]:
    """Each frame as (spacing, masked skeleton), argument fragments masked too; a run of
    identical shapes counts once."""
    shapes: list[Any] = []
    for frame in body.split("\n\n"):
        if not frame.startswith("data: "):
            continue
        payload = frame[len("data: ") :]
        if payload == "[DONE]":
            shape: Any = ("done",)
        else:
            parsed = json.loads(payload)
            style = spacing(payload, parsed)
            for choice in parsed.get("choices", []):
                for call in choice.get("delta", {}).get("tool_calls", []):
                    if "arguments" in call.get("function", {}):
                        call["function"]["arguments"] = "<arguments>"
            shape = (style, skeleton(parsed))
        if not shapes or shapes[-1] != shape:
            shapes.append(shape)
    return shapes


def chat(model: str = MODEL, **fields: Any) -> dict[str, Any]:
    return {"model": model, "messages": [{"role": "user", "content": "Weather?"}], **fields}


# ------------------------------------------------------------------ golden shapes


def test_a_named_tool_call_stream_has_the_real_vllm_0_32_shapes(emulator: Any) -> None:
    real = capture("tool-call-named-stream.txt")
    head, _, real_body = real.partition("\n\n")
    server = emulator(profile="vllm-0.32", model="chat")  # the capture's --served-model-name
    # The capture was cut by max_tokens inside the arguments: finish_reason `length` on
    # the last fragment's chunk, which a named tool_choice keeps (no `tool_calls`).
    result = server.raw(
        "/v1/chat/completions",
        chat("chat", stream=True, tools=[WEATHER], tool_choice=NAMED, max_tokens=6),
    )
    ours = result.body.decode("utf-8")
    assert masked_frames(ours) == masked_frames(real_body)
    real_names = [line.split(":")[0] for line in head.splitlines()[1:]]
    our_names = [line.split(":")[0] for line in result.head.decode().split("\r\n")[1:]]
    assert our_names == real_names
    finish = json.loads(ours.split("\n\n")[-3][6:])["choices"][0]
    assert finish["finish_reason"] == "length" and "tool_calls" in finish["delta"]


def test_a_json_schema_stream_has_the_real_vllm_0_32_shapes(emulator: Any) -> None:
    real_body = capture("json-schema-stream.txt")
    server = emulator(profile="vllm-0.32", model="chat")
    response_format = {"type": "json_schema", "json_schema": {"name": "w", "schema": SCHEMA}}
    body = chat("chat", stream=True, response_format=response_format)
    result = server.raw("/v1/chat/completions", body)
    ours = result.body.decode("utf-8")
    assert masked_frames(ours) == masked_frames(real_body)
    chunks = [json.loads(f) for f in result.data_frames()[:-1]]
    text = "".join(c["choices"][0]["delta"].get("content", "") for c in chunks[1:])
    assert set(json.loads(text)) == {"city", "temperature"}
    assert chunks[-1]["choices"][0]["delta"] == {}  # the EOS: an empty delta, as captured


# ------------------------------------------------------------------ the encoder


def encoder(profile: wire.Profile = "vllm-0.32") -> StreamEncoder:
    return StreamEncoder(profile, "chat", "chatcmpl-abc", 1700000000, "m", 5)


CALL = ToolCall(0, "chatcmpl-tool-0123456789abcdef", "get_weather", '{"city": "Paris"}')
HEAD = '{"id":"chatcmpl-abc","object":"chat.completion.chunk","created":1700000000,"model":"m",'


def test_a_named_call_is_named_in_its_own_chunk_then_streams_fragments() -> None:
    stream = encoder()
    frames = stream.output(0, '{"ci', channel=TOOL_ARGS, tool=CALL)
    frames += stream.output(0, 'ty": "Paris"}', channel=TOOL_ARGS, tool=CALL)
    frames += stream.output(0, "", finish_reason="stop", channel=SILENT)
    tail = '"logprobs":null,"finish_reason":null,"token_ids":null}]}\n\n'
    assert frames[1:] == [
        (f"data: {HEAD}"
         '"choices":[{"index":0,"delta":{"content":null,"tool_calls":[{"id":'
         '"chatcmpl-tool-0123456789abcdef","type":"function","index":0,"function":{"name":'
         f'"get_weather"}}}}]}},{tail}').encode(),
        (f"data: {HEAD}"
         '"choices":[{"index":0,"delta":{"content":null,"tool_calls":[{"index":0,"function":'
         f'{{"arguments":"{{\\"ci"}}}}]}},{tail}').encode(),
        (f"data: {HEAD}"
         '"choices":[{"index":0,"delta":{"content":null,"tool_calls":[{"index":0,"function":'
         f'{{"arguments":"ty\\": \\"Paris\\"}}"}}}}]}},{tail}').encode(),
        (f"data: {HEAD}"
         '"choices":[{"index":0,"delta":{},"logprobs":null,"finish_reason":"stop",'
         '"stop_reason":null,"token_ids":null}],"system_fingerprint":null}\n\n').encode(),
    ]  # fmt: skip
    assert stream.completion_tokens == 3


def test_hidden_markup_sends_nothing_and_the_naming_token_names_the_call_once() -> None:
    stream = encoder()
    assert len(stream.output(0, "", channel=SILENT)) == 1  # only the role chunk, at TTFT
    assert stream.output(0, "", channel=SILENT) == []
    named = stream.output(0, "", channel=TOOL_NAME, tool=CALL)
    assert len(named) == 1 and b'"name":"get_weather"' in named[0]
    fragment = stream.output(0, "{", channel=TOOL_ARGS, tool=CALL)
    assert len(fragment) == 1 and b'"name"' not in fragment[0]
    assert stream.completion_tokens == 4  # hidden tokens still count


@pytest.mark.parametrize(
    ("profile", "field"),
    [("vllm-0.33", "reasoning"), ("vllm-0.32", "reasoning"), ("vllm-0.11", "reasoning_content")],
)
def test_reasoning_deltas_use_the_profiles_field(profile: wire.Profile, field: str) -> None:
    stream = encoder(profile)
    (_, frame) = stream.output(0, "Let me think", channel=REASONING)
    assert json.loads(frame[6:])["choices"][0]["delta"] == {field: "Let me think"}


def test_the_033_profile_keeps_its_kv_transfer_params_null_on_tool_chunks() -> None:
    (_, _, fragment) = encoder("vllm-0.33").output(0, "{", channel=TOOL_ARGS, tool=CALL)
    assert fragment.endswith(b',"kv_transfer_params":null}\n\n')


def non_stream(profile: wire.Profile, choice: Choice) -> dict[str, Any]:
    body = wire.chat_response(profile, "chatcmpl-abc", 1, "m", [choice], Usage(5, 9))
    message: dict[str, Any] = json.loads(body)["choices"][0]["message"]
    return message


def test_non_streaming_tool_calls_sit_between_function_call_and_reasoning() -> None:
    message = non_stream("vllm-0.32", Choice(0, "", "tool_calls", None, (CALL,), True, "hm"))
    assert list(message) == ["role", "content", "refusal", "annotations", "audio",
                             "function_call", "tool_calls", "reasoning"]  # fmt: skip
    assert message["content"] is None and message["reasoning"] == "hm"
    assert message["tool_calls"] == [{"id": CALL.id, "type": "function",
                                      "function": {"name": "get_weather",
                                                   "arguments": '{"city": "Paris"}'}}]  # fmt: skip
    old = non_stream("vllm-0.11", Choice(0, "hi", "stop"))
    assert old["tool_calls"] == [] and old["reasoning_content"] is None


def test_a_non_streamed_auto_call_cut_by_max_tokens_is_raw_text_ending_in_length() -> None:
    planned = agent.plan_choice(1, {"tools": [WEATHER]}, 12, 100, (16, 64), (), agent.Options())
    choice = wire.agent_choice(0, planned)
    assert choice.finish_reason == "length" and choice.tool_calls == ()
    assert choice.text.startswith("<tool_call>")
    whole = agent.plan_choice(1, {"tools": [WEATHER]}, None, 100, (16, 64), (), agent.Options())
    called = wire.agent_choice(0, whole)
    assert called.finish_reason == "tool_calls" and called.content_null
    assert called.tool_calls == whole.tool_calls


# ------------------------------------------------------------------ over a socket


def streamed_calls(frames: list[str]) -> dict[int, dict[str, Any]]:
    """What the openai SDK's accumulation loop would build from the chunks."""
    calls: dict[int, dict[str, Any]] = {}
    for frame in frames[:-1]:
        for choice in json.loads(frame)["choices"]:
            for delta in choice["delta"].get("tool_calls", []):
                call = calls.setdefault(delta["index"], {"name": None, "arguments": ""})
                if "id" in delta:
                    call["id"], call["name"] = delta["id"], delta["function"]["name"]
                call["arguments"] += delta["function"].get("arguments", "")
    return calls


def test_the_ledger_holds_the_planned_calls_a_client_can_rebuild_from_the_stream(
    emulator: Any,
) -> None:
    server = emulator(tool_calls_per_response=2)
    result = server.raw("/v1/chat/completions", chat(stream=True, tools=[WEATHER, EMAIL]))
    frames = result.data_frames()
    calls = streamed_calls(frames)
    (entry,) = server.ledger()
    assert entry["output_kind"] == "tool_calls" and entry["tool_choice_mode"] == "auto"
    assert (
        [
            {"index": i, "id": c["id"], "name": c["name"], "arguments": c["arguments"]}
            for i, c in sorted(calls.items())
        ]
        == entry["planned_tool_calls"]
        == entry["tool_calls"]
    )
    assert [c["name"] for c in entry["planned_tool_calls"]] == ["get_weather", "send_email"]
    assert json.loads(frames[-2])["choices"][0]["finish_reason"] == "tool_calls"
    assert entry["finish_reason"] == "tool_calls" and entry["engine_finish_reason"] == "stop"
    assert entry["output_complete"] is True and entry["text"] == ""
    # Hidden markup tokens ride with the next frame written, so none count as undelivered.
    assert entry["delivered_tokens"] == entry["completion_tokens"] > len(frames)
    # vLLM's engine finished with `stop`: `tool_calls` is the API server's word only.
    assert server.metric("vllm:request_success_total", finished_reason="stop") == 1.0


def test_a_reasoning_phase_streams_before_the_answer_and_is_counted(emulator: Any) -> None:
    server = emulator(reasoning_tokens=6)
    result = server.raw("/v1/chat/completions", chat(stream=True, max_tokens=12))
    deltas = [json.loads(f)["choices"][0]["delta"] for f in result.data_frames()[1:-1]]
    kinds = [next(iter(d)) for d in deltas]
    first_content = kinds.index("content")
    assert set(kinds[:first_content]) == {"reasoning"} and set(kinds[first_content:]) == {"content"}
    (entry,) = server.ledger()
    assert entry["reasoning_tokens"] == entry["planned_reasoning_tokens"] == 6
    assert entry["reasoning"] == "".join(d.get("reasoning", "") for d in deltas)
    assert entry["text"] == "".join(d.get("content", "") for d in deltas)
    assert entry["completion_tokens"] == 12 and entry["output_kind"] == "text"


def test_a_non_streamed_named_call_is_in_message_tool_calls(emulator: Any) -> None:
    server = emulator(profile="vllm-0.32", seed=4)
    status, _, body = server.request(
        "POST", "/v1/chat/completions", chat(tools=[WEATHER], tool_choice=NAMED, seed=1)
    )
    assert status == 200
    choice = json.loads(body)["choices"][0]
    (call,) = choice["message"]["tool_calls"]
    (entry,) = server.ledger()
    assert choice["message"]["content"] == "" and choice["finish_reason"] == "stop"
    assert call["function"]["arguments"] == entry["planned_tool_calls"][0]["arguments"]
    assert set(json.loads(call["function"]["arguments"])) == {"city", "days"}


@pytest.mark.parametrize(
    ("profile", "fields", "message", "param"),
    [
        ("vllm-0.32", {"tools": [WEATHER], "tool_choice": {"type": "function",
                                                          "function": {"name": "nope"}}},
         "The tool specified in `tool_choice` does not match any of the specified `tools` "
         "(parameter=tool_choice)", "tool_choice"),
        ("vllm-0.33", {"tool_choice": "required"},
         "When using `tool_choice`, `tools` must be set. (parameter=tool_choice)", "tool_choice"),
        ("vllm-0.11", {"tool_choice": "auto"},
         "1 validation error:\n  {'type': 'value_error', 'loc': ('body',), 'msg': 'Value error, "
         "When using `tool_choice`, `tools` must be set.'", None),
    ],
)  # fmt: skip
def test_a_refused_tool_choice_is_a_400_before_any_stream(
    emulator: Any, profile: str, fields: dict[str, Any], message: str, param: str | None
) -> None:
    server = emulator(profile=profile)
    status, _, body = server.request("POST", "/v1/chat/completions", chat(stream=True, **fields))
    error = json.loads(body)["error"]
    assert status == 400 and error["code"] == 400
    assert error["message"].startswith(message) and error["param"] == param
    (entry,) = server.ledger()
    assert entry["status"] == 400 and entry["completion_tokens"] == 0


def test_tool_choice_none_answers_in_plain_text(emulator: Any) -> None:
    server = emulator()
    result = server.raw(
        "/v1/chat/completions", chat(stream=True, tools=[WEATHER], tool_choice="none", max_tokens=4)
    )
    assert all("tool_calls" not in f for f in result.data_frames())
    (entry,) = server.ledger()
    assert entry["output_kind"] == "text" and entry["planned_tool_calls"] == []
    assert entry["text"] == entry["planned_text"] != ""


def test_a_seeded_retry_gets_the_same_arguments_under_a_new_call_id(emulator: Any) -> None:
    # vLLM's make_tool_call_id is random per response, whatever the sampling seed: the id
    # cannot serve as an idempotency key across retries, the arguments are what repeats.
    server = emulator()
    body = chat(tools=[WEATHER], tool_choice=NAMED, seed=5)
    first, second = (
        json.loads(server.request("POST", "/v1/chat/completions", body)[2])["choices"][0][
            "message"
        ]["tool_calls"][0]
        for _ in range(2)
    )
    assert first["function"] == second["function"]
    assert first["id"] != second["id"]
