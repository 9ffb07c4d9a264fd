"""The ledger entry's JSON: the keys docs/emulator.md promises and how waste is counted."""

from __future__ import annotations

from vllm_emulator.ledger import LedgerEntry


def entry(**changes: object) -> LedgerEntry:
    fields: dict[str, object] = {
        "request_id": "abc",
        "endpoint": "chat",
        "model": "m",
        "stream": True,
        "prompt": [{"role": "user", "content": "hi"}],
        "prompt_tokens": 3,
        "max_tokens": 10,
        "received_at": 100.0,
    }
    fields.update(changes)
    return LedgerEntry(**fields)  # type: ignore[arg-type]


def test_tokens_generated_after_a_disconnect_and_never_delivered_are_wasted() -> None:
    left = entry(completion_tokens=10, delivered_tokens=4, disconnected_at=101.0)
    assert left.to_json()["wasted_tokens"] == 6


def test_a_client_that_stayed_wastes_nothing_even_with_undelivered_tokens() -> None:
    # Tokens still in flight when the stream ends normally are not waste: nobody left.
    assert entry(completion_tokens=10, delivered_tokens=4).to_json()["wasted_tokens"] == 0


def test_more_delivered_than_generated_never_gives_negative_waste() -> None:
    odd = entry(completion_tokens=2, delivered_tokens=5, disconnected_at=101.0)
    assert odd.to_json()["wasted_tokens"] == 0


def test_text_is_choice_zero_so_far_and_empty_not_null_once_planned() -> None:
    assert entry(texts=["Hel", "Wor"], planned_text="Hello").to_json()["text"] == "Hel"
    assert entry(planned_text="Hello").to_json()["text"] == ""
    assert entry().to_json()["text"] is None  # rejected or cassette: nothing was planned


def test_the_json_carries_exactly_the_contract_keys_the_scorer_reads() -> None:
    # The scorer and a user's tooling read these names (docs/emulator.md, "The ledger"):
    # renaming or dropping one is a contract change, not a refactor.
    assert list(entry().to_json()) == [
        "request_id", "id", "endpoint", "model", "stream", "prompt", "prompt_tokens",
        "max_tokens", "n", "received_at", "first_token_at", "finished_at", "planned_text",
        "planned_texts", "planned_tokens", "text", "texts", "completion_tokens", "token_times",
        "bytes_written", "write_times", "delivered_tokens", "disconnected_at", "aborted_at",
        "finish_reason", "stop_reason", "wasted_tokens", "status", "stream_id", "resumed_from",
        "resumes", "cassette", "output_kind", "tool_choice_mode", "planned_tool_calls",
        "tool_calls", "planned_reasoning", "reasoning", "planned_reasoning_tokens",
        "reasoning_tokens", "output_complete", "engine_finish_reason", "background",
        "cancelled_at",
    ]  # fmt: skip
