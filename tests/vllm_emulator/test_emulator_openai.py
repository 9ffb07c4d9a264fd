"""The official openai client (the pinned one in the venv) against the emulator:
reassembled text equals the ledger's, usage and finish reasons are right."""

from __future__ import annotations

from typing import Any

import openai
import pytest

MODEL = "middlebox/emulated-7b"
MESSAGES = [{"role": "user", "content": "Tell me about café culture in 東京 🙂"}]


def client(server: Any) -> openai.OpenAI:
    return openai.OpenAI(base_url=server.url + "/v1", api_key="none", max_retries=0, timeout=20)


def test_openai_streams_chat_and_reassembles_the_ledger_text_with_usage(emulator: Any) -> None:
    server = emulator()
    stream = client(server).chat.completions.create(
        model=MODEL, messages=MESSAGES, max_tokens=40, stream=True,  # type: ignore[arg-type]
        stream_options={"include_usage": True},
    )  # fmt: skip
    text, finish, usage = "", None, None
    for chunk in stream:
        if chunk.choices:
            text += chunk.choices[0].delta.content or ""
            finish = chunk.choices[0].finish_reason or finish
        if chunk.usage is not None:
            usage = chunk.usage
    (entry,) = server.ledger()
    assert text == entry["text"] == entry["planned_text"] and text
    assert finish == "length" == entry["finish_reason"]
    assert usage is not None and usage.completion_tokens == 40 == entry["completion_tokens"]
    assert usage.prompt_tokens == entry["prompt_tokens"]
    assert usage.total_tokens == usage.prompt_tokens + 40


def test_openai_non_streaming_chat_matches_the_ledger(emulator: Any) -> None:
    server = emulator(natural_length_min=10, natural_length_max=20)
    response = client(server).chat.completions.create(model=MODEL, messages=MESSAGES)  # type: ignore[arg-type]
    (entry,) = server.ledger()
    assert response.choices[0].message.content == entry["text"]
    assert response.choices[0].finish_reason == "stop" == entry["finish_reason"]
    assert response.usage is not None
    assert response.usage.completion_tokens == entry["completion_tokens"]
    assert response.id == entry["id"]


@pytest.mark.parametrize("profile", ["vllm-0.33", "vllm-0.11"])
def test_openai_streams_and_non_streams_completions_in_both_profiles(
    emulator: Any, profile: str
) -> None:
    server = emulator(profile=profile)
    api = client(server)
    # the same `seed` (vLLM's per-request sampler seed) makes the two requests draw alike
    stream = api.completions.create(
        model=MODEL, prompt="The capital", max_tokens=25, stream=True, seed=3
    )
    pieces = [(c.choices[0].text, c.choices[0].finish_reason) for c in stream if c.choices]
    full = api.completions.create(
        model=MODEL, prompt="The capital", max_tokens=25, stop=["."], seed=3
    )
    streamed, plain = server.ledger()
    assert "".join(p[0] for p in pieces) == streamed["text"]
    assert pieces[-1][1] == "length"
    assert full.choices[0].text == plain["text"] == streamed["text"].split(".")[0]
    assert full.choices[0].finish_reason == plain["finish_reason"]
    assert full.usage is not None and full.usage.completion_tokens == plain["completion_tokens"]


def test_openai_raises_api_error_on_an_in_band_failure(emulator: Any) -> None:
    server = emulator(fail_after_tokens=2)
    stream = client(server).chat.completions.create(
        model=MODEL, messages=MESSAGES, max_tokens=10, stream=True  # type: ignore[arg-type]
    )  # fmt: skip
    with pytest.raises(openai.APIError, match="Internal server error"):
        for _ in stream:
            pass


def test_openai_sees_vllms_404_for_an_unknown_model(emulator: Any) -> None:
    server = emulator()
    with pytest.raises(openai.NotFoundError) as caught:
        client(server).chat.completions.create(model="gpt-9", messages=MESSAGES)  # type: ignore[arg-type]
    assert str(caught.value.code) == "404" and caught.value.param == "model"
