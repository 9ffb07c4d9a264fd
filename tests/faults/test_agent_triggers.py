"""Faults placed inside agent streams: `cut`, `handoff`, `client_vanish` and `inband_error`
after N tool-call argument fragments (inside the call's arguments) or N reasoning tokens
(inside the reasoning phase), on a virtual clock with exact times.

The stream is vLLM 0.32's tool-call shape (tool-call-named-stream.txt): the role chunk,
the call's id/type/name, then one chunk per argument fragment, the finish chunk, [DONE]."""

from __future__ import annotations

import itertools
import json
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from faults._lib.triggers import AgentEventCounter
from faults.client_vanish import ClientVanish
from faults.cut import Cut
from faults.handoff import Handoff
from faults.inband_error import InbandError
from faults.testing import replay
from middlebox.core.dialects import TokenKind, read
from middlebox.core.http1 import LAST_CHUNK_BYTES, encode_chunk
from middlebox.core.sse import SseEvent, SseFramer
from middlebox.core.stream import DOWN, UP, Chunk, Eof, Reset
from tests.faults.httpstreams import DONE, ROLE, SSE_HEAD, down_bytes, ends, timeline


def data(delta: dict[str, Any], finish: str | None = None) -> bytes:
    choice = {"index": 0, "delta": delta, "finish_reason": finish}
    return b"data: " + json.dumps({"choices": [choice]}, separators=(",", ":")).encode() + b"\n\n"


NAME = data(
    {
        "content": None,
        "tool_calls": [
            {"id": "chatcmpl-tool-1", "type": "function", "index": 0, "function": {"name": "f"}}
        ],
    }
)
FRAGMENTS = ['{"to": "', "ops@", 'example.com"', "}"]


def fragment(text: str) -> bytes:
    return data({"content": None, "tool_calls": [{"index": 0, "function": {"arguments": text}}]})


def thought(text: str) -> bytes:
    return data({"reasoning": text})


FINISH = data({}, "tool_calls")
TOOL_EVENTS = [ROLE, NAME, *(fragment(f) for f in FRAGMENTS), FINISH, DONE]
TOOL_WRITES = [SSE_HEAD, *(encode_chunk(e) for e in TOOL_EVENTS), LAST_CHUNK_BYTES]
REASONING_EVENTS = [ROLE, thought("Let me"), thought(" think"), data({"content": "Hi"}), DONE]
REASONING_WRITES = [SSE_HEAD, *(encode_chunk(e) for e in REASONING_EVENTS), LAST_CHUNK_BYTES]


def tool_fragments(event: SseEvent) -> int:
    return read(event).tool_fragments


def carries_reasoning(event: SseEvent) -> bool:
    return read(event).token is TokenKind.REASONING


def sse(raw: bytes) -> SseEvent:
    (event,) = [p.event for p in SseFramer().feed(raw) if p.event is not None]
    return event


def test_only_argument_fragments_count_as_tool_fragments_and_only_reasoning_as_reasoning() -> None:
    assert [tool_fragments(sse(e)) for e in TOOL_EVENTS[:-1]] == [0, 0, 1, 1, 1, 1, 0]
    assert [carries_reasoning(sse(e)) for e in REASONING_EVENTS[:-1]] == [
        False,
        True,
        True,
        False,
    ]
    assert tool_fragments(sse(DONE)) == 0
    assert tool_fragments(sse(b"data: {not json\n\n")) == 0


def test_a_counter_on_its_own_counts_fragments_and_reasoning_across_split_writes() -> None:
    counter = AgentEventCounter()
    wire = b"".join(TOOL_WRITES)
    for start in range(0, len(wire), 7):
        counter.feed(wire[start : start + 7])
    assert (counter.events, counter.tool_fragments, counter.reasoning_tokens) == (8, 4, 0)


def test_a_cut_after_two_fragments_resets_both_sides_inside_the_arguments() -> None:
    fault = Cut(after="tool_fragments", count=2)
    out = replay(fault, timeline(TOOL_WRITES))
    # head 1 s, role 2 s, name 3 s, fragments at 4 s and 5 s: cut right after the second
    assert ends(out) == [(5.0, Reset(DOWN)), (5.0, Reset(UP))]
    sent = down_bytes(out)
    assert sent.endswith(encode_chunk(fragment("ops@")))
    assert b"example.com" not in sent
    assert fault.reports[0].details["event"] == 4


def test_a_cut_inside_the_next_fragments_data_line_leaves_half_a_json_string() -> None:
    fault = Cut(after="tool_fragments", count=2, at="inside_data_line", end="fin")
    out = replay(fault, timeline(TOOL_WRITES))
    body = down_bytes(out)
    assert ends(out)[0][1] == Eof(DOWN)
    assert b"ops@" in body and b'example.com"}' not in body
    assert body.endswith(LAST_CHUNK_BYTES)  # `fin` re-frames the cut chunk: HTTP stays valid


def test_a_cut_after_one_reasoning_token_lands_before_the_answer_starts() -> None:
    fault = Cut(after="reasoning_tokens", count=1, end="fin")
    out = replay(fault, timeline(REASONING_WRITES))
    body = down_bytes(out)
    assert b"Let me" in body and b" think" not in body and b'"Hi"' not in body
    assert ends(out) == [(3.0, Eof(DOWN)), (3.0, Eof(UP))]


def test_a_text_stream_has_no_fragments_so_a_tool_cut_never_fires() -> None:
    fault = Cut(after="tool_fragments", count=1)
    out = replay(fault, timeline(REASONING_WRITES))
    assert down_bytes(out) == b"".join(REASONING_WRITES)
    assert fault.reports == []


def test_a_handoff_after_three_fragments_goes_dark_after_the_write_with_the_third() -> None:
    fault = Handoff(after_tool_fragments=3, outage=2.0, outcome="reset")
    out = replay(fault, timeline(TOOL_WRITES))
    assert [t for t, item in out if isinstance(item, Chunk)][-1] == 6.0
    assert ends(out) == [(8.0, Reset(UP)), (8.0, Reset(DOWN))]
    sent = down_bytes(out)
    assert sent.endswith(encode_chunk(fragment('example.com"')))
    assert fragment("}") not in sent


def test_the_client_vanishes_inside_the_reasoning_phase() -> None:
    fault = ClientVanish(after_reasoning_tokens=2)
    out = replay(fault, timeline(REASONING_WRITES))
    assert ends(out) == [(4.0, Eof(UP))]
    assert b'"Hi"' not in down_bytes(out)
    assert fault.reports[0].details["event"] == 3


@pytest.mark.parametrize(
    ("config", "message"),
    [
        ({"after_tool_fragments": 0, "outage": 1.0}, "after_tool_fragments must be at least 1"),
        ({"after_reasoning_tokens": 0, "outage": 1.0}, "after_reasoning_tokens must be"),
        ({"outage": 1.0}, "after_tool_fragments"),
    ],
)
def test_agent_triggers_refuse_a_count_below_one(config: dict[str, Any], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        Handoff(**config)


def test_an_agent_trigger_makes_the_fault_read_sse() -> None:
    assert Handoff(after_tool_fragments=1, outage=1.0).reads_sse()
    assert not Handoff(at=1.0, outage=1.0).reads_sse()


def test_an_inband_error_in_the_middle_of_a_tool_call_follows_the_second_fragment() -> None:
    fault = InbandError(after_tool_fragments=2)
    out = replay(fault, timeline(TOOL_WRITES))
    body = down_bytes(out)
    error_at = body.index(b'{"error"')
    assert body.index(b"ops@") < error_at and b"example.com" not in body
    assert body.endswith(encode_chunk(DONE) + LAST_CHUNK_BYTES) or DONE in body[error_at:]
    (report,) = fault.reports
    assert (report.details["event"], report.details["tool_fragments"]) == (4, 2)


def test_inband_error_refuses_a_fragment_count_below_one() -> None:
    with pytest.raises(ValueError, match="after_tool_fragments must be at least 1"):
        InbandError(after_tool_fragments=0)


@settings(max_examples=40, deadline=None)
@given(st.integers(1, 4), st.lists(st.integers(1, 60), max_size=5))
def test_a_tool_cut_gives_the_client_a_prefix_of_the_stream_however_tcp_splits_it(
    count: int, splits: list[int]
) -> None:
    wire = b"".join(TOOL_WRITES)
    bounds = sorted({0, len(wire), *(s * 5 % len(wire) for s in splits)})
    writes = [wire[a:b] for a, b in itertools.pairwise(bounds) if b > a]
    out = replay(Cut(after="tool_fragments", count=count), timeline(writes))
    sent = down_bytes(out)
    assert wire.startswith(sent)
    assert sent.count(b'"arguments"') >= count  # never before the count-th fragment
    assert ends(out)[0][1] == Reset(DOWN)


def test_a_cut_after_the_finish_chunk_leaves_the_call_complete_and_drops_only_done() -> None:
    fault = Cut(after="finish", count=1)
    out = replay(fault, timeline(TOOL_WRITES))
    sent = down_bytes(out)
    assert sent.endswith(encode_chunk(FINISH))
    assert DONE not in sent
    # head 1 s, role, name, four fragments, the finish chunk at 8 s
    assert ends(out) == [(8.0, Reset(DOWN)), (8.0, Reset(UP))]


def test_a_stream_without_a_finish_reason_is_never_cut_after_its_finish() -> None:
    writes = [SSE_HEAD, *(encode_chunk(e) for e in TOOL_EVENTS[:-2]), LAST_CHUNK_BYTES]
    fault = Cut(after="finish", count=1)
    assert down_bytes(replay(fault, timeline(writes))) == b"".join(writes)
    assert fault.reports == []
