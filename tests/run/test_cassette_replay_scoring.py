"""A cassette replay is judged by what it sent: the journal's upstream leg, as a real
server's run is, since the emulator's ledger records no text for a replay."""

from __future__ import annotations

import json
from typing import Any

from middlebox.run.score import score_client, server_metrics, split_replays

TAG = "[middlebox replay/raw/0]"
DELTA = b'{"choices":[{"index":0,"delta":{"content":"%s"},"finish_reason":%s}]}'


def chat_request() -> bytes:
    body = json.dumps({"messages": [{"role": "user", "content": f"{TAG} hi"}], "stream": True})
    data = body.encode()
    return b"POST /v1/chat/completions HTTP/1.1\r\nContent-Length: %d\r\n\r\n" % len(data) + data


def sse_response(*events: bytes) -> bytes:
    body = b"".join(b"data: " + e + b"\n\n" for e in events)
    head = b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nContent-Length: %d\r\n\r\n"
    return head % len(body) + body


WHOLE = sse_response(DELTA % (b"Hel", b"null"), DELTA % (b"lo!", b'"stop"'), b"[DONE]")
CUT = sse_response(DELTA % (b"Hel", b"null"), DELTA % (b"lo", b"null"))


def replay_entry(**extra: Any) -> dict[str, Any]:
    """A cassette replay's ledger entry as the emulator writes it: no text, no reason."""
    entry = {
        "prompt": [{"role": "user", "content": f"{TAG} hi"}],
        "planned_text": None,
        "text": None,
        "completion_tokens": 0,
        "wasted_tokens": 0,
        "finish_reason": None,
        "received_at": 100.0,
        "first_token_at": None,
        "cassette": True,
    }
    return {**entry, **extra}


def scored(result: dict[str, Any], ledger: list[dict[str, Any]], response: bytes) -> Any:
    """As `suite.score_run` scores a run: replays judged from the upstream leg."""
    generated, replayed = split_replays(ledger)
    score = score_client("replay", "raw", [TAG], result, generated, [(chat_request(), response)],
                         [], [])  # fmt: skip
    if replayed:
        score.metrics.update(server_metrics(replayed))
    return score


def test_a_clean_replay_that_the_client_showed_whole_is_complete() -> None:
    result = {"results": [{"index": 0, "text": "Hello!", "finish_reason": "stop"}]}
    score = scored(result, [replay_entry()], WHOLE)
    (request,) = score.requests
    assert request.verdict == "complete"
    assert (request.expected_chars, request.upstream_finish_reason) == (len("Hello!"), "stop")
    assert request.finish_flag is None
    assert score.metrics["client.silent_truncations"] == 0
    assert score.metrics["server.generations"] == 1  # the replay still counts as served


def test_a_replay_cut_toward_the_client_is_a_truncation() -> None:
    result = {"results": [{"index": 0, "text": "Hel"}]}
    score = scored(result, [replay_entry()], WHOLE)
    assert score.requests[0].verdict == "silent_truncation"
    detected = {"results": [{"index": 0, "text": "Hel", "error": "TruncatedStream: cut"}]}
    assert scored(detected, [replay_entry()], WHOLE).requests[0].verdict == ("truncation_detected")


def test_a_replay_whose_recorded_stream_never_finished_is_not_complete() -> None:
    result = {"results": [{"index": 0, "text": "Hello"}]}
    (request,) = scored(result, [replay_entry()], CUT).requests
    assert request.verdict == "silent_truncation"
    assert request.upstream_finish_reason is None


def test_a_generated_entry_is_still_judged_by_its_planned_text_not_the_leg() -> None:
    generated = replay_entry(cassette=False, planned_text="Hello! More.", finish_reason="stop")
    result = {"results": [{"index": 0, "text": "Hello!", "finish_reason": "stop"}]}
    (request,) = scored(result, [generated], WHOLE).requests
    assert request.verdict == "silent_truncation"  # the ledger's text, not the leg's
    assert request.expected_chars == len("Hello! More.")


def test_split_replays_keeps_the_ledgers_order_on_each_side() -> None:
    a, b, c = replay_entry(id="a"), replay_entry(id="b", cassette=False), replay_entry(id="c")
    assert split_replays([a, b, c]) == ([b], [a, c])
    assert split_replays([]) == ([], [])
