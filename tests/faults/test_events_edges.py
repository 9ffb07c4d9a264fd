"""Which SSE events count as tokens for the faults (`middlebox.core.dialects`' one rule),
and the event counter on its own framing (faults/_lib/events.py): the chunks a vLLM or a
broken hop can send that carry no text."""

from __future__ import annotations

import json
from typing import Any

import pytest

from faults._lib.events import EventCounter
from middlebox.core.dialects import read
from middlebox.core.sse import SseEvent


def token_bearing(event: SseEvent) -> bool:
    return read(event).token is not None


def event(data: str) -> SseEvent:
    return SseEvent(data, "message", None, None, (), 0, "", f"data: {data}\n\n".encode())


def chunk(*choices: Any) -> SseEvent:
    return event(json.dumps({"object": "chat.completion.chunk", "choices": list(choices)}))


@pytest.mark.parametrize(
    "choice",
    [
        {"delta": {"content": "Hi"}},
        {"delta": {"reasoning": "think"}},
        {"delta": {"reasoning_content": "think"}},
        {"delta": {"tool_calls": [{"index": 0, "function": {"arguments": "{"}}]}},
        {"text": "Hi"},  # a completions chunk
    ],
)
def test_a_choice_with_generated_text_of_any_kind_bears_a_token(choice: dict[str, Any]) -> None:
    assert token_bearing(chunk(choice))


@pytest.mark.parametrize(
    "choice",
    [
        {"delta": {"role": "assistant", "content": ""}},  # vLLM's first (role) chunk
        {"delta": {"tool_calls": []}},
        {"text": ""},
        {"text": 5},  # text that is not a string
        {"delta": "content"},  # a delta that is not an object
        "not a choice object",
    ],
)
def test_a_choice_without_text_bears_no_token(choice: Any) -> None:
    assert not token_bearing(chunk(choice))


def test_any_choice_with_text_makes_the_event_bear_a_token() -> None:
    assert token_bearing(chunk("junk", {"delta": {}}, {"delta": {"content": "x"}}))


@pytest.mark.parametrize(
    "data",
    [
        "[DONE]",
        "not json {",
        '"a json string"',
        "[1, 2]",
        '{"choices": {"0": {"text": "x"}}}',  # choices not a list
        '{"usage": {"completion_tokens": 3}, "choices": []}',
        '{"error": {"message": "overloaded"}}',
    ],
)
def test_done_errors_usage_and_garbage_bear_no_token(data: str) -> None:
    assert not token_bearing(event(data))


def test_a_counter_without_a_position_frames_its_own_bytes_across_split_feeds() -> None:
    counter = EventCounter()
    head = b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\n\r\n"
    assert counter.feed(head + b"data: a\n\n: keep-alive\n\nda") == 1
    assert counter.feed(b"ta: b\n") == 1  # not dispatched until its blank line
    assert counter.feed(b"\ndata: [DONE]\n\n") == 3
    counter.close()
    assert counter.events == 3
