"""The scorer judges the client by what reached it, never by what was only generated.

Tokens the upstream made after the client left (an upstream that does not abort, a proxy
that ignores the close) are in no burst the client saw, so they count in no tokens per
burst; the upstream's own bursts are the floor a smooth stream is judged against. A
`finish_reason: length` that a cut kept from the client is nothing the client hid. Each
case is the run's real shape as scorer inputs (the emulator's ledger, the client's result,
the client leg of the journal), then read back through the diagnosis as the report shows it.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

import pytest

from middlebox.core.dialects import Dialect
from middlebox.core.framed import LegRecord
from middlebox.core.stream import Direction
from middlebox.observe.requests import tokens_reached, upstream_tokens_per_burst
from middlebox.report.diagnosis import diagnose
from middlebox.run.score import (
    SERVER_TOKENS_PER_BURST,
    ClientScore,
    delivered_finish_reasons,
    delivered_token_times,
    delivered_tokens_per_burst,
    reached_reason,
    score_client,
)
from tests.core.answers import PATHS, answer_events

TAG = "[middlebox s/raw/0]"
START = 1000.0


def generation(itl: float, tokens: int, **extra: Any) -> dict[str, Any]:
    """One ledger entry: `tokens` tokens `itl` apart from 60 ms after START."""
    return {
        "prompt": [{"role": "user", "content": f"{TAG} words"}],
        "planned_text": "x" * tokens,
        "completion_tokens": tokens,
        "wasted_tokens": 0,
        "finish_reason": "length",
        "received_at": START,
        "first_token_at": START + 0.06,
        "token_times": [START + 0.06 + itl * n for n in range(tokens)],
        **extra,
    }


def abandoned(pieces: list[float]) -> dict[str, Any]:
    """A client that showed one piece at each of `pieces` (seconds after START) and left
    10 ms after the last."""
    return {
        "results": [
            {
                "index": 0,
                "text": "x" * len(pieces),
                "chunks": [[START + t, "x"] for t in pieces],
                "started_at": START,
                "ended_at": START + pieces[-1] + 0.01,
                "abandoned": True,
            }
        ]
    }


def as_reported(score: ClientScore, fired: Sequence[str] = ()) -> dict[str, Any]:
    document = {**score.to_json(), "passed": score.passed}
    document["verdicts"]["faults_fired"] = list(fired)
    return document


def test_an_upstream_that_never_aborts_lumps_nothing_the_client_saw() -> None:
    """abandon-no-abort: 20 ms a token, the client shows 20 and leaves; the upstream goes
    on to 300 and its ledger counts the 280 after the disconnect as wasted."""
    ledger = [generation(0.020, 300, wasted_tokens=280, disconnected_at=START + 0.47)]
    pieces = [0.061 + 0.020 * n for n in range(20)]
    score = score_client("abandon-no-abort", "raw", [TAG], abandoned(pieces), ledger, [], [], [])
    assert score.metrics["server.tokens_generated"] == 300
    assert score.metrics["client.bursts"] == 20
    assert score.metrics["client.tokens_per_burst"] == pytest.approx(1.0)  # 20 of 300
    line = diagnose(as_reported(score))
    assert "lumps" not in line and "buffering" not in line
    assert line.startswith("280 tokens generated for nobody")


def test_a_proxy_that_ignores_the_close_lumps_nothing_either() -> None:
    """abandon-ignore-client-close: the server never learns (its ledger counts no waste),
    so the tokens after the client left are found by time; at 5 ms a token the whole
    answer is one burst at the upstream already, and so it is at the client."""
    ledger = [generation(0.005, 300)]
    pieces = [0.061 + 0.005 * n for n in range(20)]
    score = score_client(
        "abandon-ignore-client-close",
        "raw",
        [TAG],
        abandoned(pieces),
        ledger,
        [],
        [("ignore_client_close", "held")],
        ["ignore_client_close"],
    )
    assert score.metrics["client.bursts"] == 1
    # the 20 shown and the 12 made within WASTE_SLACK of the leaving: not the 300
    assert score.metrics["client.tokens_per_burst"] == pytest.approx(32.0)
    assert score.metrics[SERVER_TOKENS_PER_BURST] == pytest.approx(300.0)
    line = diagnose(as_reported(score, ["ignore_client_close:held"]))
    assert "lumps" not in line and "buffering" not in line
    assert line.startswith("268 tokens generated for nobody")


def test_a_buffering_hop_still_reads_as_one_where_it_is() -> None:
    """nginx-default-buffering's shape: 60 tokens 15 ms apart reach the client as four
    4 KiB lumps of 15."""
    ledger = [generation(0.015, 60, finish_reason="stop")]
    lumps = [0.3 + 0.23 * k + 0.0001 * n for k in range(4) for n in range(15)]
    result = {
        "results": [
            {
                "index": 0,
                "text": "x" * 60,
                "chunks": [[START + t, "x"] for t in lumps],
                "started_at": START,
                "ended_at": START + 1.2,
                "finish_reason": "stop",
            }
        ]
    }
    fired = ["proxy_buffering:released"]
    score = score_client("nginx", "raw", [TAG], result, ledger, [], [], ["proxy_buffering"])
    assert score.metrics["client.tokens_per_burst"] == pytest.approx(15.0)
    assert score.metrics[SERVER_TOKENS_PER_BURST] == pytest.approx(1.0)
    assert diagnose(as_reported(score, fired)).startswith(
        "arrived in ~15-token (~4 KiB) lumps: a buffering hop (proxy_buffering)"
    )


def test_tokens_reached_are_those_made_while_the_client_was_there() -> None:
    made = [generation(0.010, 100, wasted_tokens=40)]
    assert tokens_reached(made, None) == 60  # the ledger's own count of waste
    # the client left at 0.3 s: tokens after 0.35 s (the slack) were for nobody
    assert tokens_reached([generation(0.010, 100)], START + 0.3) == 30
    assert tokens_reached([generation(0.010, 100)], None) == 100  # it never left
    assert tokens_reached([], START) == 0


def test_the_upstreams_own_bursts_follow_its_pace() -> None:
    assert upstream_tokens_per_burst([generation(0.015, 30)]) == pytest.approx(1.0)
    assert upstream_tokens_per_burst([generation(0.005, 30)]) == pytest.approx(30.0)
    # two generations are two bursts, however close in time
    pair = [generation(0.005, 10), generation(0.005, 10)]
    assert upstream_tokens_per_burst(pair) == pytest.approx(10.0)
    assert upstream_tokens_per_burst([{"completion_tokens": 3}]) is None


# ------------------------------------------------------------------ finish flags

DELTA = b'{"choices":[{"index":0,"delta":{"content":"%s"},"finish_reason":%s}]}'


def request(
    tag: str = TAG, method: bytes = b"POST", target: bytes = b"/v1/chat/completions"
) -> bytes:
    if method == b"GET":
        return b"GET %s HTTP/1.1\r\nLast-Event-ID: 3\r\n\r\n" % target
    body = json.dumps({"messages": [{"role": "user", "content": f"{tag} hi"}]}).encode()
    return b"POST %s HTTP/1.1\r\nContent-Length: %d\r\n\r\n" % (target, len(body)) + body


def stream(*events: bytes, head: bytes = b"") -> bytes:
    """A read-until-close event stream: cut wherever the events stop."""
    body = b"".join(b"data: " + e + b"\n\n" for e in events)
    return b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\n" + head + b"\r\n" + body


def flagged(
    client_reason: str | None,
    client_leg: list[tuple[bytes, bytes]] | None,
    text: str = "abc",
    upstream_reason: str = "length",
) -> tuple[str | None, str | None]:
    ledger = [generation(0.015, 3, planned_text="abc", finish_reason=upstream_reason)]
    result = {"results": [{"index": 0, "text": text, "finish_reason": client_reason}]}
    score = score_client("s", "raw", [TAG], result, ledger, [], [], [], client_traffic=client_leg)
    found = score.requests[0]
    assert score.metrics["client.length_hidden"] == (found.finish_flag == "length_hidden")
    return found.reached_finish_reason, found.finish_flag


LENGTH_REACHED = stream(DELTA % (b"ab", b"null"), DELTA % (b"c", b'"length"'), b"[DONE]")
CUT_BEFORE_FINISH = stream(DELTA % (b"ab", b"null"))


def test_length_is_hidden_only_when_it_reached_the_client() -> None:
    assert flagged(None, [(request(), LENGTH_REACHED)]) == ("length", "length_hidden")
    assert flagged("length", [(request(), LENGTH_REACHED)]) == ("length", None)


def test_a_stream_cut_before_its_finish_chunk_hid_no_length() -> None:
    """A resumable stream cut at EOF: the upstream said length, the client never saw it."""
    assert flagged(None, [(request(), CUT_BEFORE_FINISH)], text="ab") == (None, None)


def test_a_resume_by_get_carries_the_length_to_the_client() -> None:
    named = stream(DELTA % (b"ab", b"null"), head=b"X-Stream-Id: s1\r\n")
    resumed = stream(DELTA % (b"c", b'"length"'), b"[DONE]")
    legs = [(request(), named), (request(method=b"GET", target=b"/v1/streams/s1"), resumed)]
    assert delivered_finish_reasons(legs, TAG) == [None, "length"]
    assert flagged(None, legs) == ("length", "length_hidden")
    # a stream no response of this request named is someone else's
    other = [
        (request(), CUT_BEFORE_FINISH),
        (request(method=b"GET", target=b"/v1/streams/s1"), resumed),
    ]
    assert delivered_finish_reasons(other, TAG) == [None]


def test_a_leg_that_cannot_say_falls_back_to_whether_the_whole_answer_was_shown() -> None:
    gzipped = stream(head=b"Content-Encoding: gzip\r\n") + b"\x1f\x8b opaque"
    assert delivered_finish_reasons([(request(), gzipped)], TAG) == []
    assert flagged(None, [(request(), gzipped)]) == ("length", "length_hidden")
    assert flagged(None, [(request(), gzipped)], text="ab") == (None, None)
    assert flagged(None, None) == ("length", "length_hidden")  # no journal of the leg
    assert reached_reason([], "length", "silent_truncation") is None


def test_stop_is_invented_where_no_stop_reached_the_client() -> None:
    stopped = stream(DELTA % (b"ab", b"null"), DELTA % (b"c", b'"stop"'), b"[DONE]")
    assert flagged("stop", [(request(), stopped)], upstream_reason="stop") == ("stop", None)
    # the upstream stopped, but the cut kept its stop from the client: it made one up
    cut = [(request(), CUT_BEFORE_FINISH)]
    assert flagged("stop", cut, text="ab", upstream_reason="stop") == (None, "stop_invented")
    assert flagged("stop", [(request(), LENGTH_REACHED)]) == ("length", "stop_invented")


# ------------------------------------------------------- the path's own delivery

ROLE = b'{"choices":[{"index":0,"delta":{"role":"assistant"},"finish_reason":null}]}'


def test_the_path_delivery_is_timed_where_the_proxy_wrote_toward_the_client() -> None:
    body = stream(ROLE, *(DELTA % (b"t", b"null") for _ in range(3)), DELTA % (b"", b'"stop"'))
    record = LegRecord.from_bytes(request(), body + b"data: [DONE]\n\n")
    starts = [offset for _, offset, _ in record.events[Direction.DOWNSTREAM]]
    # one write per event, 15 ms apart: the role chunk, the finish chunk that adds no text
    # and [DONE] carry no token (middlebox.core.dialects' rule)
    smooth = delivered_token_times(record, lambda _, offset: START + 0.015 * starts.index(offset))
    assert smooth == pytest.approx([START + 0.015 * n for n in (1, 2, 3)])
    assert delivered_tokens_per_burst([smooth]) == pytest.approx(1.0)
    # a hop that released all three in one write
    lumped = delivered_token_times(record, lambda _, offset: START)
    assert delivered_tokens_per_burst([lumped]) == pytest.approx(3.0)
    # per connection: two connections' chunks never make one burst
    assert delivered_tokens_per_burst([lumped, lumped]) == pytest.approx(3.0)
    assert delivered_tokens_per_burst([[], []]) is None  # nothing framed: unknown


def named_stream(events: list[bytes]) -> bytes:
    head = b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\n\r\n"
    return head + b"".join(events)


@pytest.mark.parametrize(
    ("dialect", "cut_word", "done_word"),
    [
        (Dialect.RESPONSES, "max_output_tokens", "completed"),
        (Dialect.MESSAGES, "max_tokens", "end_turn"),
    ],
    ids=["responses", "messages"],
)
def test_each_api_s_length_cut_is_hidden_only_when_the_client_did_not_say_it(
    dialect: Dialect, cut_word: str, done_word: str
) -> None:
    target = PATHS[dialect].encode()
    cut = [(request(target=target), named_stream(answer_events(dialect, ["ab", "c"], "length")))]
    # the client says the model finished where the API said its limit cut the answer
    assert flagged(done_word, cut) == (cut_word, "stop_invented")
    assert flagged(None, cut) == (cut_word, "length_hidden")
    assert flagged(cut_word, cut) == (cut_word, None)
    whole = [(request(target=target), named_stream(answer_events(dialect, ["ab", "c"])))]
    assert flagged(done_word, whole, upstream_reason="stop") == (done_word, None)
