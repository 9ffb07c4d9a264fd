"""`cut`, `handoff` and `client_vanish` on every stream dialect vLLM serves: each trigger
(events, tokens, tool fragments, reasoning tokens, finish, bytes, time) lands after the
same event of an agent's turn written as chat, Responses and Messages stream it, on a
virtual clock with exact times; a count the stream never reaches never fires; and the
dialect comes from the request, as the scorer takes it.

The streams are `tests/core/answers.py`'s `agent_events`: three reasoning pieces, the answer
"Sure.", a function call whose arguments come in three fragments. Writes are a second apart:
the head at 1 s, event i (from 0) at 2 + i s.

    event  chat                 Responses                          Messages
    0      role chunk           response.created                   message_start
    1-3    reasoning (1-3)      in_progress, reasoning item added, content_block_start thinking,
                                reasoning_text.delta (3-5)         thinking_delta (2-4)
    ...    "Sure." (4)          output_text.delta (10)             text_delta (8)
           fragments (6-8)      function_call_arguments.delta      input_json_delta (11-13)
                                (15-17)
           finish chunk (9)     response.completed (20, the last)  message_delta (15)
           usage, [DONE] (10-11)                                   message_stop (16)
"""

from __future__ import annotations

import itertools
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from faults.client_vanish import ClientVanish
from faults.cut import Cut
from faults.handoff import Handoff
from faults.testing import TimedItem, replay
from middlebox.core.dialects import Dialect
from middlebox.core.fault import Pipeline
from middlebox.core.framed import LegRecord
from middlebox.core.http1 import LAST_CHUNK_BYTES, encode_chunk
from middlebox.core.stream import DOWN, UP, Eof, Reset
from middlebox.run.score import delivered_token_times
from tests.core.answers import agent_events, answer_events, request_bytes
from tests.faults.httpstreams import SSE_HEAD, down_bytes, ends, timeline

AGENTS = [Dialect.CHAT, Dialect.RESPONSES, Dialect.MESSAGES]
NAMED = [Dialect.RESPONSES, Dialect.MESSAGES]

# The index (from 0) of the event that reaches each trigger's count, per dialect.
REACHED: dict[tuple[str, int], dict[Dialect, int]] = {
    ("events", 5): {Dialect.CHAT: 4, Dialect.RESPONSES: 4, Dialect.MESSAGES: 4},
    ("tokens", 4): {Dialect.CHAT: 4, Dialect.RESPONSES: 10, Dialect.MESSAGES: 8},
    ("tool_fragments", 2): {Dialect.CHAT: 7, Dialect.RESPONSES: 16, Dialect.MESSAGES: 12},
    ("reasoning_tokens", 2): {Dialect.CHAT: 2, Dialect.RESPONSES: 4, Dialect.MESSAGES: 3},
    ("finish", 1): {Dialect.CHAT: 9, Dialect.RESPONSES: 20, Dialect.MESSAGES: 15},
}
TRIGGERS = [(after, count, d) for (after, count) in REACHED for d in AGENTS]


def writes_of(events: list[bytes]) -> list[bytes]:
    """The head, one HTTP chunk per event (one vLLM write per event), the last chunk."""
    return [SSE_HEAD, *(encode_chunk(e) for e in events), LAST_CHUNK_BYTES]


def agent_timeline(dialect: Dialect, asked: bytes | None = None) -> list[TimedItem]:
    asked = request_bytes(dialect) if asked is None else asked
    return timeline(writes_of(agent_events(dialect)), request_bytes=asked)


def through(index: int, dialect: Dialect) -> bytes:
    """The response bytes up to and including event `index`'s chunk."""
    return b"".join(writes_of(agent_events(dialect))[: index + 2])


@pytest.mark.parametrize(("after", "count", "dialect"), TRIGGERS)
def test_a_cut_lands_after_the_event_that_reaches_its_count_in_every_dialect(
    after: Any, count: int, dialect: Dialect
) -> None:
    index = REACHED[after, count][dialect]
    fault = Cut(after=after, count=count)
    out = replay(fault, agent_timeline(dialect))
    assert down_bytes(out) == through(index, dialect)
    assert ends(out) == [(2.0 + index, Reset(DOWN)), (2.0 + index, Reset(UP))]
    (report,) = fault.reports
    assert (report.action, report.details["event"]) == ("cut", index + 1)


@pytest.mark.parametrize(
    ("after", "count"),
    [("tool_fragments", 4), ("reasoning_tokens", 4), ("finish", 2), ("tokens", 8)],
)
@pytest.mark.parametrize("dialect", AGENTS)
def test_a_count_the_turn_never_reaches_leaves_it_whole_in_every_dialect(
    after: Any, count: int, dialect: Dialect
) -> None:
    fault = Cut(after=after, count=count)
    out = replay(fault, agent_timeline(dialect))
    assert down_bytes(out) == b"".join(writes_of(agent_events(dialect)))
    assert ends(out) == [] and fault.reports == []


@pytest.mark.parametrize("dialect", NAMED)
def test_a_plain_answer_has_no_reasoning_or_fragments_to_cut_in(dialect: Dialect) -> None:
    writes = writes_of(answer_events(dialect, ["Un", "e", " ré", "ponse"]))
    for after in ("tool_fragments", "reasoning_tokens"):
        fault = Cut(after=after, count=1)  # type: ignore[arg-type]
        out = replay(fault, timeline(writes, request_bytes=request_bytes(dialect)))
        assert down_bytes(out) == b"".join(writes) and fault.reports == []


def test_after_its_finish_a_responses_stream_has_every_event_and_only_the_http_end_missing() -> (
    None
):
    # response.completed is both the answer's end and the stream's last event: the client
    # holds the whole stream; with `fin` the cut only adds the terminal chunk it withheld.
    fault = Cut(after="finish", count=1, end="fin")
    out = replay(fault, agent_timeline(Dialect.RESPONSES))
    assert down_bytes(out) == b"".join(writes_of(agent_events(Dialect.RESPONSES)))
    assert ends(out) == [(22.0, Eof(DOWN)), (22.0, Eof(UP))]


def test_after_its_finish_a_messages_stream_loses_only_message_stop() -> None:
    fault = Cut(after="finish", count=1, end="fin")
    out = replay(fault, agent_timeline(Dialect.MESSAGES))
    sent = down_bytes(out)
    assert b'"stop_reason":"tool_use"' in sent and b"message_stop" not in sent
    assert sent.endswith(LAST_CHUNK_BYTES)  # `fin` completes the HTTP message


@pytest.mark.parametrize("dialect", NAMED)
def test_bytes_and_time_cut_the_same_way_on_named_events(dialect: Dialect) -> None:
    events = agent_events(dialect)
    body = sum(len(e) for e in events[:3])  # the first three events' body bytes
    out = replay(Cut(after="bytes", count=body), agent_timeline(dialect))
    assert down_bytes(out) == through(2, dialect)
    assert ends(out)[0] == (4.0, Reset(DOWN))
    # time is counted from the request's head (0 s): 6.5 s falls after event 4 (6 s)
    out = replay(Cut(after="time", time=6.5), agent_timeline(dialect))
    assert down_bytes(out) == through(4, dialect)
    assert ends(out)[0] == (6.5, Reset(DOWN))


@pytest.mark.parametrize("dialect", NAMED)
def test_a_cut_inside_a_tool_fragments_data_line_leaves_the_arguments_open(
    dialect: Dialect,
) -> None:
    fault = Cut(after="tool_fragments", count=1, at="inside_data_line", end="fin")
    out = replay(fault, agent_timeline(dialect))
    sent = down_bytes(out)
    assert b'{\\"city\\"' in sent and b"Par" not in sent.split(b'{\\"city\\"')[-1][:4]
    assert b'is\\"}' not in sent
    assert sent.endswith(LAST_CHUNK_BYTES)  # the cut chunk re-framed: HTTP stays valid
    assert ends(out)[0][1] == Eof(DOWN)


def test_a_resumed_responses_replay_counts_its_own_tokens() -> None:
    # GET /v1/responses/{id}?stream=true&starting_after=9 replays from sequence 10: its
    # first token event is the answer's "Sure.", then the three fragments.
    events = agent_events(Dialect.RESPONSES)[10:]
    asked = b"GET /v1/responses/resp_1?stream=true&starting_after=9 HTTP/1.1\r\nHost: up\r\n\r\n"
    fault = Cut(after="tokens", count=2)
    out = replay(fault, timeline(writes_of(events), request_bytes=asked))
    assert down_bytes(out) == b"".join(writes_of(events)[:7])  # head, 10..15
    assert b'"sequence_number":15' in down_bytes(out)
    assert fault.reports[0].details["tokens"] == 2


# -- the dialect comes from the request ----------------------------------------------------

OTHER_PATH = b"POST /generate HTTP/1.1\r\nHost: up\r\nContent-Length: 2\r\n\r\n{}"


def scorer_tokens(asked: bytes, events: list[bytes]) -> int:
    record = LegRecord.from_bytes(asked, b"".join(writes_of(events)))
    return len(delivered_token_times(record, lambda _, offset: float(offset)))


def test_responses_events_answering_a_chat_request_hold_no_chat_token_for_cut_or_scorer() -> None:
    # The request said chat completions: its events are read by the chat rule, which finds
    # no `choices` in Responses events, as the scorer reads them; neither counts a token.
    asked = request_bytes(Dialect.CHAT)
    events = agent_events(Dialect.RESPONSES)
    fault = Cut(after="tokens", count=1)
    out = replay(fault, timeline(writes_of(events), request_bytes=asked))
    assert fault.reports == [] and down_bytes(out) == b"".join(writes_of(events))
    assert scorer_tokens(asked, events) == 0


@pytest.mark.parametrize("asked", [request_bytes(Dialect.RESPONSES), OTHER_PATH])
def test_the_same_events_are_cut_at_their_first_token_when_the_path_says_responses_or_nothing(
    asked: bytes,
) -> None:
    # `/v1/responses` names the dialect; `/generate` names none, so the events' own shape
    # does: both read the first reasoning delta (event 3) as the first token.
    events = agent_events(Dialect.RESPONSES)
    fault = Cut(after="tokens", count=1)
    out = replay(fault, timeline(writes_of(events), request_bytes=asked))
    assert down_bytes(out) == through(3, Dialect.RESPONSES)
    assert scorer_tokens(asked, events) == 7


# -- handoff and client_vanish -------------------------------------------------------------


@pytest.mark.parametrize("dialect", AGENTS)
def test_a_handoff_inside_the_tool_arguments_goes_dark_after_the_second_fragment(
    dialect: Dialect,
) -> None:
    index = REACHED["tool_fragments", 2][dialect]
    fault = Handoff(after_tool_fragments=2, outage=2.0, outcome="reset")
    out = replay(fault, agent_timeline(dialect))
    assert down_bytes(out) == through(index, dialect)
    assert ends(out) == [(4.0 + index, Reset(UP)), (4.0 + index, Reset(DOWN))]
    assert fault.reports[0].details["event"] == index + 1


@pytest.mark.parametrize("dialect", AGENTS)
def test_the_client_vanishes_inside_the_reasoning_before_the_answer(dialect: Dialect) -> None:
    index = REACHED["reasoning_tokens", 2][dialect]
    fault = ClientVanish(after_reasoning_tokens=2)
    out = replay(fault, agent_timeline(dialect))
    assert down_bytes(out) == through(index, dialect)
    assert ends(out) == [(2.0 + index, Eof(UP))]
    assert b"Sure." not in down_bytes(out)
    assert fault.reports[0].details["event"] == index + 1


@pytest.mark.parametrize("dialect", NAMED)
def test_after_events_counts_every_named_event(dialect: Dialect) -> None:
    fault = ClientVanish(after_events=2, how="rst", client="reset")
    out = replay(fault, agent_timeline(dialect))
    assert down_bytes(out) == through(1, dialect)
    assert ends(out) == [(3.0, Reset(UP)), (3.0, Reset(DOWN))]


@pytest.mark.parametrize("dialect", NAMED)
def test_agent_triggers_never_fire_on_a_plain_answer(dialect: Dialect) -> None:
    writes = writes_of(answer_events(dialect, ["Un", "e", " ré", "ponse"]))
    for fault in (
        Handoff(after_tool_fragments=1, outage=1.0),
        ClientVanish(after_reasoning_tokens=1),
    ):
        out = replay(fault, timeline(writes, request_bytes=request_bytes(dialect)))
        assert down_bytes(out) == b"".join(writes) and fault.reports == []


def test_a_trigger_reads_events_in_the_dialect_its_request_named() -> None:
    # Responses-shaped fragments answering a chat request carry no chat tool call: the
    # vanish after the first fragment never comes; to /v1/responses it comes at event 15.
    events = agent_events(Dialect.RESPONSES)
    for asked, fired in ((request_bytes(Dialect.CHAT), False), (OTHER_PATH, True)):
        fault = ClientVanish(after_tool_fragments=1)
        out = replay(fault, timeline(writes_of(events), request_bytes=asked))
        assert bool(fault.reports) is fired
    fault = ClientVanish(after_tool_fragments=1)
    out = replay(fault, agent_timeline(Dialect.RESPONSES))
    assert ends(out) == [(17.0, Eof(UP))]


@pytest.mark.parametrize(("dialect", "fired"), [(Dialect.CHAT, False), (Dialect.RESPONSES, True)])
def test_in_a_pipeline_the_shared_framing_names_the_dialect_too(
    dialect: Dialect, fired: bool
) -> None:
    # Inside a pipeline the faults read the path's one framing of the request (no framer
    # of their own): the same Responses events, asked as chat or as Responses.
    events = agent_events(Dialect.RESPONSES)
    asked = request_bytes(dialect)
    vanish = ClientVanish(after_reasoning_tokens=1)
    cut = Cut(after="tool_fragments", count=1)
    out = replay(Pipeline([vanish, cut]), timeline(writes_of(events), request_bytes=asked))
    assert bool(vanish.reports) is fired and bool(cut.reports) is fired
    if fired:  # the client heard up to the first reasoning delta; the cut came at event 15
        assert down_bytes(out) == through(3, Dialect.RESPONSES)
        assert cut.reports[0].details["event"] == 16


@settings(max_examples=30, deadline=None)
@given(
    st.sampled_from(NAMED),
    st.sampled_from(["tokens", "tool_fragments", "reasoning_tokens"]),
    st.integers(1, 3),
    st.lists(st.integers(1, 10_000), max_size=6),
)
def test_however_tcp_splits_a_named_stream_the_cut_lands_after_the_same_event(
    dialect: Dialect, after: Any, count: int, splits: list[int]
) -> None:
    wire = b"".join(writes_of(agent_events(dialect)))
    bounds = sorted({0, len(wire), *(s % len(wire) for s in splits)})
    writes = [wire[a:b] for a, b in itertools.pairwise(bounds) if b > a]
    whole = replay(Cut(after=after, count=count), agent_timeline(dialect))
    fault = Cut(after=after, count=count)
    out = replay(fault, timeline(writes, request_bytes=request_bytes(dialect)))
    assert down_bytes(out) == down_bytes(whole)  # the same event boundary, any chunking
    assert fault.reports[0].details["event"] == whole_event(whole, dialect)


def whole_event(out: list[TimedItem], dialect: Dialect) -> int:
    """How many of the dialect's events `out` delivered whole."""
    sent = down_bytes(out)
    return sum(1 for i in range(len(agent_events(dialect))) if sent.startswith(through(i, dialect)))
