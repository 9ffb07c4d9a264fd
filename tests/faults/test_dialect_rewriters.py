"""`inband_error` and `sse_ids` on every stream dialect vLLM serves, on a virtual clock.

`inband_error` writes the error in the shape of the API the request asked: chat and
completions a `data: {"error": ...}` frame and `[DONE]` (as before, byte for byte);
Responses an `error` or `response.failed` event with the next `sequence_number`, which
openai-python's types accept; Messages `event: error` as vLLM's Anthropic converter or
Anthropic's API writes it; nothing follows the last two (no `[DONE]`). `sse_ids` edits only
SSE `id:` lines: on a Responses stream the `sequence_number` in the data (the position
`starting_after` resumes from) is never touched.

Writes are a second apart: the head at 1 s, event i (from 0) at 2 + i s.
"""

from __future__ import annotations

import itertools
import json
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from openai.types.responses import ResponseErrorEvent, ResponseFailedEvent

from faults.inband_error import DONE_FRAME, InbandError, dialect_error_frame, error_frame
from faults.sse_ids import SseIds
from faults.testing import replay
from middlebox.core.dialects import Dialect, EndKind, read
from middlebox.core.fault import Pipeline
from middlebox.core.http1 import LAST_CHUNK_BYTES, encode_chunk
from middlebox.core.sse import SseEvent, SseFramer
from middlebox.core.stream import DOWN, UP, Chunk, Eof
from middlebox.run.score import analyse_upstream, upstream_generations
from tests.core.answers import agent_events, answer_events, request_bytes
from tests.faults.httpprops import dechunked
from tests.faults.httpstreams import SSE_HEAD, down_bytes, ends, timeline

PIECES = ["Un", "e", " ré", "ponse"]
STREAMS = Path(__file__).parents[1] / "core" / "streams"

OPENAI_ERROR = (
    b'event: error\ndata: {"type":"error","code":"server_error","message":"The server had an '
    b'error while processing your request. Sorry about that!","param":null,'
    b'"sequence_number":6}\n\n'
)
VLLM_MESSAGES_ERROR = (
    b'event: error\ndata: {"type":"error","error":{"type":"internal_error",'
    b'"message":"Internal server error"}}\n\n'
)
ANTHROPIC_ERROR = (
    b'event: error\ndata: {"type": "error", "error": {"type": "overloaded_error", '
    b'"message": "Overloaded"}}\n\n'
)


def writes_of(events: list[bytes]) -> list[bytes]:
    return [SSE_HEAD, *(encode_chunk(e) for e in events), LAST_CHUNK_BYTES]


def sse(raw: bytes) -> SseEvent:
    (event,) = [p.event for p in SseFramer().feed(raw) if p.event is not None]
    return event


def recorded_events(path: Path) -> list[bytes]:
    """A recorded stream's events (the file is the de-chunked body), each as raw bytes."""
    return [p.event.raw for p in SseFramer().feed(path.read_bytes()) if p.event is not None]


def answer_timeline(dialect: Dialect) -> list[Any]:
    writes = writes_of(answer_events(dialect, PIECES))
    return timeline(writes, request_bytes=request_bytes(dialect))


# -- inband_error --------------------------------------------------------------------------


def test_a_responses_stream_gets_openais_error_event_numbered_next_and_nothing_after() -> None:
    events = answer_events(Dialect.RESPONSES, PIECES)
    fault = InbandError(events=6)  # created, in_progress, item, part, "Un", "e"
    out = replay(fault, answer_timeline(Dialect.RESPONSES))
    assert down_bytes(out) == (
        SSE_HEAD + b"".join(encode_chunk(e) for e in events[:6])
        + encode_chunk(OPENAI_ERROR) + LAST_CHUNK_BYTES
    )  # fmt: skip
    assert [t for t, item in out if isinstance(item, Chunk) and item.data.endswith(
        LAST_CHUNK_BYTES)] == [7.0]  # fmt: skip
    (report,) = fault.reports
    assert (report.details["dialect"], report.details["shape"]) == ("responses", "openai")
    event = sse(OPENAI_ERROR)
    ResponseErrorEvent.model_validate_json(event.data)  # the SDK's own type accepts it
    meaning = read(event, Dialect.RESPONSES)
    assert (meaning.end, meaning.last, meaning.sequence) == (EndKind.ERROR, True, 6)


def test_response_failed_carries_the_announced_response_failed_with_the_error() -> None:
    events = recorded_events(STREAMS / "vllm-0.32-responses-completed.sse")
    writes = writes_of(events)
    fault = InbandError(events=5, shape="openai-failed", message="engine died")
    out = replay(fault, timeline(writes, request_bytes=request_bytes(Dialect.RESPONSES)))
    body = down_bytes(out)
    assert body.startswith(b"".join(writes[:6]))
    assert body.endswith(LAST_CHUNK_BYTES) and b"response.completed" not in body
    failed = sse(body[len(b"".join(writes[:6])) :].split(b"\r\n", 1)[1].rsplit(b"\r\n0", 1)[0])
    assert failed.event == "response.failed"
    parsed = ResponseFailedEvent.model_validate_json(failed.data)
    created = json.loads(sse(events[0]).data)["response"]
    assert parsed.sequence_number == 5 and parsed.response.id == created["id"]
    assert parsed.response.status == "failed"
    assert parsed.response.error is not None
    assert (parsed.response.error.code, parsed.response.error.message) == (
        "server_error",
        "engine died",
    )
    assert read(failed, Dialect.RESPONSES).end is EndKind.ERROR


@pytest.mark.parametrize(
    ("shape", "frame"), [(None, VLLM_MESSAGES_ERROR), ("anthropic", ANTHROPIC_ERROR)]
)
def test_a_messages_stream_gets_event_error_as_vllm_or_anthropic_writes_it(
    shape: Any, frame: bytes
) -> None:
    events = answer_events(Dialect.MESSAGES, PIECES)
    fault = InbandError(events=4, shape=shape)  # message_start, block start, "Un", "e"
    out = replay(fault, answer_timeline(Dialect.MESSAGES))
    assert down_bytes(out) == (
        SSE_HEAD + b"".join(encode_chunk(e) for e in events[:4])
        + encode_chunk(frame) + LAST_CHUNK_BYTES
    )  # fmt: skip
    assert b"message_stop" not in down_bytes(out)
    meaning = read(sse(frame), Dialect.MESSAGES)
    assert (meaning.end, meaning.last) == (EndKind.ERROR, True)


@pytest.mark.parametrize("dialect", [Dialect.RESPONSES, Dialect.MESSAGES])
def test_named_event_streams_never_get_the_chat_frame_or_done(dialect: Dialect) -> None:
    for then in ("done", "close", "continue"):
        out = replay(InbandError(events=3, then=then), answer_timeline(dialect))  # type: ignore[arg-type]
        body = down_bytes(out)
        assert b'data: {"error"' not in body and DONE_FRAME not in body
        assert b"event: error\n" in body


def test_with_no_event_yet_the_request_names_the_shape() -> None:
    for dialect, first in (
        (Dialect.MESSAGES, VLLM_MESSAGES_ERROR),
        (Dialect.RESPONSES, OPENAI_ERROR.replace(b'"sequence_number":6', b'"sequence_number":0')),
        (Dialect.CHAT, error_frame("vllm") + DONE_FRAME),
    ):
        out = replay(
            InbandError(events=0),
            [(0.0, Chunk(UP, request_bytes(dialect))), (0.5, Chunk(DOWN, SSE_HEAD))],
        )
        framed = b"".join(encode_chunk(f + b"\n\n") for f in first.split(b"\n\n")[:-1])
        assert out[1] == (0.5, Chunk(DOWN, SSE_HEAD + framed + LAST_CHUNK_BYTES)), dialect


@pytest.mark.parametrize(
    ("dialect", "index"), [(Dialect.RESPONSES, 16), (Dialect.MESSAGES, 12), (Dialect.CHAT, 7)]
)
def test_an_error_in_the_middle_of_a_tool_call_follows_the_second_fragment(
    dialect: Dialect, index: int
) -> None:
    events = agent_events(dialect)
    fault = InbandError(after_tool_fragments=2)
    out = replay(fault, timeline(writes_of(events), request_bytes=request_bytes(dialect)))
    body = down_bytes(out)
    before = SSE_HEAD + b"".join(encode_chunk(e) for e in events[: index + 1])
    assert body.startswith(before)
    assert b': \\"Par' in body and b'is\\"}' not in body
    error = sse(body[len(before) :].split(b"\r\n", 1)[1].split(b"\r\n", 1)[0])
    assert read(error, dialect).end is EndKind.ERROR
    if dialect is Dialect.RESPONSES:
        assert json.loads(error.data)["sequence_number"] == index + 1
    (report,) = fault.reports
    assert (report.details["event"], report.details["tool_fragments"]) == (index + 1, 2)


def test_close_truncates_and_continue_lets_the_server_go_on_with_its_own_numbers() -> None:
    events = answer_events(Dialect.RESPONSES, PIECES)
    out = replay(InbandError(events=6, then="close"), answer_timeline(Dialect.RESPONSES))
    assert down_bytes(out).endswith(encode_chunk(OPENAI_ERROR))  # no last chunk
    assert ends(out) == [(7.0, Eof(DOWN)), (7.0, Eof(UP))]
    out = replay(InbandError(events=6, then="continue"), answer_timeline(Dialect.RESPONSES))
    assert down_bytes(out) == (
        SSE_HEAD + b"".join(encode_chunk(e) for e in events[:6]) + encode_chunk(OPENAI_ERROR)
        + b"".join(encode_chunk(e) for e in events[6:]) + LAST_CHUNK_BYTES
    )  # fmt: skip
    # the server's next event keeps its number: 6 comes twice
    assert b'"sequence_number":6,"type":"response.output_text.delta"' in down_bytes(out)


@pytest.mark.parametrize("dialect", list(Dialect))
def test_the_scorer_reads_the_injected_error_as_a_failed_generation_in_every_dialect(
    dialect: Dialect,
) -> None:
    out = replay(InbandError(events=3), answer_timeline(dialect))
    ((_, text, finished),) = upstream_generations([(request_bytes(dialect), down_bytes(out))])
    assert not finished and "".join(PIECES).startswith(text)
    # the same stream without the fault is a finished generation
    whole = b"".join(writes_of(answer_events(dialect, PIECES)))
    ((_, text, finished),) = upstream_generations([(request_bytes(dialect), whole)])
    assert finished and text == "".join(PIECES)


@pytest.mark.parametrize("dialect", list(Dialect))
def test_the_scorer_counts_one_inband_error_in_every_dialect_and_none_without_the_fault(
    dialect: Dialect,
) -> None:
    asked = request_bytes(dialect)
    out = replay(InbandError(events=3), answer_timeline(dialect))
    assert analyse_upstream(asked, down_bytes(out))["inband_errors"] == 1
    whole = b"".join(writes_of(answer_events(dialect, PIECES)))
    assert analyse_upstream(asked, whole)["inband_errors"] == 0


def test_a_shape_of_another_api_writes_the_streams_own() -> None:
    assert dialect_error_frame(Dialect.MESSAGES, "vllm-spaced") == VLLM_MESSAGES_ERROR
    assert dialect_error_frame(Dialect.CHAT, "anthropic") == error_frame("vllm")
    assert dialect_error_frame(Dialect.COMPLETIONS, "openai-failed") == error_frame("vllm")
    assert dialect_error_frame(Dialect.RESPONSES, "vllm-legacy", sequence=6) == OPENAI_ERROR
    out = replay(InbandError(events=4, shape="vllm-legacy"), answer_timeline(Dialect.MESSAGES))
    assert encode_chunk(VLLM_MESSAGES_ERROR) in down_bytes(out)


def test_error_type_and_message_fill_each_apis_own_fields() -> None:
    responses = dialect_error_frame(
        Dialect.RESPONSES, message="rate limited", error_type="rate_limit_exceeded", sequence=3
    )
    parsed = ResponseErrorEvent.model_validate_json(sse(responses).data)
    assert (parsed.code, parsed.message, parsed.sequence_number) == (
        "rate_limit_exceeded",
        "rate limited",
        3,
    )
    messages = dialect_error_frame(Dialect.MESSAGES, "anthropic", "busy", "api_error", 529)
    assert json.loads(sse(messages).data) == {
        "type": "error",
        "error": {"type": "api_error", "message": "busy"},
    }


def test_chat_and_completions_frames_are_unchanged_byte_for_byte() -> None:
    for dialect in (Dialect.CHAT, Dialect.COMPLETIONS):
        for shape in ("vllm", "vllm-spaced", "vllm-legacy", "openai"):
            assert dialect_error_frame(dialect, shape, code=503) == error_frame(shape, code=503)  # type: ignore[arg-type]
        events = answer_events(dialect, PIECES)
        out = replay(InbandError(events=2), answer_timeline(dialect))
        assert down_bytes(out) == (
            SSE_HEAD + b"".join(encode_chunk(e) for e in events[:2])
            + encode_chunk(error_frame("vllm")) + encode_chunk(DONE_FRAME) + LAST_CHUNK_BYTES
        )  # fmt: skip


# -- sse_ids -------------------------------------------------------------------------------


def with_id(event: bytes, number: int) -> bytes:
    """`event` with `id: number` before its blank line."""
    return event[:-1] + b"id: %d\n\n" % number


@pytest.mark.parametrize("dialect", [Dialect.RESPONSES, Dialect.MESSAGES])
def test_add_numbers_named_events_and_leaves_their_data_alone(dialect: Dialect) -> None:
    events = answer_events(dialect, PIECES)
    out = replay(SseIds(mode="add", start=0), answer_timeline(dialect))
    assert down_bytes(out) == b"".join(
        writes_of([with_id(e, number) for number, e in enumerate(events)])
    )
    seen = [p.event for p in SseFramer().feed(b"".join(with_id(e, 0) for e in events))]
    assert all(e is None or e.event != "message" for e in seen)  # every name kept
    if dialect is Dialect.RESPONSES:  # from 0, the ids equal a fresh stream's positions
        for number, raw in enumerate(events):
            event = sse(with_id(raw, number))
            assert event.id == str(read(event, dialect).sequence)


def test_renumbering_a_resumed_responses_stream_moves_the_ids_and_never_the_sequence() -> None:
    # A gateway that set `id:` to the sequence number, replaying from 7 after a resume:
    # a relay that numbers from scratch makes Last-Event-ID say 1.. while the data still
    # says 7.., which is what `starting_after` is taken from.
    events = answer_events(Dialect.RESPONSES, PIECES)[7:]
    numbered = [with_id(e, 7 + i) for i, e in enumerate(events)]
    asked = b"GET /v1/responses/resp_1?stream=true&starting_after=6 HTTP/1.1\r\nHost: up\r\n\r\n"
    out = replay(SseIds(mode="renumber"), timeline(writes_of(numbered), request_bytes=asked))
    assert down_bytes(out) == b"".join(writes_of([with_id(e, 1 + i) for i, e in enumerate(events)]))
    resumed = [sse(with_id(e, 1 + i)) for i, e in enumerate(events)]
    assert [read(e, Dialect.RESPONSES).sequence for e in resumed] == [7, 8, 9, 10, 11]


def test_strip_drops_the_ids_of_a_messages_stream_and_nothing_else() -> None:
    events = answer_events(Dialect.MESSAGES, PIECES)
    numbered = [with_id(e, i) for i, e in enumerate(events)]
    timed = timeline(writes_of(numbered), request_bytes=request_bytes(Dialect.MESSAGES))
    fault = SseIds(mode="strip")
    out = replay(fault, timed)
    assert down_bytes(out) == b"".join(writes_of(events))
    assert fault.reports[-1].details["lines"] == len(events)
    # a stream without ids has nothing to strip: it passes byte for byte, unreported
    fault = SseIds(mode="strip")
    assert down_bytes(replay(fault, answer_timeline(Dialect.MESSAGES))) == b"".join(
        writes_of(events)
    )
    assert fault.reports == []


def test_in_a_pipeline_the_shared_framing_of_the_request_names_the_shape() -> None:
    fault = InbandError(events=0)
    out = replay(
        Pipeline([fault]),
        [(0.0, Chunk(UP, request_bytes(Dialect.MESSAGES))), (0.5, Chunk(DOWN, SSE_HEAD))],
    )
    assert down_bytes(out) == SSE_HEAD + encode_chunk(VLLM_MESSAGES_ERROR) + LAST_CHUNK_BYTES
    assert fault.reports[0].details["dialect"] == "messages"


@settings(max_examples=30, deadline=None)
@given(
    st.sampled_from([Dialect.RESPONSES, Dialect.MESSAGES]),
    st.integers(0, 8),
    st.lists(st.integers(1, 10_000), max_size=6),
)
def test_however_tcp_splits_the_stream_the_client_reads_the_first_events_then_the_error(
    dialect: Dialect, events: int, splits: list[int]
) -> None:
    wire = b"".join(writes_of(answer_events(dialect, PIECES)))
    bounds = sorted({0, len(wire), *(s % len(wire) for s in splits)})
    writes = [wire[a:b] for a, b in itertools.pairwise(bounds) if b > a]
    whole = replay(InbandError(events=events), answer_timeline(dialect))
    out = replay(InbandError(events=events), timeline(writes, request_bytes=request_bytes(dialect)))
    ((body, valid),) = dechunked(down_bytes(out))
    assert valid and dechunked(down_bytes(whole)) == [(body, True)]
    shown = [p.event for p in SseFramer().feed(body) if p.event]
    assert [e.raw for e in shown[:events]] == answer_events(dialect, PIECES)[:events]
    assert read(shown[events], dialect).end is EndKind.ERROR and len(shown) == events + 1


def test_an_error_before_any_event_of_a_replay_takes_the_number_after_starting_after() -> None:
    asked = b"GET /v1/responses/resp_1?stream=true&starting_after=291 HTTP/1.1\r\nHost: up\r\n\r\n"
    out = replay(InbandError(events=0), [(0.0, Chunk(UP, asked)), (0.5, Chunk(DOWN, SSE_HEAD))])
    (error,) = [p.event for p in SseFramer().feed(dechunked(down_bytes(out))[0][0]) if p.event]
    assert json.loads(error.data)["sequence_number"] == 292
    # once the replay's own events came, the number follows the last of them
    events = answer_events(Dialect.RESPONSES, PIECES)[5:]  # sequence 5..
    out = replay(InbandError(events=2), timeline(writes_of(events), request_bytes=asked))
    shown = [p.event for p in SseFramer().feed(dechunked(down_bytes(out))[0][0]) if p.event]
    assert json.loads(shown[-1].data)["sequence_number"] == 7
