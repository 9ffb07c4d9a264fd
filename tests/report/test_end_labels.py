"""The timeline's end marker says how a stream ended in its API's own words: chat's
finish_reason and `[DONE]`, a Responses stream's `response.completed` (with its
`incomplete_details.reason`), a Messages stream's `stop_reason` and `message_stop`; and
which API a request spoke comes from the emulator's ledger, else from the run's wire."""

from __future__ import annotations

from typing import Any

import pytest

from middlebox.observe.journal import JournalView
from middlebox.report.timeline import end_of_stream, journal_api, key_numbers, timeline_data

TAG = "[middlebox s/c/0]"


@pytest.mark.parametrize(
    ("api", "fields", "label", "proper"),
    [
        ("responses", {"finish_reason": "completed"}, "response.completed", True),
        (
            "responses",
            {"finish_reason": "max_output_tokens"},
            "response.completed, incomplete max_output_tokens",
            True,
        ),
        ("responses", {"finish_reason": "cancelled"}, "response.completed, status cancelled", True),
        ("responses", {"finish_reason": None}, "no response.completed", False),
        ("messages", {"finish_reason": "end_turn"}, "message_stop, stop_reason end_turn", True),
        ("messages", {"finish_reason": "max_tokens"}, "message_stop, stop_reason max_tokens", True),
        ("messages", {"finish_reason": None}, "no stop_reason, no message_stop", False),
        ("responses", {"error": "APIConnectionError"}, "error: APIConnectionError", True),
        # chat and completions keep their words, and so does a request of unknown API
        ("chat", {"finish_reason": "stop", "saw_done": True}, "finish_reason stop + [DONE]", True),
        ("completions", {"finish_reason": None}, "no finish_reason, no [DONE]", False),
        (None, {"finish_reason": "length"}, "finish_reason length, no [DONE]", True),
    ],
)
def test_the_end_marker_speaks_each_apis_words(
    api: str | None, fields: dict[str, Any], label: str, proper: bool
) -> None:
    request = {"api": api, **fields}
    assert end_of_stream(request) == (label, proper)
    assert ("[DONE]" in label) == (api in ("chat", "completions", None) and "error" not in fields)


def entry(endpoint: str) -> dict[str, Any]:
    return {
        "endpoint": endpoint,
        "prompt": f"{TAG} hi",
        "received_at": 10.0,
        "first_token_at": 10.05,
        "token_times": [10.05, 10.06],
        "planned_tokens": 2,
    }


def result(reason: str | None) -> dict[str, Any]:
    chunks = [[10.06, "ab"], [10.07, "c"]]
    return {"results": [{"index": 0, "started_at": 10.0, "ended_at": 10.08, "chunks": chunks,
                         "finish_reason": reason, "saw_done": False}]}  # fmt: skip


def heads(*start_lines: str) -> JournalView:
    view = JournalView(1)
    for line in start_lines:
        view.add({"type": "http_head", "time": 10.0, "start_line": line, "headers": []})
    return view


def test_the_ledger_names_the_api_and_the_key_numbers_end_in_its_words() -> None:
    data = timeline_data("s", "c", [TAG], [entry("responses")], result("max_output_tokens"), [])
    (request,) = data["requests"]
    assert request["api"] == "responses"
    assert key_numbers(request)[-1] == "end: response.completed, incomplete max_output_tokens"
    chat = timeline_data("s", "c", [TAG], [entry("chat")], result("length"), [])
    assert key_numbers(chat["requests"][0])[-1] == "end: finish_reason length, no [DONE]"


def test_without_a_ledger_the_wire_names_the_api_when_all_requests_spoke_one() -> None:
    messages = heads("POST /v1/messages HTTP/1.1", "HTTP/1.1 200 OK")
    data = timeline_data("s", "c", [TAG], [], result(None), [messages])
    assert data["requests"][0]["api"] == "messages"
    assert end_of_stream(data["requests"][0]) == ("no stop_reason, no message_stop", False)
    resumed = heads("POST /v1/responses HTTP/1.1", "GET /v1/responses/resp_1?stream=true HTTP/1.1")
    assert journal_api([resumed]) == "responses"
    # two APIs on one run, or none: the words are not guessed
    mixed = heads("POST /v1/messages HTTP/1.1", "POST /v1/chat/completions HTTP/1.1")
    assert journal_api([mixed]) is None
    assert journal_api([heads("GET /v1/models HTTP/1.1")]) is None
