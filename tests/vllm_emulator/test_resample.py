"""A retried request continues differently, as vLLM samples at temperature > 0; `seed`,
temperature 0 and `retries_resample: false` keep it reproducible (textgen.samples)."""

from __future__ import annotations

import json
from typing import Any

import pytest

from vllm_emulator import textgen

MODEL = "middlebox/emulated-7b"


def text_of(server: Any, **extra: Any) -> str:
    body = {"model": MODEL, "messages": [{"role": "user", "content": "Hi"}], "max_tokens": 12}
    status, _, payload = server.request("POST", "/v1/chat/completions", {**body, **extra})
    assert status == 200
    return str(json.loads(payload)["choices"][0]["message"]["content"])


@pytest.mark.parametrize(
    ("body", "draws"),
    [
        ({}, True),  # vLLM's default temperature is 1.0
        ({"temperature": None}, True),
        ({"temperature": 0.7}, True),
        ({"temperature": 0}, False),  # greedy: the same tokens every time
        ({"temperature": 0.7, "seed": 4}, False),  # SamplingParams.seed
        ({"seed": 0}, False),
    ],
)
def test_a_request_samples_unless_greedy_or_seeded(body: dict[str, Any], draws: bool) -> None:
    assert textgen.samples(body) is draws


def test_the_first_draw_is_the_seed_of_before_and_each_retry_draws_anew() -> None:
    body = {"messages": [{"role": "user", "content": "Hi"}]}
    seeds = [textgen.request_seed(7, body, 0, draw) for draw in range(3)]
    assert seeds[0] == textgen.request_seed(7, body, 0)
    assert len(set(seeds)) == 3


def test_a_retry_continues_differently_from_the_first_attempt(emulator: Any) -> None:
    server = emulator()
    first, second = text_of(server), text_of(server)
    assert first and second and not first.startswith(second[:4])
    (a, b) = server.ledger()
    assert a["planned_text"] == first and b["planned_text"] == second


def test_seed_greedy_decoding_or_the_switch_off_reproduce_the_answer(emulator: Any) -> None:
    server = emulator()
    assert text_of(server, seed=11) == text_of(server, seed=11)
    assert text_of(server, temperature=0) == text_of(server, temperature=0)
    fixed = emulator(retries_resample=False)
    assert text_of(fixed) == text_of(fixed)


def test_a_fresh_emulator_draws_the_same_first_answer(emulator: Any) -> None:
    # the first attempt stays a pure function of (emulator seed, request): scoring and
    # golden tests keep their known text
    assert text_of(emulator(seed=3)) == text_of(emulator(seed=3))
