"""Scoring a real server's side from sampled /metrics and the journal's upstream leg, and
the `contradicted` verdict for an answer redrawn or spliced by a retry (pure)."""

from __future__ import annotations

import json
from typing import Any

import pytest

from middlebox.core.framed import LegRecord
from middlebox.run.score import (
    UpstreamExchange,
    counter_at,
    exchanges_of,
    expected_text,
    judge_drawn,
    real_server_metrics,
    score_client,
)

TAG = "[middlebox s/raw/0]"
BODY = json.dumps({"messages": [{"role": "user", "content": f"{TAG} hi"}], "max_tokens": 300})


def shown(text: str, **extra: Any) -> dict[str, Any]:
    return {"index": 0, "text": text, "error": None, "chunks": [], **extra}


# ----------------------------------------------------------------- contradicted


def test_a_restart_that_redraws_a_sampled_answer_is_contradicted_not_missing_tokens() -> None:
    # attempt 1 showed "The cat", the retry drew "A dog sat" and the client ended on it
    verdict = judge_drawn("missing_tokens", ["The cat", "A dog sat"], True, "A dog sat", shown(""))
    assert verdict == "contradicted"


def test_a_resume_at_an_offset_that_splices_two_answers_is_contradicted() -> None:
    verdict = judge_drawn("missing_tokens", ["The cat ran", "A dog sat"], True, "The cat sat",
                          shown(""))  # fmt: skip
    assert verdict == "contradicted"


@pytest.mark.parametrize(
    ("attempts", "final", "verdict"),
    [
        (["The cat", "The cat sat"], "The cat sat", "complete"),  # same answer replayed
        (["", "A dog sat"], "A dog sat", "complete"),  # nothing was drawn before
        (["A dog sat"], "A dog", "truncation_detected"),  # one attempt: nothing to contradict
    ],
)
def test_attempts_that_tell_one_answer_keep_their_verdict(
    attempts: list[str], final: str, verdict: str
) -> None:
    assert judge_drawn(verdict, attempts, True, final, shown(final)) == verdict


def test_hangs_and_abandons_stay_what_they_are() -> None:
    assert judge_drawn("hang", ["a", "b"], True, "b", None) == "hang"
    assert judge_drawn("abandoned", ["a", "b"], True, "b", shown("b")) == "abandoned"


def test_a_real_generation_that_never_finished_is_not_complete_even_fully_shown() -> None:
    assert judge_drawn("complete", ["abc"], False, "abc", shown("abc")) == "silent_truncation"
    result = shown("abc", error="reset")
    assert judge_drawn("complete", ["abc"], False, "abc", result) == "truncation_detected"


def test_a_sampling_ledger_expects_the_attempt_the_client_ended_on() -> None:
    entries = [{"planned_text": "The cat sat."}, {"planned_text": "A dog ran."}]
    assert expected_text(entries, [], "A dog", True) == ("A dog ran.", True)
    assert expected_text(entries[:1], [], "x", True) == ("The cat sat.", True)


def test_without_a_ledger_a_cut_generation_expects_what_the_upstream_sent_so_far() -> None:
    assert expected_text([], [("héllo wö", False)], "hé", False) == ("héllo wö", False)
    assert expected_text([], [("cut", False), ("done.", True)], "done.", False) == ("done.", True)


def test_the_scorer_counts_a_redrawn_retry_as_contradicted() -> None:
    entries = [
        {"prompt": TAG, "planned_text": "The cat sat.", "texts": ["The cat"]},
        {"prompt": TAG, "planned_text": "A dog ran.", "texts": ["A dog ran."]},
    ]
    result = {"results": [shown("A dog ran.", attempts=2)]}
    score = score_client("s", "resilient", [TAG], result, entries, [], [], [])
    assert score.requests[0].verdict == "contradicted"
    assert score.metrics["client.contradicted"] == 1
    assert score.metrics["client.missing_tokens"] == 0


# ------------------------------------------------------------ a real server's side


def ramp(start: float, end: float, step: float, rate: float, base: float = 0.0):  # type: ignore[no-untyped-def]
    """Samples every `step` s: running 1 and `rate` tokens/s from `start` to `end`, then 0."""
    samples = []
    t = start - 2 * step
    while t < end + 10 * step:
        running = 1.0 if start <= t < end else 0.0
        tokens = base + rate * (min(max(t, start), end) - start)
        samples.append((round(t, 6), running, tokens))
        t += step
    return samples


def test_counter_at_interpolates_between_samples() -> None:
    samples = [(0.0, 1.0, 0.0), (1.0, 1.0, 100.0)]
    assert counter_at(samples, 0.25) == 25.0
    assert counter_at(samples, -1.0) == 0.0 and counter_at(samples, 5.0) == 100.0
    assert counter_at([], 1.0) == 0.0


def test_an_abandoned_stream_is_an_abort_with_its_latency_and_waste() -> None:
    # 200 tokens/s from t=10.0; the proxy read 20 chunks (to 10.095), the client left and
    # the proxy closed the upstream at 10.1; vLLM stopped at 10.16 with 32 tokens counted,
    # 12 never read: those after 10.15 (client gone + the 50 ms slack) are waste
    samples = ramp(10.0, 10.16, 0.01, 200.0)
    reads = tuple(10.0 + 0.005 * i for i in range(20))
    exchange = UpstreamExchange(BODY, 10.0, 200, "gibberish", False, 10.1, reads)
    measured = real_server_metrics([exchange], samples, {TAG: 10.1})
    assert measured["server.generations"] == 1
    assert measured["server.aborted"] == 1
    # the unread tokens were counted by the first sample at or after 10.16
    assert measured["server.abort_latency_ms"] == [pytest.approx(65.0, abs=6.0)]
    assert measured["server.tokens_generated"] == 32
    assert measured["server.tokens_wasted"] == 2
    assert measured["server.upstream_ttft_ms"] == [0.0]


def test_an_abort_with_every_token_read_is_timed_by_its_last_chunk() -> None:
    samples = ramp(10.0, 10.1, 0.01, 200.0)
    reads = tuple(10.0 + 0.005 * i for i in range(20))
    exchange = UpstreamExchange(BODY, 10.0, 200, "", False, 10.08, reads)
    measured = real_server_metrics([exchange], samples, {TAG: 10.08})
    assert measured["server.aborted"] == 1
    assert measured["server.abort_latency_ms"] == [pytest.approx(15.0)]


def test_a_generation_that_ran_to_max_tokens_or_finished_is_no_abort() -> None:
    body = json.dumps({"messages": [{"role": "user", "content": TAG}], "max_tokens": 20})
    samples = ramp(10.0, 10.1, 0.01, 200.0)  # all 20 tokens, then the proxy lets go
    to_the_end = UpstreamExchange(body, 10.0, 200, "", False, closed_at=10.05)
    assert real_server_metrics([to_the_end], samples, {})["server.aborted"] == 0
    finished = UpstreamExchange(BODY, 10.0, 200, "all", True, closed_at=None)
    measured = real_server_metrics([finished], samples, {TAG: 10.2})
    assert measured["server.aborted"] == 0 and measured["server.tokens_wasted"] == 0


def test_a_server_that_keeps_running_after_the_close_aborted_nothing() -> None:
    samples = [(t / 100, 1.0, float(t)) for t in range(1000, 1100)]  # never stops
    exchange = UpstreamExchange(BODY, 10.0, 200, "", False, closed_at=10.2)
    measured = real_server_metrics([exchange], samples, {TAG: 10.2})
    assert measured["server.aborted"] == 0  # the gauge never fell: no abort seen
    assert measured["server.tokens_wasted"] == 74  # from 10.25 to 10.99, one a sample


def test_rejected_requests_are_no_generations_and_no_samples_measure_nothing() -> None:
    rejected = UpstreamExchange(BODY, 1.0, 429, "", True)
    assert real_server_metrics([rejected], [(0.0, 0.0, 1.0)], {})["server.generations"] == 0
    assert real_server_metrics([rejected], [], {})["server.tokens_generated"] == 0


def test_each_of_two_requests_gets_the_tokens_counted_until_the_next() -> None:
    samples = ramp(10.0, 10.1, 0.01, 200.0) + ramp(11.0, 11.1, 0.01, 200.0, base=20.0)[3:]
    first = UpstreamExchange(BODY, 10.0, 200, "a", True)
    second = UpstreamExchange(BODY, 11.0, 200, "b", True)
    measured = real_server_metrics([second, first], samples, {})
    assert measured["server.generations"] == 2
    assert measured["server.tokens_generated"] == 40


def test_exchanges_come_from_the_upstream_leg_with_their_times_and_the_close() -> None:
    data = BODY.encode()
    request = b"POST /v1/chat/completions HTTP/1.1\r\nContent-Length: %d\r\n\r\n" % len(data)
    delta = (
        b'data: {"choices":[{"index":0,"delta":{"content":"h\\u00e9"},"finish_reason":null}]}\n\n'
    )
    response = b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\n\r\n" + delta
    record = LegRecord.from_bytes(request + data, response)
    (exchange,) = exchanges_of(record, lambda _, offset: 100.0 + offset, closed_at=101.5)
    assert exchange.body == BODY and exchange.sent_at == 100.0
    assert exchange.status == 200 and exchange.text == "hé" and not exchange.finished
    assert exchange.closed_at == 101.5
    assert exchange.token_times == (100.0 + response.index(b"data: "),)
