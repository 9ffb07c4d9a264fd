"""clients/plain_http: what the clients that write their own requests share: the bearer
header, a streamed chunk or a whole answer read from its JSON and shown, reasoning apart
from the answer or in it."""

from __future__ import annotations

import json

import pytest

from middlebox.clients.contract import ChunkInfo, ClientEnv, Recorder, RequestSpec
from middlebox.clients.plain_http import (
    answer_info,
    auth_headers,
    event_info,
    show_answer,
    show_chunk,
    show_info,
)

# vLLM 0.32's frames (shared/reference): a content delta, the finish, the usage chunk
DELTA = (
    '{"id":"c","object":"chat.completion.chunk","choices":[{"index":0,"delta":{"content":"Hi"}}]}'
)
FINISH = '{"choices":[{"index":0,"delta":{"content":"!"},"finish_reason":"stop"}]}'
USAGE = '{"choices":[],"usage":{"prompt_tokens":3,"completion_tokens":2,"total_tokens":5}}'


def recorder() -> Recorder:
    return Recorder(RequestSpec(0, "chat", {}))


def test_the_key_goes_as_a_bearer_token() -> None:
    env = ClientEnv("http://127.0.0.1:1/v1", "sk-test", "w.json", "r.json")
    assert auth_headers(env) == {"Authorization": "Bearer sk-test"}


def test_streamed_chunks_show_their_text_and_keep_the_finish_and_the_usage() -> None:
    rec = recorder()
    for data in (DELTA, FINISH, USAGE):
        show_chunk(rec, json.loads(data))
    assert [piece for _, piece in rec.chunks] == ["Hi", "!"]
    assert (rec.text, rec.finish_reason) == ("Hi!", "stop")
    assert rec.usage == {"prompt_tokens": 3, "completion_tokens": 2, "total_tokens": 5}


def test_a_whole_answer_is_one_piece_with_its_finish_and_usage() -> None:
    rec = recorder()
    body = {
        "choices": [{"index": 0, "message": {"content": "Hi!"}, "finish_reason": "length"}],
        "usage": {"completion_tokens": 2},
    }
    show_answer(rec, body)
    assert [piece for _, piece in rec.chunks] == ["Hi!"]
    assert (rec.finish_reason, rec.usage) == ("length", {"completion_tokens": 2})


def test_neither_shows_anything_for_an_object_that_is_no_completion() -> None:
    rec = recorder()
    show_chunk(rec, [1, 2])
    show_answer(rec, {"object": "list"})
    assert (rec.chunks, rec.finish_reason, rec.usage) == ([], None, None)


REASONING = '{"choices":[{"index":0,"delta":{"reasoning":"Think. ","content":"Yes"}}]}'


def test_an_event_and_an_answer_are_read_from_their_json_and_refused_when_not_json() -> None:
    assert event_info(FINISH) == ChunkInfo("!", "stop")
    assert answer_info(b'{"choices":[{"index":0,"text":" Paris"}]}') == ChunkInfo(" Paris")
    with pytest.raises(ValueError):
        event_info("{cut")
    with pytest.raises(ValueError):
        answer_info(b"<html>")


def test_reasoning_is_shown_apart_or_as_the_answer() -> None:
    apart, inline = recorder(), recorder()
    show_info(apart, event_info(REASONING))
    show_info(inline, event_info(REASONING), reasoning_as_answer=True)
    assert [piece for _, piece in apart.reasoning] == ["Think. "]
    assert apart.text == "Yes"
    assert (inline.reasoning, inline.text) == ([], "Think. Yes")
