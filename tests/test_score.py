"""Scoring: verdicts from what was generated versus what the client showed, and expect: checks."""

from __future__ import annotations

import json
from typing import Any

import pytest

from middlebox.run.score import (
    analyse_upstream,
    evaluate_expect,
    expect_problems,
    request_verdict,
    score_client,
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


def test_unknown_expect_names_and_conditions_list_the_valid_ones() -> None:
    problems = expect_problems({"client.silent": 0, "server.tokens_wasted": {"most": 1}}, ["raw"])
    assert "unknown name 'client.silent'" in problems[0]
    assert "client.silent_truncations" in problems[0]
    assert "unknown condition 'most'" in problems[1]


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
    tag = "[middlebox s/raw/0]"
    junk = sse_response(
        b'{"choices":["x",{"delta":"y"},{"delta":{"content":7}}]}',
        b'{"choices":"no"}',
        b"[1,2]",
        b"\xff\xfe",
        b"[DONE]",
    )
    score = score_client(
        "s", "raw", [tag], {"results": [shown("7")]}, [], [(chat_request(tag), junk)], [], []
    )
    assert score.requests[0].verdict == "complete"
