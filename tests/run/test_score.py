"""Scoring: verdicts from what was generated versus what the client showed, and expect: checks."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from middlebox.compose import load_text
from middlebox.run.score import (
    SPLIT_KEPT,
    analyse_upstream,
    evaluate_expect,
    request_verdict,
    score_client,
    upstream_problem,
    upstream_split,
)


def shown(text: str, error: str | None = None, **extra: Any) -> dict[str, Any]:
    return {"index": 0, "text": text, "error": error, "chunks": [], **extra}


@pytest.mark.parametrize(
    ("expected", "result", "verdict"),
    [
        ("héllo wörld", shown("héllo wörld"), "complete"),
        ("héllo wörld", shown("héllo"), "silent_truncation"),
        ("héllo wörld", shown("héllo", error="APIConnectionError: reset"), "truncation_detected"),
        ("héllo wörld", shown("héllo héllo wörld"), "duplicated"),
        ("héllo wörld", shown("h\ufffdllo wörld"), "mojibake"),
        ("héllo wörld", shown("héllo rld"), "missing_tokens"),
        ("héllo wörld", None, "hang"),
        ("héllo wörld", shown("hé", abandoned=True), "abandoned"),
        (None, shown("", error="RateLimitError: 429"), "error_reported"),
        (None, shown("hé", error="APIConnectionError: reset"), "truncation_detected"),
        ("", shown("x"), "duplicated"),
        (None, shown(""), "silent_truncation"),
    ],
)
def test_each_request_gets_the_verdict_a_user_would_give_it(
    expected: str | None, result: dict[str, Any] | None, verdict: str
) -> None:
    assert request_verdict(expected, result) == verdict


def ledger_entry(tag: str, planned: str, **extra: Any) -> dict[str, Any]:
    entry = {
        "prompt": [{"role": "user", "content": f"{tag} words"}],
        "planned_text": planned,
        "completion_tokens": 5,
        "wasted_tokens": 0,
        "finish_reason": "stop",
        "received_at": 100.0,
        "first_token_at": 100.2,
    }
    entry.update(extra)
    return entry


def test_a_client_score_counts_verdicts_retries_and_upstream_generations() -> None:
    tags = ["[middlebox s/raw/0]", "[middlebox s/raw/1]"]
    ledger = [
        ledger_entry(tags[0], "abc"),
        ledger_entry(
            tags[1],
            "xyz",
            finish_reason="abort",
            wasted_tokens=3,
            disconnected_at=101.0,
            aborted_at=101.02,
        ),
        ledger_entry(tags[1], "xyz"),
    ]
    result = {
        "results": [
            shown("abc", chunks=[[100.3, "a"], [100.305, "b"], [100.5, "c"]], started_at=100.0),
            {**shown("xyz"), "index": 1, "attempts": 2},
        ]
    }
    score = score_client("s", "raw", tags, result, ledger, [], [("cut", "cut")], ["cut"])
    assert score.verdicts()["requests"] == ["complete", "complete"]
    metrics = score.metrics
    assert metrics["client.complete"] == 2
    assert metrics["client.retries"] == 1
    assert metrics["client.amplification"] == 2
    assert metrics["server.tokens_wasted"] == 3
    assert metrics["server.aborted"] == 1
    assert metrics["server.abort_latency_ms"] == [pytest.approx(20.0)]
    assert metrics["client.perceived_ttft_ms"] == [pytest.approx(300.0)]
    assert metrics["client.bursts"] == 2  # a+b within 10 ms, then c 195 ms later
    assert metrics["client.largest_gap_ms"] == pytest.approx(195.0)
    assert score.faults_fired == ["cut:cut"]


def test_the_upstream_bytes_reveal_heartbeats_usage_inband_errors_and_x_accel() -> None:
    request = b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Length: 2\r\n\r\n{}"
    body = (
        b': keep-alive\n\ndata: {"choices":[]}\n\n'
        b'data: {"error":{"message":"boom"}}\n\n'
        b'data: {"choices":[],"usage":{"prompt_tokens":1}}\n\ndata: [DONE]\n\n'
    )
    chunked = (
        b"".join(b"%x\r\n%s\r\n" % (len(part), part) for part in body.split(b"|")) + b"0\r\n\r\n"
    )
    response = (
        b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nX-Accel-Buffering: no"
        b"\r\nTransfer-Encoding: chunked\r\n\r\n"
    ) + chunked
    assert analyse_upstream(request, response) == {
        "heartbeats": 1,
        "usage_reported": 1,
        "inband_errors": 1,
        "x_accel_buffering_no": 1,
    }


def test_expect_checks_equality_bounds_and_percentiles_per_client() -> None:
    metrics = {
        "client.silent_truncations": 1,
        "server.tokens_wasted": 4,
        "client.perceived_ttft_ms": [100.0, 200.0, 900.0],
    }
    expect = {
        "client.silent_truncations": 0,
        "server.tokens_wasted": {"max": 5},
        "resilient": {"client.perceived_ttft_ms": {"p50_max": 250}},
    }
    raw = evaluate_expect(expect, "raw", metrics, ["raw", "resilient"])
    assert [(c.name, c.passed) for c in raw] == [
        ("client.silent_truncations", False),
        ("server.tokens_wasted", True),
    ]
    resilient = evaluate_expect(expect, "resilient", metrics, ["raw", "resilient"])
    assert [(c.condition, c.actual, c.passed) for c in resilient][-1] == ("p50_max", 200.0, True)


def test_a_client_block_overrides_the_top_level_rule_for_that_client_only() -> None:
    expect = {"client.silent_truncations": 0, "raw": {"client.silent_truncations": {"min": 1}}}
    metrics = {"client.silent_truncations": 2}
    raw = evaluate_expect(expect, "raw", metrics, ["raw", "resilient"])
    mine = evaluate_expect(expect, "mine", metrics, ["raw", "resilient", "mine"])
    assert [(c.condition, c.passed) for c in raw] == [("min", True)]
    assert [(c.condition, c.passed) for c in mine] == [("equals", False)]


def test_a_run_refuses_a_block_naming_none_of_its_clients_where_the_block_stands(
    tmp_path: Path,
) -> None:
    import trio

    from middlebox.run.client_runs import ClientSpec
    from middlebox.run.suite import run_scenario

    text = "name: s\nexpect:\n  mine: {client.complete: 1}\n  rwa: {client.complete: 1}\n"
    scenario = load_text(text, "s.yaml")
    mine = ClientSpec("mine", ["true"])
    # nothing listens at the discard port: the problem is found before anything would run
    outcome = trio.run(
        lambda: run_scenario(
            scenario, [mine], seed=None, upstream_url="http://127.0.0.1:9", workdir=tmp_path
        )
    )
    (problem,) = outcome.problems
    assert problem.startswith("s.yaml:4:3: expect: 'rwa' names no client (did you mean 'raw'?)")
    assert not outcome.scores


def test_tokens_generated_after_the_client_left_are_waste_even_if_the_server_never_knew() -> None:
    tag = "[middlebox s/raw/0]"
    entry = ledger_entry(tag, "abcdef", token_times=[100.1, 100.2, 100.3, 101.0, 102.0, 103.0])
    result = {"results": [shown("abc", abandoned=True, ended_at=100.35)]}
    score = score_client("s", "raw", [tag], result, [entry], [], [], [])
    assert score.metrics["server.tokens_wasted"] == 3


def sse_response(*events: bytes) -> bytes:
    body = b"".join(b"data: " + e + b"\n\n" for e in events)
    return (
        b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nContent-Length: %d\r\n\r\n"
        % len(body)
    ) + body


def chat_request(tag: str) -> bytes:
    body = json.dumps({"messages": [{"role": "user", "content": f"{tag} hi"}], "stream": True})
    data = body.encode()
    return b"POST /v1/chat/completions HTTP/1.1\r\nContent-Length: %d\r\n\r\n" % len(data) + data


def test_without_a_ledger_the_upstream_bytes_give_the_expected_text_of_a_real_server() -> None:
    tag = "[middlebox s/raw/0]"
    delta = b'{"choices":[{"index":0,"delta":{"content":"%s"},"finish_reason":%s}]}'
    cut_short = (chat_request(tag), sse_response(delta % (b"h\\u00e9", b"null")))
    finished = (
        chat_request(tag),
        sse_response(delta % (b"h\\u00e9", b"null"), delta % (b"llo", b'"stop"'), b"[DONE]"),
    )
    result = {"results": [shown("hé", attempts=2)]}
    score = score_client("s", "raw", [tag], result, [], [cut_short, finished], [], [])
    assert score.requests[0].verdict == "silent_truncation"
    assert score.requests[0].expected_chars == len("héllo")
    assert score.metrics["client.amplification"] == 2


def test_junk_from_an_upstream_never_crashes_the_scorer() -> None:
    # Content that is not a string (7) is no text: only the valid chunk's "7" is expected.
    tag = "[middlebox s/raw/0]"
    junk = sse_response(
        b'{"choices":["x",{"delta":"y"},{"delta":{"content":7}}]}',
        b'{"choices":"no"}',
        b"[1,2]",
        b"\xff\xfe",
        b'{"choices":[{"delta":{"content":"7"}}]}',
        b"[DONE]",
    )
    score = score_client(
        "s", "raw", [tag], {"results": [shown("7")]}, [], [(chat_request(tag), junk)], [], []
    )
    assert score.requests[0].verdict == "complete"


# ------------------------------------------------------- verdicts from the wire


def client_request(tag: str, retry: int = 0) -> bytes:
    """One attempt as it arrived on the client leg (the SDK's retry count header)."""
    body = json.dumps({"messages": [{"role": "user", "content": f"{tag} hi"}], "stream": True})
    data = body.encode()
    return (
        b"POST /v1/chat/completions HTTP/1.1\r\nx-stainless-retry-count: %d\r\n"
        b"Content-Length: %d\r\n\r\n" % (retry, len(data))
    ) + data


TOO_MANY = (
    b"HTTP/1.1 429 Too Many Requests\r\nRetry-After: 1\r\nContent-Type: application/json\r\n"
    b"Content-Length: 2\r\n\r\n{}"
)


def test_the_whole_answer_then_an_error_is_its_own_verdict_counted_and_checkable() -> None:
    from middlebox.report.scorecard import SEVERITY
    from middlebox.scenario.expect import METRICS

    result = shown("héllo wörld", error="APIConnectionError: Connection error.")
    assert request_verdict("héllo wörld", result) == "complete_then_error"
    tag = "[middlebox s/openai/0]"
    score = score_client(
        "s", "openai", [tag], {"results": [result]}, [ledger_entry(tag, "héllo wörld")], [], [], []
    )
    assert score.verdicts()["requests"] == ["complete_then_error"]
    assert score.metrics["client.complete_then_error"] == 1
    assert score.metrics["client.complete"] == 0
    assert "client.complete_then_error" in METRICS
    scenario = load_text("name: s\nexpect: {client.complete_then_error: 0}\n")
    assert scenario.sections["expect"] == {"client.complete_then_error": 0}
    checks = evaluate_expect({"client.complete_then_error": 0}, "openai", score.metrics, [])
    assert [check.passed for check in checks] == [False]
    ranked = SEVERITY.index
    assert ranked("truncation_detected") < ranked("complete_then_error") < ranked("complete")


def test_nothing_shown_plus_an_error_is_error_reported_whether_or_not_generation_began() -> None:
    error = "APIConnectionError: reset"
    assert request_verdict("héllo", shown("", error=error)) == "error_reported"
    assert request_verdict(None, shown("", error=error)) == "error_reported"


def test_attempts_come_from_the_client_leg_not_from_what_the_client_says() -> None:
    """A user's own SDK client reports attempts: 1 against a 429-always gateway: the wire
    shows three requests, two of them retries, none of which reached the upstream."""
    tag = "[middlebox s/own-openai/0]"
    legs = [(client_request(tag, retry), TOO_MANY) for retry in range(3)]
    result = {"results": [shown("", error="RateLimitError: 429", attempts=1)]}
    score = score_client("s", "own-openai", [tag], result, [], [], [], [], client_traffic=legs)
    assert score.requests[0].verdict == "error_reported"
    assert score.requests[0].attempts == 3
    assert score.requests[0].reported_attempts == 1
    assert score.metrics["client.retries"] == 2
    assert score.metrics["client.amplification"] == 3
    assert score.metrics["server.generations_per_request"] == 0
    assert score.metrics["client.attempts_mismatch"] == 1
    assert score.notes == ["request 0: the client reported 1 attempt(s), the wire shows 3"]
    assert score.to_json()["notes"] == score.notes


def test_attempts_of_other_requests_on_the_same_connection_are_not_counted() -> None:
    tags = ["[middlebox s/raw/0]", "[middlebox s/raw/1]"]
    keep_alive = (client_request(tags[0]) + client_request(tags[1]), b"")
    results = {"results": [shown("a", attempts=1), {**shown("b", attempts=1), "index": 1}]}
    score = score_client("s", "raw", tags, results, [], [], [], [], client_traffic=[keep_alive])
    assert [request.attempts for request in score.requests] == [1, 1]
    assert score.metrics["client.retries"] == 0
    assert score.metrics["client.attempts_mismatch"] == 0


DELTA = b'{"choices":[{"index":0,"delta":{"content":"%s"},"finish_reason":%s}]}'


def test_a_real_servers_inband_error_frame_then_done_is_a_failed_generation() -> None:
    """vLLM's `data: {"error": ...}` then `[DONE]`: a client that ignores the frame and
    shows what came is silent_truncation, as emulator mode says of the same scenario."""
    tag = "[middlebox s/httpx-sse/0]"
    failed = sse_response(
        DELTA % (b"h\\u00e9", b"null"), b'{"error":{"message":"boom"}}', b"[DONE]"
    )
    result = {"results": [shown("hé")]}
    score = score_client("s", "httpx-sse", [tag], result, [], [(chat_request(tag), failed)], [], [])
    assert score.requests[0].verdict == "silent_truncation"
    assert score.requests[0].upstream_finish_reason == "error"


def test_a_stream_cut_before_finish_reason_expects_what_it_had_sent_and_is_not_complete() -> None:
    tag = "[middlebox s/raw/0]"
    cut = sse_response(DELTA % (b"h\\u00e9", b"null"), DELTA % (b"llo", b"null"))
    for result, verdict in [
        (shown("héllo"), "silent_truncation"),
        (shown("héllo", error="TruncatedStream: no finish_reason"), "truncation_detected"),
    ]:
        score = score_client(
            "s", "raw", [tag], {"results": [result]}, [], [(chat_request(tag), cut)], [], []
        )
        assert score.requests[0].expected_chars == len("héllo")
        assert score.requests[0].verdict == verdict


@pytest.mark.parametrize(
    ("reported", "upstream", "error", "flag"),
    [
        ("length", "length", None, None),
        (None, "length", None, "length_hidden"),  # showed a cut answer as if whole
        ("stop", "length", None, "stop_invented"),
        ("stop", "abort", None, "stop_invented"),
        ("stop", "stop", None, None),
        (None, "length", "TruncatedStream: cut", None),  # it said something was wrong
    ],
)
def test_the_clients_finish_reason_is_compared_with_the_upstreams(
    reported: str | None, upstream: str, error: str | None, flag: str | None
) -> None:
    tag = "[middlebox s/openai/0]"
    ledger = [ledger_entry(tag, "abc", finish_reason=upstream)]
    result = {"results": [shown("abc", error=error, finish_reason=reported)]}
    score = score_client("s", "openai", [tag], result, ledger, [], [], [])
    request = score.requests[0]
    assert (request.finish_reason, request.upstream_finish_reason) == (reported, upstream)
    assert request.finish_flag == flag
    assert score.verdicts()["finish_flags"] == [flag]
    assert score.metrics["client.length_hidden"] == (flag == "length_hidden")
    assert score.metrics["client.stop_invented"] == (flag == "stop_invented")


def test_a_real_servers_length_reaches_the_finish_reason_comparison() -> None:
    tag = "[middlebox s/raw/0]"
    cut_by_max_tokens = sse_response(DELTA % (b"abc", b'"length"'), b"[DONE]")
    traffic = [(chat_request(tag), cut_by_max_tokens)]
    score = score_client("s", "raw", [tag], {"results": [shown("abc")]}, [], traffic, [], [])
    assert score.requests[0].verdict == "complete"
    assert score.requests[0].finish_flag == "length_hidden"


def chat_stream(created: int, *texts: str) -> bytes:
    """A chat completion stream whose events add `texts`, then [DONE]."""
    events = [
        json.dumps(
            {
                "id": f"chatcmpl-{created}",
                "created": created,
                "choices": [{"index": 0, "delta": {"content": text}, "finish_reason": None}],
            }
        ).encode()
        for text in texts
    ]
    return sse_response(*events, b"[DONE]")


def test_the_upstream_split_of_a_request_s_text_is_kept_without_ids_or_times() -> None:
    tag, other = "[middlebox s/raw/0]", "[middlebox s/raw/1]"
    split = upstream_split([(chat_request(tag), chat_stream(1, "He", "llo", "!"))], tag)
    assert split == [2, 3, 1, 0]  # [DONE] adds no text
    # the same split with another id and `created`: the same
    assert upstream_split([(chat_request(tag), chat_stream(2, "He", "llo", "!"))], tag) == split
    # the same text with two tokens merged into one event (a lagging writer): another
    assert upstream_split([(chat_request(tag), chat_stream(1, "Hello", "!"))], tag) == [5, 1, 0]
    # another request's stream on the leg is not this one's
    assert upstream_split([(chat_request(other), chat_stream(1, "Hello", "!"))], tag) == []
    legs = [(chat_request(other), chat_stream(1, "Hello", "!")),
            (chat_request(tag), chat_stream(1, "He", "llo", "!"))]  # fmt: skip
    assert upstream_split(legs, tag) == split
    # bounded: a long answer keeps its first SPLIT_KEPT events
    long = chat_stream(1, *("t" for _ in range(SPLIT_KEPT + 10)))
    assert upstream_split([(chat_request(tag), long)], tag) == [1] * SPLIT_KEPT
    # the scorer keeps it per request, for `replay`
    score = score_client("s", "raw", [tag], {"results": [shown("Hello!")]}, [], legs[1:], [], [])
    assert score.requests[0].upstream_split == "2,3,1,0"  # compact in report.json


# ------------------------------------------------- an upstream that answered errors

NOT_IMPLEMENTED = (
    b"HTTP/1.1 501 Unsupported method ('POST')\r\nContent-Type: text/html\r\n"
    b"Content-Length: 2\r\n\r\nno"
)
UNAVAILABLE = b"HTTP/1.1 503 Service Unavailable\r\nContent-Length: 0\r\n\r\n"


def test_a_real_server_that_answers_every_request_with_an_error_is_named_not_the_client() -> None:
    """`run --upstream` at a server that lists models but answers every POST 501: the raw
    client shows nothing and no error, which is no silent truncation of the client's: the
    upstream refused, and the run tested no client."""
    tags = ["[middlebox s/raw/0]", "[middlebox s/raw/1]"]
    legs = [(chat_request(tag), NOT_IMPLEMENTED) for tag in tags]
    results = {"results": [shown(""), {**shown(""), "index": 1}]}
    score = score_client("s", "raw", tags, results, [], legs, [], [], client_traffic=legs)
    assert score.verdicts()["requests"] == ["upstream_error", "upstream_error"]
    assert [request.upstream_status for request in score.requests] == [501, 501]
    assert score.metrics["client.silent_truncations"] == 0
    assert upstream_problem(score) == (
        "the upstream answered every request with an error (HTTP 501) and streamed nothing, "
        "so the run tested no client; check that the upstream serves the OpenAI API for the "
        "model its /v1/models names (--upstream)"
    )


def test_an_upstream_error_on_one_request_names_that_request_and_no_problem_of_the_run() -> None:
    tags = ["[middlebox s/raw/0]", "[middlebox s/raw/1]"]
    healthy = chat_stream(1, "Hi", "!")
    legs = [(chat_request(tags[0]), NOT_IMPLEMENTED), (chat_request(tags[1]), healthy)]
    results = {"results": [shown(""), {**shown("Hi!"), "index": 1}]}
    score = score_client("s", "raw", tags, results, [], legs, [], [])
    assert score.verdicts()["requests"] == ["upstream_error", "complete"]
    assert upstream_problem(score) is None


def test_a_healthy_upstream_or_one_a_retry_got_a_stream_from_is_never_blamed() -> None:
    tag = "[middlebox s/resilient/0]"
    healthy = chat_stream(1, "Hi", "!")
    for legs in ([(chat_request(tag), healthy)], [(chat_request(tag), UNAVAILABLE),
                                                   (chat_request(tag), healthy)]):  # fmt: skip
        score = score_client("s", "resilient", [tag], {"results": [shown("Hi!")]}, [], legs, [], [])
        assert score.requests[0].verdict == "complete"
        assert score.requests[0].upstream_status is None
        assert upstream_problem(score) is None


def test_a_faults_own_error_answer_is_the_faults_doing_not_the_upstreams() -> None:
    """http_error answers on the client leg and the request never reaches the server: the
    client's 429s are the scenario's, judged as the client took them."""
    tag = "[middlebox s/own-openai/0]"
    client_legs = [(client_request(tag, retry), TOO_MANY) for retry in range(3)]
    result = {"results": [shown("", error="RateLimitError: 429")]}
    score = score_client(
        "s", "own-openai", [tag], result, [], [], [], [], client_traffic=client_legs
    )
    assert score.requests[0].verdict == "error_reported"
    assert score.requests[0].upstream_status is None
    assert upstream_problem(score) is None


def test_the_emulators_own_error_answers_are_the_scenarios_not_an_upstream_problem() -> None:
    """Against the emulator the ledger says what was asked of it: a storm of 429s from it is
    what the scenario configured."""
    tag = "[middlebox s/raw/0]"
    entry = ledger_entry(tag, "abc")
    legs = [(chat_request(tag), TOO_MANY)]
    score = score_client("s", "raw", [tag], {"results": [shown("abc")]}, [entry], legs, [], [])
    assert score.requests[0].upstream_status is None
    assert score.requests[0].verdict != "upstream_error"


def test_a_client_without_a_result_to_read_is_no_result_and_no_hang() -> None:
    tag = "[middlebox s/mine/0]"
    entry = ledger_entry(tag, "abc")
    ended = score_client("s", "mine", [tag], None, [entry], [], [], [], no_result=True)
    assert ended.verdicts()["requests"] == ["no_result"]
    assert ended.metrics["client.hangs"] == 0
    hung = score_client("s", "mine", [tag], None, [entry], [], [], [])
    assert hung.verdicts()["requests"] == ["hang"]
