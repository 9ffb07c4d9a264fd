"""The `workload:` block turned into what each client process reads (scenario/workload.py).

The scorer finds a request's generations in the upstream ledger by the tag at the head of
its prompt, so the tag's shape, its place in the prompt and the per-request schedule are
what these tests pin down.
"""

from __future__ import annotations

import pytest

from middlebox.scenario.workload import FILLER, Workload, request_body, request_tag, workload_file


@pytest.mark.parametrize(
    ("fields", "message"),
    [
        ({"requests": 0}, "requests and concurrency must be at least 1"),
        ({"concurrency": 0}, "requests and concurrency must be at least 1"),
        ({"max_tokens": 0}, "max_tokens must be at least 1"),
    ],
)
def test_a_workload_that_asks_for_nothing_is_refused_with_its_reason(
    fields: dict[str, int], message: str
) -> None:
    with pytest.raises(ValueError, match=message):
        Workload(**fields)  # type: ignore[arg-type]


def test_the_tag_names_scenario_client_and_index_in_brackets() -> None:
    assert request_tag("cut-mid", "openai", 3) == "[middlebox cut-mid/openai/3]"


def test_a_chat_request_puts_the_tagged_prompt_in_one_user_message() -> None:
    body = request_body(Workload(prompt_words=3, max_tokens=7), "qwen", "[t]")
    assert body == {
        "model": "qwen",
        "max_tokens": 7,
        "stream": True,
        "messages": [{"role": "user", "content": "[t] Explain how server-sent"}],
        "stream_options": {"include_usage": True},
    }


def test_a_completions_request_sends_a_prompt_and_no_messages() -> None:
    body = request_body(Workload(endpoint="completions", prompt_words=1), "m", "[t]")
    assert body["prompt"] == "[t] Explain"
    assert "messages" not in body


def test_the_filler_wraps_around_when_the_prompt_is_longer_than_it() -> None:
    words = len(FILLER) + 2
    text = request_body(Workload(prompt_words=words), "m", "[t]")["messages"][0]["content"]
    assert text.split()[1:] == FILLER + FILLER[:2]


def test_zero_prompt_words_leave_the_tag_alone_with_its_trailing_space() -> None:
    body = request_body(Workload(prompt_words=0, endpoint="completions"), "m", "[t]")
    assert body["prompt"] == "[t] "


@pytest.mark.parametrize(
    ("stream", "include_usage"), [(False, True), (True, False), (False, False)]
)
def test_usage_is_asked_for_only_on_a_stream_that_wants_it(
    stream: bool, include_usage: bool
) -> None:
    body = request_body(Workload(stream=stream, include_usage=include_usage), "m", "[t]")
    assert "stream_options" not in body
    assert body["stream"] is stream


def test_the_workload_file_staggers_requests_by_the_interval_and_tags_each_one() -> None:
    workload = Workload(
        requests=3,
        concurrency=2,
        interval=0.25,
        prompt_words=1,
        abandon_after_tokens=5,
        abandon_after_seconds=1.5,
    )
    document = workload_file(workload, "scn", "raw", "m")
    assert document["scenario"] == "scn" and document["concurrency"] == 2
    requests = document["requests"]
    assert [r["index"] for r in requests] == [0, 1, 2]
    assert [r["start_after"] for r in requests] == [0.0, 0.25, 0.5]
    assert [r["body"]["messages"][0]["content"] for r in requests] == [
        "[middlebox scn/raw/0] Explain",
        "[middlebox scn/raw/1] Explain",
        "[middlebox scn/raw/2] Explain",
    ]
    assert {r["endpoint"] for r in requests} == {"chat"}
    assert {(r["abandon_after_tokens"], r["abandon_after_seconds"]) for r in requests} == {(5, 1.5)}


def test_a_workload_that_never_abandons_says_so_with_none_per_request() -> None:
    (only,) = workload_file(Workload(requests=1), "s", "c", "m")["requests"]
    assert only["abandon_after_tokens"] is None and only["abandon_after_seconds"] is None
