"""A background Responses stream judged against the server's whole answer across its legs.

The server's whole answer of a response is the union, by `sequence_number`, of what it sent
on the create leg and on every resume (`GET /v1/responses/{id}?stream=true&starting_after=N`)
leg; the client's shown text is compared with it, and the sequence numbers the client was
sent over its legs are checked for gaps (a resume past its last event) and repeats (a resume
before it). Each case is a run's real shape as scorer inputs: the journal's legs, built
from the events vLLM 0.32 writes (tests/core/answers.py), and the client's result.
"""

from __future__ import annotations

import json
from typing import Any

import pytest

from middlebox.core.dialects import Dialect
from middlebox.core.framed import LegRecord
from middlebox.run.score import (
    ClientScore,
    Sample,
    UpstreamExchange,
    exchanges_of,
    real_server_metrics,
    response_answers,
    score_client,
    sequence_faults,
)
from middlebox.scenario.expect import METRICS
from tests.core.answers import answer_events

TAG = "[middlebox s/openai-responses-resume/0]"
PIECES = ["Une ", "café ", "et ", "un ", "reçu"]
WHOLE = "".join(PIECES)
EVENTS = answer_events(Dialect.RESPONSES, PIECES)  # sequence_number = index; resp_1
FIRST_DELTA = 4  # created, in_progress, output_item.added, content_part.added, then deltas
HEAD = b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\n\r\n"
Leg = tuple[bytes, bytes]


def create(events: list[bytes], tag: str = TAG) -> Leg:
    """The background create and what came back on its leg (read until the cut)."""
    body = json.dumps(
        {"input": f"{tag} hi", "background": True, "store": True, "stream": True}
    ).encode()
    head = b"POST /v1/responses HTTP/1.1\r\nContent-Length: %d\r\n\r\n" % len(body)
    return head + body, HEAD + b"".join(events)


def resume(after: int, events: list[bytes], response_id: str = "resp_1") -> Leg:
    target = f"/v1/responses/{response_id}?stream=true&starting_after={after}".encode()
    return b"GET %s HTTP/1.1\r\n\r\n" % target, HEAD + b"".join(events)


def shown(*texts: str, error: str | None = None) -> dict[str, Any]:
    text = "".join(texts)
    return {"results": [{"index": 0, "text": text, "error": error, "resumes": len(texts) - 1}]}


def scored(result: dict[str, Any], legs: list[Leg], ledger: list[Any] | None = None) -> ClientScore:
    """Scored as `middlebox run` scores it: a real server (no ledger) unless one is given;
    the proxy forwarded every event it read, so both legs carry the same bytes."""
    return score_client(
        "s", "openai-responses-resume", [TAG], result, ledger or [], legs, [], [],
        client_traffic=legs,
    )  # fmt: skip


def cut_at(count: int) -> Leg:
    """The create leg cut after its first `count` events (sequence 0..count-1)."""
    return create(EVENTS[:count])


def text_of(start: int, end: int | None = None) -> str:
    """The answer text events start..end carry (by sequence number)."""
    return "".join(
        PIECES[n - FIRST_DELTA]
        for n in range(start, len(EVENTS) if end is None else end)
        if FIRST_DELTA <= n < FIRST_DELTA + len(PIECES)
    )


CUT = FIRST_DELTA + 2  # the cut leaves two deltas shown: "Une café "


def test_a_clean_resume_is_the_whole_answer_once_with_no_gap_and_no_repeat() -> None:
    legs = [cut_at(CUT), resume(CUT - 1, EVENTS[CUT:])]
    assert response_answers(legs)["resp_1"].text == WHOLE
    score = scored(shown(text_of(0, CUT), text_of(CUT)), legs)
    (request,) = score.requests
    # one generation read over two legs: not two, and its create's text is not all of it
    assert (request.verdict, request.generations) == ("complete", 1)
    assert request.upstream_finish_reason == "completed"
    assert score.metrics["client.duplicated"] == score.metrics["client.missing_tokens"] == 0
    assert score.metrics["client.sequence_gaps"] == score.metrics["client.sequence_repeats"] == 0
    assert score.metrics["server.generations_per_request"] == 1


def test_a_resume_one_past_the_last_event_is_a_gap_and_missing_tokens() -> None:
    legs = [cut_at(CUT), resume(CUT, EVENTS[CUT + 1 :])]
    # no leg carried event CUT ("et "): the done event's text still tells the whole answer
    assert response_answers(legs)["resp_1"].text == WHOLE
    score = scored(shown(text_of(0, CUT), text_of(CUT + 1)), legs)
    assert score.requests[0].verdict == "missing_tokens"
    assert score.metrics["client.missing_tokens"] == 1
    assert (score.metrics["client.sequence_gaps"], score.metrics["client.sequence_repeats"]) == (
        1,
        0,
    )
    assert sequence_faults(legs, TAG) == (1, 0)


def test_a_resume_one_before_the_last_event_shown_again_is_a_repeat_and_duplicated() -> None:
    legs = [cut_at(CUT), resume(CUT - 2, EVENTS[CUT - 1 :])]
    assert response_answers(legs)["resp_1"].text == WHOLE
    score = scored(shown(text_of(0, CUT), text_of(CUT - 1)), legs)  # "café " twice
    assert score.requests[0].verdict == "duplicated"
    assert score.metrics["client.duplicated"] == 1
    assert (score.metrics["client.sequence_gaps"], score.metrics["client.sequence_repeats"]) == (
        0,
        1,
    )


def test_a_repeat_the_client_skipped_is_reported_on_the_wire_but_the_text_is_whole() -> None:
    legs = [cut_at(CUT), resume(CUT - 2, EVENTS[CUT - 1 :])]
    score = scored(shown(text_of(0, CUT), text_of(CUT)), legs)
    assert score.requests[0].verdict == "complete"
    assert score.metrics["client.duplicated"] == 0
    assert score.metrics["client.sequence_repeats"] == 1


def test_the_emulators_ledger_judges_the_same_resume_the_same_way() -> None:
    entry = {"prompt": f"{TAG} hi", "planned_text": WHOLE, "texts": [WHOLE], "background": True}
    legs = [cut_at(CUT), resume(CUT, EVENTS[CUT + 1 :])]
    gap = scored(shown(text_of(0, CUT), text_of(CUT + 1)), legs, [entry])
    assert gap.requests[0].verdict == "missing_tokens"
    assert gap.metrics["client.sequence_gaps"] == 1
    clean = [cut_at(CUT), resume(CUT - 1, EVENTS[CUT:])]
    whole = scored(shown(text_of(0, CUT), text_of(CUT)), clean, [entry])
    assert whole.requests[0].verdict == "complete"
    assert whole.metrics["client.sequence_gaps"] == whole.metrics["client.sequence_repeats"] == 0


def test_another_requests_response_is_no_gap_or_repeat_of_this_one() -> None:
    other = create(EVENTS[:CUT], tag="[middlebox s/openai-responses-resume/1]")
    legs = [other, resume(CUT + 1, EVENTS[CUT + 2 :])]  # resp_1 is the other request's
    assert sequence_faults(legs, TAG) == (0, 0)


def test_a_stream_cut_short_and_never_resumed_is_no_gap() -> None:
    legs = [cut_at(CUT)]
    score = scored(shown(text_of(0, CUT)), legs)
    assert score.metrics["client.sequence_gaps"] == 0
    assert score.requests[0].verdict == "silent_truncation"


def test_the_new_metrics_are_described() -> None:
    assert "resume" in METRICS["client.sequence_gaps"]
    assert "resume" in METRICS["client.sequence_repeats"]


# ------------------------------------------------- a background response's waste

START = 1000.0


def background(tokens: int, delivered: int, **extra: Any) -> dict[str, Any]:
    """The emulator's ledger entry of a background response `resp_1`: `tokens` made 10 ms
    apart, `delivered` of them written to a client."""
    return {
        "id": "resp_1",
        "prompt": f"{TAG} hi",
        "planned_text": WHOLE,
        "texts": [WHOLE],
        "background": True,
        "completion_tokens": tokens,
        "delivered_tokens": delivered,
        "wasted_tokens": tokens - delivered,
        "disconnected_at": START + 0.02,
        "finish_reason": "stop",
        "received_at": START,
        "token_times": [START + 0.01 * n for n in range(tokens)],
        **extra,
    }


def test_a_background_response_read_to_its_end_on_a_resume_wasted_nothing() -> None:
    # the emulator saw the disconnect and counts the step that closed the answer (no text)
    # as undelivered; its client was sent the terminal event on the resume all the same
    legs = [cut_at(CUT), resume(CUT - 1, EVENTS[CUT:])]
    score = scored(shown(WHOLE), legs, [background(6, 5)])
    assert score.metrics["server.tokens_wasted"] == 0
    assert score.metrics["server.background_left_running"] == 0
    assert score.metrics["server.aborted"] == 0


def test_a_background_response_its_client_left_without_a_cancel_wasted_the_rest() -> None:
    result = {"results": [{"index": 0, "text": "Une café ", "abandoned": True,
                           "ended_at": START + 0.025}]}  # fmt: skip
    score = scored(result, [cut_at(CUT)], [background(24, 2)])
    assert score.metrics["server.tokens_wasted"] == 22
    assert score.metrics["server.aborted"] == 0
    assert score.metrics["server.background_left_running"] == 1


def test_a_cancelled_background_response_wastes_what_it_made_after_the_cancel() -> None:
    # the client was sent all five tokens made before its cancel (the leg carries them),
    # then cancelled: only the two made after the cancel reached nobody; the cancel is the
    # abort, timed from the cancel
    cancelled = background(
        7, 5, wasted_tokens=0, disconnected_at=None, cancelled_at=START + 0.045,
        aborted_at=START + 0.065, finish_reason="abort",
    )  # fmt: skip
    every_delta = cut_at(FIRST_DELTA + len(PIECES))
    score = scored(shown(WHOLE), [every_delta], [cancelled])
    assert score.metrics["server.tokens_wasted"] == 2  # made at 50 and 60 ms
    assert score.metrics["server.background_left_running"] == 0  # it was cancelled
    assert score.metrics["server.aborted"] == 1
    assert score.metrics["server.abort_latency_ms"] == [pytest.approx(20.0)]


def test_tokens_written_into_a_connection_the_path_reset_reached_nobody() -> None:
    # the emulator wrote all five tokens (its socket took them), but a handoff held them and
    # then reset the connection: the client leg carried two, and the client never came back
    # for the rest (a restarting client left this response for a new one)
    left = background(5, 5, disconnected_at=START + 0.06)
    score = scored(shown("Une café "), [cut_at(CUT)], [left])
    assert score.metrics["server.tokens_wasted"] == 3
    # the same response whose five tokens all crossed the client leg wasted none of them
    sent = scored(shown(WHOLE), [cut_at(FIRST_DELTA + len(PIECES))], [left])
    assert sent.metrics["server.tokens_wasted"] == 0


def test_a_foreground_responses_stream_keeps_the_ledgers_own_waste() -> None:
    foreground = {**background(6, 2, wasted_tokens=1), "background": False}
    legs = [cut_at(CUT), resume(CUT - 1, EVENTS[CUT:])]
    assert scored(shown(WHOLE), legs, [foreground]).metrics["server.tokens_wasted"] == 1


# ------------------------------------------------ the same, against a real server


def create_body(background: bool) -> str:
    return json.dumps(
        {"input": f"{TAG} hi", "max_output_tokens": 40, "stream": True, "background": background}
    )


def samples(spans: list[tuple[float, float, float]], until: float) -> list[Sample]:
    """/metrics read every 10 ms from 9.9 to `until`: each (start, end, tokens/s) span adds
    to the token counter, and the server runs while any span does."""
    out: list[Sample] = []
    for step in range(round((until - 9.9) / 0.01) + 1):
        t = 9.9 + 0.01 * step
        count = sum(rate * (min(max(t, a), b) - a) for a, b, rate in spans)
        out.append((t, float(any(a <= t < b for a, b, _ in spans)), count))
    return out


def reads(start: float, count: int) -> tuple[float, ...]:
    """`count` chunks read 5 ms apart from `start` (200 tokens/s)."""
    return tuple(start + 0.005 * n for n in range(count))


def leg(role: str, sent_at: float, **fields: Any) -> UpstreamExchange:
    body = create_body(fields.pop("background", True)) if role == "generation" else ""
    return UpstreamExchange(
        body, sent_at, 200, "", fields.pop("finished", False), role=role, response_id="resp_1",
        background=role == "generation" and json.loads(body)["background"], **fields,
    )  # fmt: skip


def test_a_real_background_response_resumed_to_its_end_is_one_generation_and_no_waste() -> None:
    # 40 tokens from 10.0 to 10.2; the proxy let go of the create at 10.05 (the cut) and
    # the resume at 10.1 read the rest to response.completed
    created = leg("generation", 10.0, closed_at=10.05, token_times=reads(10.0, 10))
    resumed = leg("resume", 10.1, finished=True, token_times=reads(10.1, 20))
    measured = real_server_metrics([created, resumed], samples([(10.0, 10.2, 200.0)], 10.4), {})
    assert measured["server.generations"] == 1
    assert measured["server.tokens_generated"] == 40
    assert measured["server.tokens_wasted"] == 0 and measured["server.aborted"] == 0
    assert measured["server.background_left_running"] == 0


def test_a_real_foreground_responses_stream_closed_is_an_abort_as_chat_is() -> None:
    cut = leg("generation", 10.0, background=False, closed_at=10.05, token_times=reads(10.0, 10))
    measured = real_server_metrics([cut], samples([(10.0, 10.06, 200.0)], 10.3), {})
    assert measured["server.aborted"] == 1


def test_a_real_background_response_left_without_a_cancel_wastes_the_rest() -> None:
    # the client gave up at 10.05 and closed; the response ran on to its 40 tokens
    left = leg("generation", 10.0, closed_at=10.05, token_times=reads(10.0, 10))
    measured = real_server_metrics([left], samples([(10.0, 10.2, 200.0)], 10.4), {TAG: 10.05})
    assert measured["server.generations"] == 1 and measured["server.aborted"] == 0
    assert measured["server.tokens_wasted"] == 40 - 20  # all made after 10.1 (50 ms slack)
    assert measured["server.background_left_running"] == 1


def test_a_real_background_response_cancelled_wastes_what_it_made_after_the_cancel() -> None:
    # read to 10.05, still read (no close); cancelled at 10.1, stopped at 10.12
    watched = leg("generation", 10.0, token_times=reads(10.0, 24))
    cancel = leg("cancel", 10.1)
    measured = real_server_metrics([watched, cancel], samples([(10.0, 10.12, 200.0)], 10.3), {})
    assert measured["server.generations"] == 1  # the cancel is none
    assert measured["server.aborted"] == 1
    assert measured["server.abort_latency_ms"] == [pytest.approx(20.0, abs=6.0)]
    assert measured["server.tokens_wasted"] == 0  # 24 tokens, all made by 10.15


def test_a_restart_leaves_the_first_background_response_running_for_nobody() -> None:
    # the first response, left at its cut at 10.05, runs on to its 40 tokens (to 10.2);
    # the restart at 10.1 makes its own 40, all read
    first = leg("generation", 10.0, closed_at=10.05, token_times=reads(10.0, 10))
    second = UpstreamExchange(
        create_body(True), 10.1, 200, "", True, token_times=reads(10.1, 40), role="generation",
        response_id="resp_2", background=True,
    )  # fmt: skip
    spans = [(10.0, 10.2, 200.0), (10.1, 10.3, 200.0)]
    measured = real_server_metrics([first, second], samples(spans, 10.5), {TAG: 10.31})
    assert measured["server.generations"] == 2
    assert measured["server.tokens_generated"] == 80
    # what the first made after its cut (10.1 on, the 50 ms slack) went to nobody: its 20
    # last tokens, counted in the restart's window beyond the chunks the restart read
    assert measured["server.tokens_wasted"] == 20
    assert measured["server.aborted"] == 0


def test_a_real_background_response_read_by_the_proxy_but_not_the_client_is_waste() -> None:
    # a handoff held the connection: the proxy read all 40 tokens by 10.2, but only the
    # first two deltas crossed the client leg before the reset, and the client restarted
    held = leg("generation", 10.0, closed_at=10.25, token_times=reads(10.0, 40))
    spans = [(10.0, 10.2, 200.0)]
    to_client = response_answers([cut_at(CUT)])  # resp_1, two deltas sent
    assert to_client["resp_1"].token_events == 2
    measured = real_server_metrics([held], samples(spans, 10.4), {}, to_client)
    assert measured["server.tokens_wasted"] == 40 - 2
    assert measured["server.background_left_running"] == 1
    # the same when the proxy read its end too: the outage held it, and the client leg
    # carried two deltas before the reset (a real server faster than the paced stream)
    ran_out = leg("generation", 10.0, closed_at=10.25, finished=True, token_times=reads(10.0, 40))
    measured = real_server_metrics([ran_out], samples(spans, 10.4), {}, to_client)
    assert measured["server.tokens_wasted"] == 40 - 2
    assert measured["server.background_left_running"] == 1
    # the same response whose every delta crossed the client leg and ended there wasted none
    whole = response_answers([create(EVENTS)])
    assert whole["resp_1"].finished
    ended = leg("generation", 10.0, finished=True, token_times=reads(10.0, 40))
    assert (
        real_server_metrics([ended], samples(spans, 10.4), {}, whole)["server.tokens_wasted"] == 0
    )
    # without the client leg (no journal of it), the proxy's reads are what counts
    assert real_server_metrics([held], samples(spans, 10.4), {})["server.tokens_wasted"] == 0


def test_exchanges_say_which_request_resumed_or_cancelled_which_response() -> None:
    create_leg, resume_leg = cut_at(CUT), resume(CUT - 1, EVENTS[CUT:])
    cancel_leg = (b"POST /v1/responses/resp_1/cancel HTTP/1.1\r\nContent-Length: 0\r\n\r\n", b"")
    found = [
        exchange
        for request, response in (create_leg, resume_leg, cancel_leg)
        for exchange in exchanges_of(
            LegRecord.from_bytes(request, response), lambda _, offset: 10.0, None
        )
    ]
    assert [(e.role, e.response_id, e.background) for e in found] == [
        ("generation", "resp_1", True),
        ("resume", "resp_1", False),
        ("cancel", "resp_1", False),
    ]
