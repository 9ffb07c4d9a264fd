"""What a streamed event means, per dialect (middlebox/core/dialects.py): token kinds, the
text added, how an answer ends, the stream's last event and the resume position, on
streams recorded from vLLM 0.32 (tests/core/streams/) and on constructed events for what
the tiny test model cannot produce (reasoning, tool calls, errors, cancels)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from middlebox.core.dialects import (
    Dialect,
    EndKind,
    Meaning,
    TokenKind,
    detect,
    dialect_for,
    end_of_reason,
    read,
    starting_after,
)
from middlebox.core.sse import SseEvent, SseFramer
from tests.core.answers import data_event

STREAMS = Path(__file__).parent / "streams"

CHAT, COMPLETIONS, RESPONSES, MESSAGES = (
    Dialect.CHAT,
    Dialect.COMPLETIONS,
    Dialect.RESPONSES,
    Dialect.MESSAGES,
)


def events(raw: bytes) -> list[SseEvent]:
    return [p.event for p in SseFramer().feed(raw) if p.event is not None]


def one(raw: bytes) -> SseEvent:
    (event,) = events(raw)
    return event


def recorded(name: str) -> list[Meaning]:
    return [read(e) for e in events((STREAMS / f"vllm-0.32-{name}.sse").read_bytes())]


def chunk(**choice: Any) -> bytes:
    return data_event({"object": "chat.completion.chunk", "choices": [{"index": 0, **choice}]})


def resp(kind: str, **fields: Any) -> bytes:
    return data_event({**fields, "sequence_number": 7, "type": kind}, kind)


def msg(kind: str, **fields: Any) -> bytes:
    return data_event({"type": kind, **fields}, kind)


# -- which dialect --------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("method", "target", "dialect"),
    [
        ("POST", "/v1/chat/completions", CHAT),
        ("POST", "/v1/completions", COMPLETIONS),
        ("POST", "/v1/responses", RESPONSES),
        ("GET", "/v1/responses/resp_8cb6?stream=true&starting_after=4", RESPONSES),
        ("POST", "/v1/messages", MESSAGES),
        ("post", "/gateway/v1/messages?beta=true", MESSAGES),  # a gateway's prefix
    ],
)
def test_the_request_names_the_dialect_of_its_stream(
    method: str, target: str, dialect: Dialect
) -> None:
    assert dialect_for(method, target) is dialect


@pytest.mark.parametrize(
    ("method", "target"),
    [
        ("GET", "/v1/models"),
        ("GET", "/v1/chat/completions"),
        ("POST", "/v1/responses/resp_1/cancel"),
        ("GET", "/v1/responses"),
        ("POST", "/metrics"),
    ],
)
def test_a_request_to_no_streaming_api_names_no_dialect(method: str, target: str) -> None:
    assert dialect_for(method, target) is None


@pytest.mark.parametrize(
    ("method", "target", "after"),
    [
        ("GET", "/v1/responses/resp_8cb6?stream=true&starting_after=4", 4),
        ("get", "/gw/v1/responses/resp_8cb6?starting_after=291&stream=true", 291),
        ("GET", "/v1/responses/resp_8cb6?stream=true", None),  # a replay from the start
        ("GET", "/v1/responses/resp_8cb6?stream=true&starting_after=x", None),
        ("POST", "/v1/responses?starting_after=4", None),  # only a replay resumes
        ("GET", "/v1/chat/completions?starting_after=4", None),
    ],
)
def test_a_responses_replay_says_after_which_event_it_starts(
    method: str, target: str, after: int | None
) -> None:
    assert starting_after(method, target) == after


@pytest.mark.parametrize(
    ("name", "dialect"),
    [
        ("chat-stop", CHAT),
        ("completions-length", COMPLETIONS),
        ("responses-completed", RESPONSES),
        ("responses-resume-after-4", RESPONSES),
        ("messages-end-turn", MESSAGES),
    ],
)
def test_every_event_of_a_recorded_stream_shows_its_dialect(name: str, dialect: Dialect) -> None:
    # `[DONE]` ends chat and completions alike: it reads as chat, and means the same in both
    raw = (STREAMS / f"vllm-0.32-{name}.sse").read_bytes()
    assert {detect(e) for e in events(raw) if not e.is_done} == {dialect}


def test_error_events_show_their_dialect_by_their_fields() -> None:
    assert detect(one(resp("error", code="server_error", message="x"))) is RESPONSES
    assert detect(one(msg("error", error={"type": "overloaded_error"}))) is MESSAGES
    assert detect(one(data_event({"error": {"message": "x"}}))) is CHAT


# -- the recorded streams ---------------------------------------------------------------------


@pytest.mark.parametrize(
    ("name", "text", "end", "reason"),
    [
        ("chat-stop", "Cliju", EndKind.COMPLETE, "stop"),
        ("chat-length3", "Cliju", EndKind.LENGTH, "length"),
        ("responses-completed", "Cliju", EndKind.COMPLETE, "completed"),
        ("responses-max-output-tokens", "Cliju", EndKind.LENGTH, "max_output_tokens"),
        ("messages-end-turn", "Cliju", EndKind.COMPLETE, "end_turn"),
        ("messages-max-tokens", "Cliju", EndKind.LENGTH, "max_tokens"),
    ],
)
def test_a_recorded_answer_reads_the_same_text_and_end_in_its_dialect(
    name: str, text: str, end: EndKind, reason: str
) -> None:
    meanings = recorded(name)
    assert "".join(m.text for m in meanings if m.token is TokenKind.ANSWER) == text
    assert [(m.end, m.reason) for m in meanings if m.end is not None] == [(end, reason)]
    assert [m.last for m in meanings].count(True) == 1
    assert meanings[-1].last  # [DONE], message_stop, response.completed


def test_vllm_sends_a_held_back_step_on_chat_but_not_on_responses_or_messages() -> None:
    # The same 4-token answer ("Cli", "ju", then two steps that add no text): 5 content
    # chunks after the role chunk on chat, 2 deltas on Responses and Messages. Only the two
    # that add text are tokens in every dialect.
    chat = recorded("chat-stop")
    assert sum(m.dialect is CHAT and m.token is None and not m.last for m in chat) == 3
    for name in ("chat-stop", "responses-completed", "messages-end-turn"):
        assert [m.text for m in recorded(name) if m.token is not None] == ["Cli", "ju"]


def test_a_completions_stream_counts_each_text_chunk_and_not_the_empty_ones() -> None:
    meanings = recorded("completions-length")
    assert len(meanings) == 17  # 16 steps and [DONE]
    assert sum(m.token is TokenKind.ANSWER for m in meanings) == 12  # 4 steps held bytes back
    assert meanings[-2].end is EndKind.LENGTH and meanings[-2].token is TokenKind.ANSWER


def test_a_responses_stream_carries_its_sequence_numbers_as_resume_positions() -> None:
    meanings = recorded("responses-completed")
    assert [m.sequence for m in meanings] == list(range(10))
    assert [m.position for m in meanings] == [str(n) for n in range(10)]


def test_a_resumed_responses_stream_starts_after_the_position_it_asked_for() -> None:
    # GET /v1/responses/{id}?stream=true&starting_after=4 on a background response
    meanings = recorded("responses-resume-after-4")
    assert [m.sequence for m in meanings] == [5, 6, 7, 8, 9]
    assert [m.text for m in meanings if m.token] == ["ju"]
    assert meanings[-1].end is EndKind.COMPLETE and meanings[-1].last


def test_chat_and_messages_streams_have_no_resume_position_unless_an_id_is_set() -> None:
    assert {m.position for m in recorded("chat-stop") + recorded("messages-end-turn")} == {None}
    with_id = read(one(b"id: 41\n" + chunk(delta={"content": "a"})))
    assert (with_id.position, with_id.event_id, with_id.sequence) == ("41", "41", None)


def test_the_whole_text_of_a_done_event_is_not_a_token() -> None:
    # response.output_text.done repeats the whole answer; it adds nothing.
    done = [m for m in recorded("responses-completed") if m.sequence in (6, 7, 8)]
    assert [m.token for m in done] == [None, None, None]


# -- token kinds: one must-appear and one must-not-appear per dialect ----------------------------


@pytest.mark.parametrize(
    ("raw", "kind", "text"),
    [
        (chunk(delta={"content": "Hi"}), TokenKind.ANSWER, "Hi"),
        (chunk(delta={"reasoning": "hm"}), TokenKind.REASONING, "hm"),
        (chunk(delta={"reasoning_content": "hm"}), TokenKind.REASONING, "hm"),
        (
            chunk(delta={"tool_calls": [{"index": 0, "function": {"arguments": '{"a'}}]}),
            TokenKind.TOOL_ARGUMENTS,
            '{"a',
        ),
        (chunk(delta={"content": "A", "reasoning": "r"}), TokenKind.ANSWER, "A"),
        (data_event({"choices": [{"index": 0, "text": "x"}]}), TokenKind.ANSWER, "x"),
        (resp("response.output_text.delta", delta="Hi"), TokenKind.ANSWER, "Hi"),
        (resp("response.reasoning_text.delta", delta="hm"), TokenKind.REASONING, "hm"),
        (
            resp("response.function_call_arguments.delta", delta='{"a'),
            TokenKind.TOOL_ARGUMENTS,
            '{"a',
        ),
        (
            msg("content_block_delta", index=0, delta={"type": "text_delta", "text": "Hi"}),
            TokenKind.ANSWER,
            "Hi",
        ),
        (
            msg("content_block_delta", index=0, delta={"type": "thinking_delta", "thinking": "hm"}),
            TokenKind.REASONING,
            "hm",
        ),
        (
            msg(
                "content_block_delta",
                index=1,
                delta={"type": "input_json_delta", "partial_json": '{"a'},
            ),
            TokenKind.TOOL_ARGUMENTS,
            '{"a',
        ),
    ],
)
def test_an_event_that_adds_text_carries_a_token_of_its_kind(
    raw: bytes, kind: TokenKind, text: str
) -> None:
    meaning = read(one(raw))
    assert (meaning.token, meaning.text) == (kind, text)
    assert meaning.tool_fragments == (kind is TokenKind.TOOL_ARGUMENTS)


@pytest.mark.parametrize(
    "raw",
    [
        chunk(delta={"role": "assistant", "content": ""}),  # vLLM's role chunk
        chunk(delta={"content": ""}),  # a step whose bytes the detokenizer held back
        chunk(delta={"content": None, "tool_calls": [{"index": 0, "function": {"name": "f"}}]}),
        chunk(delta={}, finish_reason="stop"),
        chunk(delta={"content": 7}),
        data_event({"object": "chat.completion.chunk", "choices": [], "usage": {}}),
        data_event("[DONE]"),
        data_event({"choices": [{"index": 0, "text": ""}]}),
        resp("response.output_text.delta", delta=""),
        resp("response.output_text.done", text="Hi"),
        resp("response.content_part.added", part={"type": "output_text", "text": ""}),
        resp("response.function_call_arguments.done", arguments="{}"),
        msg("content_block_start", index=0, content_block={"type": "text", "text": ""}),
        msg("content_block_delta", index=0, delta={"type": "signature_delta", "signature": "s"}),
        msg("content_block_delta", index=0, delta={"type": "text_delta", "text": ""}),
        msg("ping"),
        b"event: content_block_delta\ndata: {not json\n\n",
    ],
)
def test_an_event_that_adds_no_text_carries_no_token(raw: bytes) -> None:
    meaning = read(one(raw))
    assert (meaning.token, meaning.text, meaning.tool_fragments) == (None, "", 0)


def test_a_chunk_with_several_choices_reads_as_the_one_that_carries_a_token() -> None:
    choices = ["junk", {"index": 0, "delta": {}}, {"index": 1, "delta": {"content": "x"}}]
    raw = data_event({"choices": choices})
    meaning = read(one(raw))
    assert (meaning.token, meaning.text, meaning.choice) == (TokenKind.ANSWER, "x", 1)


def test_a_chat_chunk_counts_each_call_with_argument_text_as_a_fragment() -> None:
    calls = [
        {"index": 0, "function": {"arguments": "{"}},
        {"index": 1, "function": {"arguments": ""}},
        {"index": 2, "function": {"arguments": "}"}},
    ]
    meaning = read(one(chunk(delta={"tool_calls": calls})))
    assert (meaning.token, meaning.text, meaning.tool_fragments) == (
        TokenKind.TOOL_ARGUMENTS,
        "{}",
        2,
    )


# -- ends: each kind where it must appear, and events that end nothing ----------------------------


@pytest.mark.parametrize(
    ("raw", "end", "reason", "last"),
    [
        (chunk(delta={"content": ""}, finish_reason="stop"), EndKind.COMPLETE, "stop", False),
        (chunk(delta={}, finish_reason="tool_calls"), EndKind.COMPLETE, "tool_calls", False),
        (chunk(delta={}, finish_reason="length"), EndKind.LENGTH, "length", False),
        (chunk(delta={}, finish_reason="abort"), EndKind.CANCELLED, "abort", False),
        (data_event({"error": {"message": "boom"}}), EndKind.ERROR, "error", False),
        (
            resp("response.completed", response={"status": "completed"}),
            EndKind.COMPLETE,
            "completed",
            True,
        ),
        (
            resp(
                "response.completed",
                response={"status": "incomplete", "incomplete_details": {"reason": "max_tokens"}},
            ),
            EndKind.LENGTH,
            "max_tokens",
            True,
        ),
        (
            resp(
                "response.incomplete",
                response={
                    "status": "incomplete",
                    "incomplete_details": {"reason": "content_filter"},
                },
            ),
            EndKind.ERROR,
            "content_filter",
            True,
        ),
        (
            resp("response.completed", response={"status": "cancelled"}),
            EndKind.CANCELLED,
            "cancelled",
            True,
        ),
        (resp("response.failed", response={"status": "failed"}), EndKind.ERROR, "failed", True),
        (resp("error", code="server_error", message="boom"), EndKind.ERROR, "error", True),
        (
            msg("message_delta", delta={"stop_reason": "end_turn"}),
            EndKind.COMPLETE,
            "end_turn",
            False,
        ),
        (
            msg("message_delta", delta={"stop_reason": "tool_use"}),
            EndKind.COMPLETE,
            "tool_use",
            False,
        ),
        (
            msg("message_delta", delta={"stop_reason": "stop_sequence"}),
            EndKind.COMPLETE,
            "stop_sequence",
            False,
        ),
        (
            msg("message_delta", delta={"stop_reason": "max_tokens"}),
            EndKind.LENGTH,
            "max_tokens",
            False,
        ),
        (
            msg("error", error={"type": "internal_error", "message": "x"}),
            EndKind.ERROR,
            "error",
            True,
        ),
    ],
)
def test_an_event_that_ends_the_answer_says_how(
    raw: bytes, end: EndKind, reason: str, last: bool
) -> None:
    meaning = read(one(raw))
    assert (meaning.end, meaning.reason, meaning.last) == (end, reason, last)


@pytest.mark.parametrize(
    "raw",
    [
        chunk(delta={"content": "a"}, finish_reason=None),
        data_event({"object": "chat.completion.chunk", "choices": [], "usage": {}}),
        resp("response.in_progress", response={"status": "in_progress"}),
        resp("response.output_item.done", item={"status": "completed"}),
        msg("message_start", message={"stop_reason": None}),
        msg("message_delta", delta={"stop_reason": None}),
        msg("content_block_stop", index=0),
    ],
)
def test_an_event_that_does_not_end_the_answer_says_nothing_of_an_end(raw: bytes) -> None:
    meaning = read(one(raw))
    assert (meaning.end, meaning.reason, meaning.last) == (None, None, False)


@pytest.mark.parametrize(
    ("raw", "dialect"),
    [
        (data_event("[DONE]"), CHAT),
        (msg("message_stop"), MESSAGES),
    ],
)
def test_the_closing_event_is_last_and_ends_no_answer_itself(raw: bytes, dialect: Dialect) -> None:
    meaning = read(one(raw), dialect)
    assert (meaning.last, meaning.end, meaning.token) == (True, None, None)


def test_a_known_dialect_reads_an_event_even_where_its_shape_says_little() -> None:
    # data-only junk inside a Messages stream is no chat chunk
    assert read(one(b"data: {}\n\n"), MESSAGES).dialect is MESSAGES
    assert read(one(b"data: {}\n\n")).dialect is CHAT


@pytest.mark.parametrize(
    ("reason", "end"),
    [
        ("stop", EndKind.COMPLETE),
        ("end_turn", EndKind.COMPLETE),
        ("completed", EndKind.COMPLETE),
        ("tool_use", EndKind.COMPLETE),
        ("length", EndKind.LENGTH),
        ("max_tokens", EndKind.LENGTH),
        ("max_output_tokens", EndKind.LENGTH),
        ("abort", EndKind.CANCELLED),
        ("cancelled", EndKind.CANCELLED),
        ("error", EndKind.ERROR),
        ("failed", EndKind.ERROR),
        ("whatever", None),
        (None, None),
    ],
)
def test_a_reason_word_of_any_api_says_how_the_answer_ended(
    reason: str | None, end: EndKind | None
) -> None:
    assert end_of_reason(reason) is end
