"""The result file as the runner reads it: one that keeps the client contract is read as
written, and one that breaks it is refused in one line naming what is wrong (pure)."""

from __future__ import annotations

import json
from typing import Any

import pytest

from middlebox.clients.contract import Recorder, RequestSpec
from middlebox.clients.result_file import ResultError, read_result


def as_file(document: Any) -> bytes:
    return json.dumps(document).encode()


def refusal(data: bytes, requests: int = 2) -> str:
    with pytest.raises(ResultError) as refused:
        read_result(data, requests)
    return str(refused.value)


def test_what_the_built_in_clients_write_keeps_the_contract() -> None:
    record = Recorder(RequestSpec(0, "chat", {}), started_at=1.0, ended_at=2.0)
    record.shown_at(1.5, "Hé")
    record.show_reasoning("hmm")
    record.executed_tool_call("get_weather", {"city": "Oslo"}, None, 0)
    record.acted_on_json('{"a": 1}', {"a": 1})
    record.finish_reason, record.usage, record.attempts = "stop", {"total_tokens": 3}, 1
    document = {"client": "resilient", "results": [record.to_json()]}
    assert read_result(as_file(document), 1) == document


def test_the_readme_clients_result_without_the_optional_fields_keeps_the_contract() -> None:
    entry = {"index": 1, "text": "", "finish_reason": None, "error": "APIError: x",
             "chunks": [], "started_at": 1, "ended_at": 2.5}  # fmt: skip
    assert read_result(as_file({"client": "mine", "results": [entry]}), 2)["results"] == [entry]
    # an entry per request is not required: a request without one has no result
    assert read_result(as_file({"results": []}), 2) == {"results": []}


@pytest.mark.parametrize(
    ("document", "said"),
    [
        ([1, 2], 'the result: expected an object {"client": ..., "results": [...]}, got [1, 2]'),
        ({"client": "x"}, '"results" is missing (a list with an entry per workload request)'),
        ({"results": {"index": 0}}, 'results: expected a list of entries, got {"index": 0}'),
        ({"client": 7, "results": []}, "client: expected a string, got 7"),
        ({"results": ["x"]}, 'results[0]: expected an object, got "x"'),
        (
            {"results": [{"text": "a"}]},
            "results[0].index is missing (the workload request's index)",
        ),
        ({"results": [{"index": "zero"}]}, 'results[0].index: expected an integer, got "zero"'),
        ({"results": [{"index": True}]}, "results[0].index: expected an integer, got true"),
        ({"results": [{"index": 2}]}, "results[0].index: 2 is no request of the workload (0 to 1)"),
        (
            {"results": [{"index": 0}, {"index": 0}]},
            "results[1].index: a second entry for request 0",
        ),
        (
            {"results": [{"index": 0, "chunks": "nope"}]},
            'results[0].chunks: expected a list of [display_time, text_piece] pairs, got "nope"',
        ),
        (
            {"results": [{"index": 0, "chunks": [[1.0, "a"], [2.0, 3]]}]},
            "results[0].chunks[1]: expected a [display_time, text_piece] pair, got [2.0, 3]",
        ),
        ({"results": [{"index": 0, "text": None}]}, "results[0].text: expected a string, got null"),
        (
            {"results": [{"index": 0, "started_at": "now"}]},
            'results[0].started_at: expected a number (time.time()), got "now"',
        ),
        (
            {"results": [{"index": 0, "saw_done": 1}]},
            "results[0].saw_done: expected true or false, got 1",
        ),
        (
            {"results": [{"index": 0, "tool_calls_executed": ["get_weather"]}]},
            'results[0].tool_calls_executed[0]: expected an object, got "get_weather"',
        ),
        (
            {"results": [{"index": 0, "text": "x" * 100}]} | {"client": ["x" * 100]},
            'client: expected a string, got ["' + "x" * 35 + "...",
        ),
    ],
)
def test_a_result_that_breaks_the_contract_is_refused_naming_what_is_wrong(
    document: Any, said: str
) -> None:
    assert refusal(as_file(document)) == said


def test_a_result_that_is_not_json_says_where_the_parser_stopped() -> None:
    assert refusal(b'{"client": "x",\n "results": [') == (
        "not JSON: Expecting value at line 2 column 14"
    )
    assert refusal(b"") == "not JSON: Expecting value at line 1 column 1"
    assert refusal(b'{"client": "\xff"}') == "not UTF-8: byte 12 is 0xff"
