"""The agent checks on tool-call streams a real vLLM 0.32.0 sent (the tier's server with
realvllm/serve.TOOL_CALL_FLAGS, `--enable-auto-tool-choice --tool-call-parser hermes`),
byte for byte as they came off the socket (tests/run/captures/, chunked framing included):

- vllm-0.32-named-call-stop: a named `tool_choice`, no `ignore_eos`: the role chunk, the
  call's id/type/name, its argument fragments, then `finish_reason: "stop"` on an empty
  delta (not `tool_calls`: a named call ends as the guided decoder's EOS does);
- vllm-0.32-required-calls-length: `tool_choice: "required"`, temperature 0, `max_tokens`
  200: the random-weight model opens call after call, and `max_tokens` cuts the third, so
  the stream ends `length` with two calls whose arguments are final and one that is not
  (its fragment so far, `-5`, parses as JSON all the same);
- vllm-0.32-named-strict-call-stop: tool-call-reset-in-arguments' own tool, `strict: true`,
  named: the arguments an object of its schema in 42 fragments, then `stop`. Not strict (the
  first two captures), vLLM's hermes structural tag lets the arguments be any JSON value
  (tests/scenario/test_strict_tool_call_request.py says where in vLLM's source).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from faults.cut import Cut
from faults.testing import replay
from middlebox.compose import load
from middlebox.core.stream import DOWN, UP, Chunk
from middlebox.library import scenario_dir
from middlebox.run.agent_checks import SentResponse, judge_request, sent_responses

CAPTURES = Path(__file__).parent / "captures"


def captured(name: str) -> tuple[bytes, bytes]:
    return (CAPTURES / f"{name}.request").read_bytes(), (CAPTURES / f"{name}.response").read_bytes()


def ran(*calls: tuple[str, Any]) -> dict[str, Any]:
    executed = [
        {"name": name, "arguments": arguments, "idempotency_key": None, "index": index, "at": 1.0}
        for index, (name, arguments) in enumerate(calls)
    ]
    return {"index": 0, "text": "", "tool_calls_executed": executed}


def test_a_named_call_ending_stop_is_complete_and_running_it_is_not_partial() -> None:
    [response] = sent_responses(captured("vllm-0.32-named-call-stop"))
    assert response.finish_reason == "stop" and response.finished
    [call] = response.calls.values()
    assert call.name == "get_weather" and call.fragments >= 1
    assert response.complete_calls() == [call]
    found = judge_request(ran(("get_weather", call.arguments)), [response])
    assert (found.executed, found.partial) == (1, 0)
    assert found.verdict() is None


def test_a_prefix_of_the_named_call_run_before_its_end_is_partial() -> None:
    [response] = sent_responses(captured("vllm-0.32-named-call-stop"))
    [call] = response.calls.values()
    prefix = call.arguments[:-1]
    assert prefix != call.arguments
    found = judge_request(ran(("get_weather", prefix)), [response])
    assert found.partial == 1 and found.verdict() == "acted_on_partial_call"


def test_a_required_stream_cut_by_max_tokens_keeps_the_calls_a_later_call_closed() -> None:
    [response] = sent_responses(captured("vllm-0.32-required-calls-length"))
    assert response.finish_reason == "length" and not response.finished
    first, second, third = response.calls.values()
    assert response.complete_calls() == [first, second]
    for call in (first, second, third):
        json.loads(call.arguments)  # every one parses, the cut one too
    found = judge_request(
        ran(("get_weather", first.arguments), ("get_weather", second.arguments)), [response]
    )
    assert (found.executed, found.partial) == (2, 0)


def test_running_the_call_max_tokens_cut_is_partial_although_its_json_parses() -> None:
    [response] = sent_responses(captured("vllm-0.32-required-calls-length"))
    *_, third = response.calls.values()
    found = judge_request(ran(("get_weather", third.arguments)), [response])
    assert found.partial == 1 and found.verdict() == "acted_on_partial_call"


# tool-call-reset-in-arguments against the real server: its own cut over vLLM's own bytes.
RESET_SCENARIO = scenario_dir() / "tool-call-reset-in-arguments.yaml"


def the_scenarios_cut() -> Cut:
    """The scenario's cut as its file declares it (the request match aside: one request)."""
    [spec] = load(RESET_SCENARIO).path
    assert spec.cls is Cut and spec.config["after"] == "tool_fragments"
    return Cut(**{key: value for key, value in spec.config.items() if key != "match"})


def cut_by_the_scenario(name: str) -> tuple[Cut, SentResponse]:
    """The capture's response through the scenario's cut, as the client would have had it."""
    request, response = captured(name)
    fault = the_scenarios_cut()
    out = replay(fault, [(0.0, Chunk(UP, request)), (1.0, Chunk(DOWN, response))])
    kept = b"".join(i.data for _, i in out if isinstance(i, Chunk) and i.direction is DOWN)
    [cut] = sent_responses((request, kept))
    return fault, cut


def test_a_non_strict_named_call_is_any_json_so_four_fragments_close_it() -> None:
    """Why the scenario failed against vLLM: its tool was not strict, so the structural tag
    let the arguments be any JSON value; the model wrote `false` in four fragments, and a
    cut after the fourth has nothing open to cut (a shorter literal: it never fires)."""
    request, _ = captured("vllm-0.32-named-call-stop")
    assert b'"strict"' not in request
    fault, cut = cut_by_the_scenario("vllm-0.32-named-call-stop")
    [call] = cut.calls.values()
    assert fault.reports and call.fragments == fault.count == 4
    assert json.loads(call.arguments) is False  # closed: the cut landed after the JSON ended


def test_a_strict_named_call_is_an_object_of_its_schema_and_complete() -> None:
    request, _ = captured("vllm-0.32-named-strict-call-stop")
    [tool] = json.loads(request.split(b"\r\n\r\n", 1)[1])["tools"]
    assert tool["function"]["strict"] is True
    assert [tool] == load(RESET_SCENARIO).sections["workload"].tools  # the scenario's own tool
    [response] = sent_responses(captured("vllm-0.32-named-strict-call-stop"))
    assert response.finish_reason == "stop" and response.finished
    [call] = response.calls.values()
    arguments = json.loads(call.arguments)
    assert set(arguments) == {"title", "severity", "tags"}
    assert arguments["severity"] in ("low", "high")
    assert len(arguments["title"]) <= 16 and len(arguments["tags"]) <= 2
    assert call.fragments > the_scenarios_cut().count
    assert response.complete_calls() == [call]


def test_the_scenarios_cut_lands_inside_a_strict_calls_open_arguments() -> None:
    fault, cut = cut_by_the_scenario("vllm-0.32-named-strict-call-stop")
    assert fault.reports, "the cut fired"
    [call] = cut.calls.values()
    assert call.fragments == fault.count
    with pytest.raises(ValueError):
        json.loads(call.arguments)  # the JSON is still open: what tools-naive repairs and runs
    assert cut.finish_reason is None and cut.complete_calls() == []
    found = judge_request(ran(("create_ticket", call.arguments)), [cut])
    assert found.partial == 1 and found.verdict() == "acted_on_partial_call"
