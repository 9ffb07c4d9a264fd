"""One rule for what a stream means: the faults' triggers and the scorer count the same
tokens on the same streams, in every dialect, and `cut` "after 12 tokens" lands after the
same piece of the same answer on chat, completions, Responses and Messages (virtual clock).

The streams: everything recorded from vLLM 0.32 (tests/core/streams/, tests/run/captures/),
the same answer written in each dialect (tests/core/answers.py), and agent streams with
reasoning and tool-call arguments in each dialect.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from faults._lib.triggers import AgentEventCounter
from faults.cut import Cut
from faults.testing import replay
from middlebox.core.dialects import Dialect, TokenKind, read
from middlebox.core.framed import LegRecord
from middlebox.core.http1 import LAST_CHUNK_BYTES, Http1Framer, PieceKind, encode_chunk
from middlebox.core.sse import SseFramer
from middlebox.core.stream import DOWN, UP, Reset
from middlebox.run.score import delivered_token_times, upstream_generations
from tests.core.answers import PATHS, agent_events, answer_events, request_bytes
from tests.faults.httpstreams import SSE_HEAD, down_bytes, ends, timeline

HERE = Path(__file__).parent
CAPTURES = HERE.parent / "run" / "captures"

# An answer of 15 pieces with two steps whose bytes vLLM held back ("" between the halves of
# "é" and of "€"): chat and completions send them, Responses and Messages do not.
ANSWER = ["Un", "e", " ", "caf", "", "é", " et", " un", " re", "çu", "", " de", " 5", " ", "€."]
TEXT_PIECES = [piece for piece in ANSWER if piece]


def request_for(dialect: Dialect, target: str | None = None) -> bytes:
    if target is None:
        return request_bytes(dialect)
    return f"GET {target} HTTP/1.1\r\nHost: up\r\n\r\n".encode()


def writes_of(events: list[bytes]) -> list[bytes]:
    """Head, one HTTP chunk per event (one vLLM write per event), the terminal chunk."""
    return [SSE_HEAD, *(encode_chunk(e) for e in events), LAST_CHUNK_BYTES]


def recorded_events(path: Path) -> list[bytes]:
    """A recorded stream's events as raw blocks: an .sse file is the body; a .response
    capture is a whole HTTP response, de-chunked here."""
    raw = path.read_bytes()
    if path.suffix == ".response":
        pieces = Http1Framer("response").feed(raw)
        raw = b"".join(p.data for p in pieces if p.kind is PieceKind.BODY)
    return [p.event.raw for p in SseFramer().feed(raw) if p.event is not None]


def _streams() -> list[tuple[str, bytes, list[bytes]]]:
    """(name, request bytes, events) for every stream the rule is checked on."""
    found = []
    for path in sorted((HERE / "streams").glob("*.sse")):
        name = path.stem.removeprefix("vllm-0.32-")
        dialect = Dialect(name.split("-")[0])
        target = "/v1/responses/resp_1?stream=true&starting_after=4" if "resume" in name else None
        found.append((name, request_for(dialect, target), recorded_events(path)))
    for path in sorted(CAPTURES.glob("*.response")):
        found.append((path.stem, request_for(Dialect.CHAT), recorded_events(path)))
    for dialect in Dialect:
        found.append(
            (f"answer-{dialect.value}", request_for(dialect), answer_events(dialect, ANSWER))
        )
    for dialect in (Dialect.CHAT, Dialect.RESPONSES, Dialect.MESSAGES):
        found.append((f"agent-{dialect.value}", request_for(dialect), agent_events(dialect)))
    return found


STREAMS = _streams()


def scorer_token_ends(request: bytes, events: list[bytes]) -> list[int]:
    """Where, in the response's wire bytes, each token event the scorer counts ends (its
    HTTP chunk included): the scorer times tokens by their events' starts."""
    wire = b"".join(writes_of(events))
    record = LegRecord.from_bytes(request, wire)
    starts = delivered_token_times(record, lambda _, offset: float(offset))
    all_starts = [offset for _, offset, _ in record.events[DOWN]]
    chunk_ends = [sum(map(len, writes_of(events)[: i + 2])) for i in range(len(events))]
    return [chunk_ends[all_starts.index(int(start))] for start in starts]


@pytest.mark.parametrize(("name", "asked", "events"), STREAMS, ids=[s[0] for s in STREAMS])
def test_cut_after_tokens_and_the_scorer_count_the_same_tokens(
    name: str, asked: bytes, events: list[bytes]
) -> None:
    token_ends = scorer_token_ends(asked, events)
    assert token_ends, f"{name}: a stream with no token proves nothing"
    writes = writes_of(events)
    for count, end in enumerate(token_ends, start=1):
        fault = Cut(after="tokens", count=count)
        out = replay(fault, timeline(writes, request_bytes=asked))
        assert len(down_bytes(out)) == end, f"{name}: token {count}"
        assert fault.reports[0].details["tokens"] == count
    # one more than the stream has: the stream passes whole, never cut
    fault = Cut(after="tokens", count=len(token_ends) + 1)
    out = replay(fault, timeline(writes, request_bytes=asked))
    assert down_bytes(out) == b"".join(writes)
    assert not any(isinstance(item, Reset) for _, item in ends(out))


@pytest.mark.parametrize(("name", "asked", "events"), STREAMS, ids=[s[0] for s in STREAMS])
def test_the_trigger_counter_sees_the_reasoning_and_fragments_the_rule_reads(
    name: str, asked: bytes, events: list[bytes]
) -> None:
    meanings = [read(e) for raw in events for e in (p.event for p in SseFramer().feed(raw)) if e]
    counter = AgentEventCounter()
    counter.feed(b"".join(writes_of(events)))
    assert counter.events == len(events)
    assert counter.reasoning_tokens == sum(m.token is TokenKind.REASONING for m in meanings)
    assert counter.tool_fragments == sum(m.tool_fragments for m in meanings)


@pytest.mark.parametrize("dialect", [Dialect.CHAT, Dialect.RESPONSES, Dialect.MESSAGES])
def test_agent_streams_hold_three_reasoning_tokens_and_three_fragments_in_each_dialect(
    dialect: Dialect,
) -> None:
    counter = AgentEventCounter()
    counter.feed(b"".join(writes_of(agent_events(dialect))))
    assert (counter.reasoning_tokens, counter.tool_fragments) == (3, 3)
    request = request_for(dialect)
    assert len(scorer_token_ends(request, agent_events(dialect))) == 7  # 3 + "Sure." + 3


def received_text(wire: bytes) -> str:
    pieces = Http1Framer("response").feed(wire)
    body = b"".join(p.data for p in pieces if p.kind is PieceKind.BODY)
    meanings = [read(p.event) for p in SseFramer().feed(body) if p.event is not None]
    return "".join(m.text for m in meanings if m.token is TokenKind.ANSWER)


@pytest.mark.parametrize("dialect", list(Dialect))
def test_a_cut_after_12_tokens_lands_after_the_same_piece_of_the_answer_in_every_dialect(
    dialect: Dialect,
) -> None:
    writes = writes_of(answer_events(dialect, ANSWER))
    fault = Cut(after="tokens", count=12)
    out = replay(fault, timeline(writes, request_bytes=request_for(dialect)))
    # The 12th piece that adds text is " ", after "5", whatever the dialect and however many
    # steps before it added none (two here, sent by chat and completions only).
    assert (
        received_text(down_bytes(out)) == "".join(TEXT_PIECES[:12]) == "Une café et un reçu de 5 "
    )
    (report,) = fault.reports
    assert (report.action, report.details["tokens"]) == ("cut", 12)
    # Writes come a second apart from 1 s (the head): the cut lands on the write of the
    # event that carries the 12th piece, after each dialect's own events before it.
    before = {
        Dialect.CHAT: 1 + 14,  # the role chunk, 14 content chunks (2 without text)
        Dialect.COMPLETIONS: 14,
        Dialect.RESPONSES: 4 + 12,  # created, in_progress, item and part added
        Dialect.MESSAGES: 2 + 12,  # message_start, content_block_start
    }[dialect]
    assert ends(out) == [(1.0 + before, Reset(DOWN)), (1.0 + before, Reset(UP))]


@pytest.mark.parametrize("dialect", list(Dialect))
def test_the_scorer_reads_the_whole_answer_and_its_end_in_every_dialect(dialect: Dialect) -> None:
    for end, finished in (("stop", True), ("length", True)):
        wire = b"".join(writes_of(answer_events(dialect, ANSWER, end)))
        ((_, text, done),) = upstream_generations([(request_for(dialect), wire)])
        assert (text, done) == ("".join(ANSWER), finished)
    # the same stream cut before its end: the text so far, not finished
    events = answer_events(dialect, ANSWER)
    wire = b"".join(writes_of(events)[:-4])
    ((_, text, done),) = upstream_generations([(request_for(dialect), wire)])
    assert not done and "".join(ANSWER).startswith(text)


def test_every_dialect_has_a_path_and_a_stream_in_the_rule_test() -> None:
    assert set(PATHS) == set(Dialect)
    seen = {read(e).dialect for _, _, events in STREAMS for raw in events
            for e in (p.event for p in SseFramer().feed(raw)) if e}  # fmt: skip
    assert seen == set(Dialect)
    assert UP is not DOWN
