"""Agent-stream verdicts: a partial tool call acted on, a side effect twice, invalid JSON
acted on, reasoning shown as the answer or hidden, tool-call fragments wasted after a cut.

Upstream legs are literal vLLM 0.32 bytes in the shapes of tool-call-named-stream.txt and
json-schema-stream.txt (role chunk, a call's id/type/name, one chunk per argument
fragment, the finish chunk, `[DONE]`)."""

from __future__ import annotations

import json
from typing import Any

from middlebox.compose import load_text
from middlebox.core.stream import Direction
from middlebox.observe.journal import ConnectionJournal
from middlebox.report.scorecard import COLOURS, SEVERITY, SHORT
from middlebox.run.agent_checks import (
    AGENT_VERDICTS,
    fragments_read_after_the_client_stopped,
    judge_request,
    reasoning_ttft_ms,
    sent_responses,
)
from middlebox.run.score import score_client
from middlebox.scenario.expect import AGENT_METRICS, METRICS

TAG = "[middlebox email/tools-naive/0]"
ARGS = ['{"to": "ops', '@example.com", ', '"subject": "disk ', 'full"}']
COMPLETE = {"to": "ops@example.com", "subject": "disk full"}


def chunk(delta: dict[str, Any], finish: str | None = None) -> bytes:
    choice = {"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish}
    return json.dumps({"object": "chat.completion.chunk", "choices": [choice]}).encode()


def tool_events(fragments: list[str], finish: str | None = "tool_calls") -> list[bytes]:
    events = [
        chunk({"role": "assistant", "content": ""}),
        chunk(
            {
                "content": None,
                "tool_calls": [
                    {
                        "id": "chatcmpl-tool-8acb8ad5e1dc2ddb",
                        "type": "function",
                        "index": 0,
                        "function": {"name": "send_email"},
                    }
                ],
            }
        ),
    ]
    events += [
        chunk({"content": None, "tool_calls": [{"index": 0, "function": {"arguments": f}}]})
        for f in fragments
    ]
    if finish is not None:
        events += [chunk({}, finish), b"[DONE]"]
    return events


def leg(*events: bytes, tag: str = TAG) -> tuple[bytes, bytes]:
    body = json.dumps({"messages": [{"role": "user", "content": f"{tag} hi"}], "stream": True})
    request = b"POST /v1/chat/completions HTTP/1.1\r\nContent-Length: %d\r\n\r\n" % len(body)
    stream = b"".join(b"data: " + e + b"\n\n" for e in events)
    response = (
        b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nContent-Length: %d\r\n\r\n"
        % len(stream)
    )
    return request + body.encode(), response + stream


def executed(arguments: Any, key: str | None = None, index: int | None = 0) -> dict[str, Any]:
    return {
        "name": "send_email",
        "arguments": arguments,
        "idempotency_key": key,
        "index": index,
        "at": 1.0,
    }


def result(**extra: Any) -> dict[str, Any]:
    return {"index": 0, "text": "", "error": None, "chunks": [], "started_at": 100.0, **extra}


def test_the_upstream_leg_gives_each_calls_name_whole_arguments_and_fragment_count() -> None:
    [sent] = sent_responses(leg(*tool_events(ARGS)))
    assert sent.calls[0].name == "send_email"
    assert json.loads(sent.calls[0].arguments) == COMPLETE
    assert sent.calls[0].fragments == 4
    assert sent.finish_reason == "tool_calls" and sent.finished


def test_executing_the_complete_arguments_once_is_no_finding() -> None:
    [sent] = sent_responses(leg(*tool_events(ARGS)))
    found = judge_request(result(tool_calls_executed=[executed(COMPLETE, "k1")]), [sent])
    assert (found.executed, found.partial, found.repeated) == (1, 0, 0)
    assert found.verdict() is None


def test_arguments_cut_mid_string_and_repaired_are_a_partial_call() -> None:
    [cut] = sent_responses(leg(*tool_events(ARGS[:2], finish=None)))
    assert not cut.finished
    found = judge_request(result(tool_calls_executed=[executed({"to": "ops@example.com"})]), [cut])
    assert found.partial == 1
    assert found.verdict() == "acted_on_partial_call"


def test_arguments_that_are_not_json_are_a_partial_call_even_after_a_finish() -> None:
    [sent] = sent_responses(leg(*tool_events(ARGS)))
    found = judge_request(result(tool_calls_executed=[executed('{"to": "ops')]), [sent])
    assert found.partial == 1


def test_a_call_the_upstream_ended_at_max_tokens_is_not_complete() -> None:
    [sent] = sent_responses(leg(*tool_events(ARGS, finish="length")))
    found = judge_request(result(tool_calls_executed=[executed(COMPLETE)]), [sent])
    assert found.partial == 1


def test_one_logical_call_run_twice_without_a_key_is_a_repeated_side_effect() -> None:
    responses = [*sent_responses(leg(*tool_events(ARGS))), *sent_responses(leg(*tool_events(ARGS)))]
    twice = [executed(COMPLETE), executed(COMPLETE)]
    found = judge_request(result(tool_calls_executed=twice), responses)
    assert (found.executed, found.partial, found.repeated) == (2, 0, 1)
    assert found.verdict() == "side_effect_repeated"


def test_one_call_run_twice_under_one_key_counts_once_and_two_keys_count_twice() -> None:
    [sent] = sent_responses(leg(*tool_events(ARGS)))
    same = judge_request(
        result(tool_calls_executed=[executed(COMPLETE, "k"), executed(COMPLETE, "k")]), [sent]
    )
    assert same.repeated == 0
    other = judge_request(
        result(tool_calls_executed=[executed(COMPLETE, "k"), executed(COMPLETE, "k2")]), [sent]
    )
    assert other.repeated == 1


def test_two_different_calls_of_one_tool_are_not_a_repeat() -> None:
    found = judge_request(
        result(tool_calls_executed=[executed(COMPLETE, index=0), executed(COMPLETE, index=1)]),
        sent_responses(leg(*tool_events(ARGS))),
    )
    assert found.repeated == 0


def test_json_acted_on_must_be_the_complete_answer_of_a_finished_generation() -> None:
    answer = '{"city": "Paris", "temp": 21}'
    pieces = [chunk({"role": "assistant", "content": ""})]
    pieces += [chunk({"content": answer[i : i + 5]}) for i in range(0, len(answer), 5)]
    [done] = sent_responses(leg(*pieces, chunk({}, "stop"), b"[DONE]"))
    [cut] = sent_responses(leg(*pieces[:3]))
    good = judge_request(result(json_acted_on=[{"text": answer, "value": None}]), [done])
    assert good.invalid_json == 0
    repaired = judge_request(result(json_acted_on=[{"text": '{"city": "Par"}'}]), [cut, done])
    assert repaired.invalid_json == 1 and repaired.verdict() == "acted_on_invalid_json"
    broken = judge_request(result(json_acted_on=[{"text": '{"city": "Par'}]), [cut])
    assert broken.invalid_json == 1


REASONING = "The user asks about proxies; first I should recall how nginx buffers."


def reasoning_leg() -> tuple[bytes, bytes]:
    events = [chunk({"role": "assistant", "content": ""})]
    events += [chunk({"reasoning": REASONING[i : i + 8]}) for i in range(0, len(REASONING), 8)]
    events += [chunk({"content": "Hello"}), chunk({}, "stop"), b"[DONE]"]
    return leg(*events)


def test_reasoning_in_the_answer_is_reasoning_shown_as_the_answer() -> None:
    sent = sent_responses(reasoning_leg())
    assert sent[0].reasoning == REASONING and sent[0].content == "Hello"
    found = judge_request(result(text=REASONING + "Hello"), sent)
    assert found.reasoning_as_answer and found.verdict() == "reasoning_as_answer"


def test_reasoning_never_shown_is_hidden_and_shown_apart_is_fine() -> None:
    sent = sent_responses(reasoning_leg())
    assert judge_request(result(text="Hello"), sent).verdict() == "reasoning_hidden"
    apart = result(text="Hello", reasoning=[[100.25, REASONING]])
    assert judge_request(apart, sent).verdict() is None
    assert reasoning_ttft_ms(apart) == 250.0


def test_the_scorer_replaces_the_text_verdict_and_counts_the_agent_metrics() -> None:
    cut = leg(*tool_events(ARGS[:2], finish=None))
    done = leg(*tool_events(ARGS))
    naive = result(tool_calls_executed=[executed({"to": "ops@example.com"}), executed(COMPLETE)])
    score = score_client(
        "email", "tools-naive", [TAG], {"results": [naive]}, [], [cut, done], [], [],
        client_traffic=[cut, done],
    )  # fmt: skip
    assert score.verdicts()["requests"] == ["acted_on_partial_call"]
    assert score.metrics["client.tool_calls_executed"] == 2
    assert score.metrics["client.partial_tool_calls_executed"] == 1
    assert score.metrics["client.side_effects_repeated"] == 1
    assert score.metrics["server.tool_call_tokens_wasted"] == 0


def test_fragments_the_upstream_sent_that_never_reached_the_client_are_wasted() -> None:
    upstream = leg(*tool_events(ARGS))
    client = leg(*tool_events(ARGS[:1], finish=None))
    score = score_client(
        "reset", "resilient", [TAG], {"results": [result(error="TruncatedStream: cut")]}, [],
        [upstream], [], [], client_traffic=[client],
    )  # fmt: skip
    assert score.metrics["server.tool_call_tokens_wasted"] == 3
    assert score.verdicts()["requests"] != ["acted_on_partial_call"]


def test_fragments_read_with_the_clients_last_bytes_were_not_generated_for_nobody() -> None:
    # A real vLLM that stalls sends most of a call in one read: a cut after the 1st
    # fragment lets the rest of that read go nowhere, but it was generated before the cut.
    # Only what the proxy read after its last write toward the client counts.
    fragments = [f"{n}, " for n in range(8)]
    request, response = leg(*tool_events(fragments, finish=None))
    head_end = response.index(b"\r\n\r\n") + 4
    events = [b"data: " + e + b"\n\n" for e in tool_events(fragments, finish=None)]
    first = head_end + len(b"".join(events[:3]))  # role, name, fragment 0
    merged = first + len(b"".join(events[3:7]))  # fragments 1-4, read after fragment 0
    journal = ConnectionJournal(connection_id=1, started_at=0.0, capture=True)
    journal.wrote("upstream", Direction.UPSTREAM, request, 0.0)
    journal.read("upstream", Direction.DOWNSTREAM, response[:first], 0.1)
    journal.read("upstream", Direction.DOWNSTREAM, response[first:merged], 0.1)
    journal.wrote("client", Direction.DOWNSTREAM, response[:first], 0.1)  # then the cut
    journal.read("upstream", Direction.DOWNSTREAM, response[merged:], 0.3)  # fragments 5-7
    assert fragments_read_after_the_client_stopped([journal]) == 3
    # every fragment read after the client's last write, when nothing came with it
    late = ConnectionJournal(connection_id=2, started_at=0.0, capture=True)
    late.wrote("upstream", Direction.UPSTREAM, request, 0.0)
    late.read("upstream", Direction.DOWNSTREAM, response[:first], 0.1)
    late.wrote("client", Direction.DOWNSTREAM, response[:first], 0.1)
    late.read("upstream", Direction.DOWNSTREAM, response[first:], 0.2)
    assert fragments_read_after_the_client_stopped([late]) == 7
    assert fragments_read_after_the_client_stopped([journal, late]) == 10


def test_an_old_client_without_the_agent_fields_scores_as_before() -> None:
    score = score_client("s", "raw", [TAG], {"results": [result(text="")]}, [], [], [], [])
    assert all(score.metrics[name] in (0, []) for name in AGENT_METRICS)


def test_every_agent_verdict_has_a_scorecard_label_and_every_metric_an_expect_name() -> None:
    for verdict in AGENT_VERDICTS:
        assert verdict in SEVERITY and verdict in COLOURS and verdict in SHORT
    assert SEVERITY.index("acted_on_partial_call") < SEVERITY.index("silent_truncation")
    assert SEVERITY.index("reasoning_hidden") < SEVERITY.index("complete")
    assert set(AGENT_METRICS) <= set(METRICS)
    scenario = load_text("name: s\nexpect: {client.side_effects_repeated: 0}\n")
    assert scenario.sections["expect"] == {"client.side_effects_repeated": 0}


def test_each_agent_verdict_has_a_diagnosis_line_with_a_fix() -> None:
    from middlebox.report.diagnosis import AGENT_VERDICT_METRICS, EXPLAIN, diagnose

    assert set(AGENT_VERDICT_METRICS) == set(AGENT_VERDICTS)
    for verdict, metric in AGENT_VERDICT_METRICS.items():
        assert metric in AGENT_METRICS and metric in EXPLAIN
        line = diagnose({"verdicts": {"requests": [verdict]}, "metrics": {}})
        assert line.startswith(verdict.replace("_", " ") + ": ") and "fix:" in line
