"""Tool calls against a real vLLM 0.32.0 (`--enable-auto-tool-choice --tool-call-parser hermes`,
realvllm/serve.TOOL_CALL_FLAGS: a server of this module's own, since those flags change plain
answers too) and the emulator's `vllm-0.32` profile: the same requests, the same shapes.

The random-weight model cannot choose a tool under `auto` (it answers in text), but guided
decoding makes it call one under a named or `required` tool_choice, which is what is compared:
frames masked as wirecompare masks them (ids, created, text, counts, fingerprint hash) plus the
argument fragments, a run of identical shapes counted once (their number is the token count);
the 400s of vLLM's check_tool_usage byte for byte. A second server start (~50 s) and a second.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import pytest

from realvllm import serve
from tests.real_vllm.conftest import Emulator
from tests.real_vllm.wirecompare import body_shape, fetch, skeleton, spacing

MODEL = serve.SERVED_NAME
WEATHER = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "parameters": {
            "type": "object",
            "properties": {"city": {"type": "string"}, "days": {"type": "integer"}},
            "required": ["city", "days"],
        },
    },
}
NAMED = {"type": "function", "function": {"name": "get_weather"}}


@pytest.fixture(scope="module")
def vllm_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[serve.Server]:
    """This module's real vLLM, with the tool-call parser (overrides the tier's)."""
    server = serve.start(
        extra_args=list(serve.TOOL_CALL_FLAGS), log_dir=tmp_path_factory.mktemp("vllm-tools")
    )
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture(scope="module")
def emulator(middlebox_bin: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Emulator]:
    config = {"profile": "vllm-0.32", "model": MODEL, "max_model_len": serve.MAX_MODEL_LEN,
              "kv_block_size": 128, "itl": 0.0005, "prefill_overhead": 0.005,
              "tool_calls_per_response": 3}  # fmt: skip
    emu = Emulator(middlebox_bin, config, tmp_path_factory.mktemp("emulator-tools"))
    try:
        yield emu
    finally:
        emu.stop()


def chat(**fields: Any) -> dict[str, Any]:
    return {"model": MODEL, "messages": [{"role": "user", "content": "Weather?"}],
            "temperature": 0, **fields}  # fmt: skip


def masked(value: Any, key: str | None = None) -> Any:
    """Argument fragments, and which call a tool-call entry belongs to, masked too."""
    if isinstance(value, dict):
        return {k: "<arguments>" if k == "arguments" else masked(v, k) for k, v in value.items()}
    if isinstance(value, list):
        if key == "tool_calls":
            return [{**masked(v), "index": "<call>"} if isinstance(v, dict) else v for v in value]
        return [masked(v) for v in value]
    return value


def stream_shapes(body: bytes) -> list[Any]:
    shapes: list[Any] = []
    for frame in body.decode("utf-8").split("\n\n"):
        if not frame.startswith("data: "):
            continue
        payload = frame[len("data: ") :]
        shape: Any = ("done",)
        if payload != "[DONE]":
            parsed = json.loads(payload)
            shape = (spacing(payload, parsed), skeleton(masked(parsed)))
        if not shapes or shapes[-1] != shape:
            shapes.append(shape)
    return shapes


def both(vllm_server: serve.Server, emulator: Emulator, body: dict[str, Any]) -> tuple[Any, Any]:
    real = fetch(vllm_server.url, "POST", "/v1/chat/completions", body)
    ours = fetch(emulator.url, "POST", "/v1/chat/completions", body)
    assert real.status_line == ours.status_line
    assert [n for n, _ in real.headers] == [n for n, _ in ours.headers]
    return real, ours


def test_a_named_tool_call_stream_ending_in_stop_matches(
    vllm_server: serve.Server, emulator: Emulator
) -> None:
    # Enough room for the guided decoder to close the arguments: the EOS is an empty delta.
    body = chat(stream=True, tools=[WEATHER], tool_choice=NAMED, max_tokens=400)
    real, ours = both(vllm_server, emulator, body)
    assert stream_shapes(ours.body) == stream_shapes(real.body)


def test_a_required_stream_names_each_call_then_streams_its_fragments(
    vllm_server: serve.Server, emulator: Emulator
) -> None:
    # The random-weight model loops on calls until max_tokens (the one-off run: `length`
    # after 3 calls and a half in 200 tokens), the emulator closes its 3 and stops: how a
    # stream ends is the model's; the shapes until then are the wire format's.
    body = chat(stream=True, tools=[WEATHER], tool_choice="required", max_tokens=200)
    real, ours = both(vllm_server, emulator, body)
    real_shapes, our_shapes = stream_shapes(real.body), stream_shapes(ours.body)
    assert our_shapes[:3] == real_shapes[:3]  # role, the first call's name, its fragments
    assert all(shape in real_shapes for shape in our_shapes[:-2])
    assert our_shapes[-1] == real_shapes[-1] == ("done",)


def test_a_non_streamed_named_call_has_the_same_body(
    vllm_server: serve.Server, emulator: Emulator
) -> None:
    real, ours = both(vllm_server, emulator,
                      chat(tools=[WEATHER], tool_choice=NAMED, max_tokens=400))  # fmt: skip
    assert body_shape(json.dumps(masked(json.loads(ours.body))).encode()) == body_shape(
        json.dumps(masked(json.loads(real.body))).encode()
    )
    assert spacing(ours.body.decode(), json.loads(ours.body)) == "compact"


@pytest.mark.parametrize(
    "fields",
    [
        {"tools": [WEATHER], "tool_choice": {"type": "function", "function": {"name": "nope"}}},
        {"tool_choice": "auto"},
        {"tools": [WEATHER], "tool_choice": "sometimes"},
    ],
)
def test_a_refused_tool_choice_is_the_same_400(
    vllm_server: serve.Server, emulator: Emulator, fields: dict[str, Any]
) -> None:
    real, ours = both(vllm_server, emulator, chat(**fields))
    assert ours.body == real.body
