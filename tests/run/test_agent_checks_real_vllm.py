"""The agent checks on tool-call streams a real vLLM 0.32.0 sent (the tier's server with
realvllm/serve.TOOL_CALL_FLAGS, `--enable-auto-tool-choice --tool-call-parser hermes`),
byte for byte as they came off the socket (tests/run/captures/, chunked framing included):

- vllm-0.32-named-call-stop: a named `tool_choice`, no `ignore_eos`: the role chunk, the
  call's id/type/name, its argument fragments, then `finish_reason: "stop"` on an empty
  delta (not `tool_calls`: a named call ends as the guided decoder's EOS does);
- vllm-0.32-required-calls-length: `tool_choice: "required"`, temperature 0, `max_tokens`
  200: the random-weight model opens call after call, and `max_tokens` cuts the third, so
  the stream ends `length` with two calls whose arguments are final and one that is not
  (its fragment so far, `-5`, parses as JSON all the same).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from middlebox.run.agent_checks import judge_request, sent_responses

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
