"""The agent clients (`tools-naive`, `openai-tools`) and `resilient` on agent streams, run as
real processes against exact vLLM 0.32 tool-call, JSON and reasoning bytes.

Each request's `model` picks what the scripted server writes per attempt: a whole tool call,
one cut inside its arguments, one reset just after its finish chunk, a JSON answer cut
mid-object, a reasoning phase before the answer."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from middlebox.clients import BUILTIN_CLIENTS, SCENARIO_CLIENTS
from middlebox.clients.agent_stream import (
    ToolCallAccumulator,
    idempotency_key,
    is_complete_json,
    parse_partial_json,
    wants_json,
)
from middlebox.clients.contract import Recorder, RequestSpec, chunk_info
from tests.clients.wire_server import (
    CHAT_ID,
    DONE_FRAME,
    END_CHUNK,
    MODEL,
    SSE_HEAD,
    Behaviour,
    Conn,
    WireServer,
)

pytestmark = pytest.mark.e2e

CLIENTS = ["tools-naive", "openai-tools", "resilient"]
REPO = Path(__file__).resolve().parents[2]
ARGS = ['{"to": "ops', '@example.com", ', '"subject": "disk ', 'full"}']
COMPLETE = {"to": "ops@example.com", "subject": "disk full"}
ANSWER = '{"answer": "Paris", "confidence": 0.9}'
REASONING = ["The user", " wants", " a greeting."]


def frame(delta: dict[str, Any], finish: str | None = None) -> bytes:
    choice = {"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish}
    obj = {"id": CHAT_ID, "object": "chat.completion.chunk", "model": MODEL, "choices": [choice]}
    return b"data: " + json.dumps(obj, separators=(",", ":")).encode() + b"\n\n"


ROLE = frame({"role": "assistant", "content": ""})
NAME = frame(
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
)
FRAGMENTS = [
    frame({"content": None, "tool_calls": [{"index": 0, "function": {"arguments": a}}]})
    for a in ARGS
]
TOOL_FRAMES = [ROLE, NAME, *FRAGMENTS, frame({}, "tool_calls"), DONE_FRAME]
JSON_FRAMES = [ROLE, *(frame({"content": ANSWER[i : i + 6]}) for i in range(0, len(ANSWER), 6))]
JSON_FRAMES += [frame({}, "stop"), DONE_FRAME]
REASONING_FRAMES = [ROLE, *(frame({"reasoning": r}) for r in REASONING)]
REASONING_FRAMES += [frame({"content": "Hello"}), frame({"content": "!"}, "stop"), DONE_FRAME]


def stream(frames: list[bytes], cut_after: int | None = None) -> Behaviour:
    """Every attempt writes `frames`; with `cut_after`, the first attempt writes that many
    and is reset."""

    def behaviour(conn: Conn, attempt: int, headers: dict[str, str]) -> bool:
        conn.note(attempt=attempt, headers=headers)
        if not conn.write(SSE_HEAD + b"\r\n"):
            return False
        if cut_after is not None and attempt == 1:
            conn.chunks(frames[:cut_after])
            conn.rst()
            return False
        return conn.chunks(frames) and conn.write(END_CHUNK)

    return behaviour


BEHAVIOURS = {
    "tool-complete": stream(TOOL_FRAMES),
    "tool-cut-in-arguments": stream(TOOL_FRAMES, cut_after=4),  # role, name, 2 fragments
    "tool-reset-after-finish": stream(TOOL_FRAMES, cut_after=7),  # all but [DONE]
    "json-cut-mid-object": stream(JSON_FRAMES, cut_after=4),
    "reasoning": stream(REASONING_FRAMES),
}
TOOLS = [{"type": "function", "function": {"name": "send_email", "parameters": {}}}]


def workload() -> dict[str, Any]:
    requests = []
    for index, name in enumerate(BEHAVIOURS):
        body: dict[str, Any] = {
            "model": name,
            "stream": True,
            "max_tokens": 64,
            "messages": [{"role": "user", "content": "hi"}],
        }
        if name.startswith("tool"):
            body["tools"] = TOOLS
        if name.startswith("json"):
            body["response_format"] = {"type": "json_object"}
        requests.append({"index": index, "endpoint": "chat", "body": body})
    return {"scenario": "agent-wire", "concurrency": len(requests), "requests": requests}


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Any]]:
    tmp = tmp_path_factory.mktemp("agent-clients")
    (tmp / "workload.json").write_text(json.dumps(workload()))
    started = []
    for client in CLIENTS:
        server = WireServer(dict(BEHAVIOURS))
        env = {
            **os.environ,
            "OPENAI_BASE_URL": server.base_url,
            "OPENAI_API_KEY": "test-key",
            "MIDDLEBOX_WORKLOAD": str(tmp / "workload.json"),
            "MIDDLEBOX_RESULT": str(tmp / f"{client}.json"),
            "PYTHONPATH": str(REPO),
            "MIDDLEBOX_RESILIENT_BACKOFF_BASE": "0.05",
        }
        proc = subprocess.Popen(BUILTIN_CLIENTS[client], env=env, cwd=REPO, stderr=subprocess.PIPE)
        started.append((client, server, proc))
    found: dict[str, Any] = {}
    try:
        for client, server, proc in started:
            _, stderr = proc.communicate(timeout=30)
            assert proc.returncode == 0, stderr.decode()
            result = json.loads((tmp / f"{client}.json").read_text())
            names = list(BEHAVIOURS)
            found[client] = {names[r["index"]]: r for r in result["results"]}
            found[client]["_server"] = server
        yield found
    finally:
        for _, server, proc in started:
            if proc.poll() is None:
                proc.kill()
                proc.communicate()
            server.close()


def calls(entry: dict[str, Any]) -> list[Any]:
    return [(c["arguments"], c["idempotency_key"]) for c in entry.get("tool_calls_executed", [])]


def test_every_client_runs_a_whole_tool_call_once_with_its_complete_arguments(
    runs: dict[str, Any],
) -> None:
    for client in CLIENTS:
        entry = runs[client]["tool-complete"]
        assert [args for args, _ in calls(entry)] == [COMPLETE], client
        assert entry["tool_calls_executed"][0]["name"] == "send_email"
        assert entry["tool_calls_executed"][0]["index"] == 0


def test_a_cut_inside_the_arguments_makes_the_naive_client_run_a_repaired_prefix(
    runs: dict[str, Any],
) -> None:
    naive = runs["tools-naive"]["tool-cut-in-arguments"]
    # the prefix '{"to": "ops@example.com", ' repaired, then the retry's whole call: twice
    assert [args for args, _ in calls(naive)] == [{"to": "ops@example.com"}, COMPLETE]
    assert [key for _, key in calls(naive)] == [None, None]


def test_the_sdk_loop_raises_on_the_cut_and_runs_nothing(runs: dict[str, Any]) -> None:
    entry = runs["openai-tools"]["tool-cut-in-arguments"]
    assert calls(entry) == []
    assert entry["error"] and entry["error"].startswith("APIConnectionError")


def test_resilient_retries_the_cut_call_and_runs_it_once_under_a_stable_key(
    runs: dict[str, Any],
) -> None:
    entry = runs["resilient"]["tool-cut-in-arguments"]
    [(args, key)] = calls(entry)
    assert args == COMPLETE and key is not None and key.startswith("mbx-")
    assert entry["error"] is None and entry["attempts"] == 2
    again = runs["resilient"]["tool-complete"]
    assert calls(again)[0][1] != key  # one key per logical request, not one for every call


def test_a_reset_after_the_finish_chunk_makes_only_the_naive_client_send_the_email_twice(
    runs: dict[str, Any],
) -> None:
    assert [args for args, _ in calls(runs["tools-naive"]["tool-reset-after-finish"])] == [
        COMPLETE,
        COMPLETE,
    ]
    sdk = runs["openai-tools"]["tool-reset-after-finish"]
    assert [args for args, _ in calls(sdk)] == [COMPLETE]  # ran at finish_reason, then raised
    resilient = runs["resilient"]["tool-reset-after-finish"]
    assert [args for args, _ in calls(resilient)] == [COMPLETE]
    assert resilient["error"] is None and resilient["attempts"] == 1


def test_a_json_answer_cut_mid_object_is_acted_on_only_by_the_naive_client_half_made(
    runs: dict[str, Any],
) -> None:
    naive = runs["tools-naive"]["json-cut-mid-object"]["json_acted_on"]
    assert not is_complete_json(naive[0]["text"])
    assert naive[-1]["value"] == json.loads(ANSWER)  # the retry's whole answer came too
    resilient = runs["resilient"]["json-cut-mid-object"]
    assert [a["value"] for a in resilient["json_acted_on"]] == [json.loads(ANSWER)]
    assert resilient["text"] == ANSWER
    assert "json_acted_on" not in runs["openai-tools"]["json-cut-mid-object"]


def test_reasoning_is_shown_apart_by_resilient_in_the_answer_by_naive_and_never_by_the_sdk(
    runs: dict[str, Any],
) -> None:
    resilient = runs["resilient"]["reasoning"]
    assert resilient["text"] == "Hello!"
    assert "".join(piece for _, piece in resilient["reasoning"]) == "".join(REASONING)
    assert resilient["reasoning"][0][0] <= resilient["chunks"][0][0]
    assert runs["tools-naive"]["reasoning"]["text"] == "".join(REASONING) + "Hello!"
    sdk = runs["openai-tools"]["reasoning"]
    assert sdk["text"] == "Hello!" and "reasoning" not in sdk


def test_resilient_retries_with_the_same_body_so_the_key_it_derives_is_the_same(
    runs: dict[str, Any],
) -> None:
    server: WireServer = runs["resilient"]["_server"]
    first, second = server.requests_for("tool-cut-in-arguments")
    assert first.body == second.body  # the pinned seed: the key derives from it


# ---- the pure pieces -------------------------------------------------------------------


def test_the_accumulator_joins_fragments_by_index_and_keeps_the_first_id_and_name() -> None:
    acc = ToolCallAccumulator()
    for raw in TOOL_FRAMES[1:6]:
        acc.feed(chunk_info(json.loads(raw[6:-2])).tool_calls)
    [call] = acc.ordered()
    assert (call.index, call.id, call.name) == (0, "chatcmpl-tool-8acb8ad5e1dc2ddb", "send_email")
    assert call.parsed() == (True, COMPLETE)
    assert len(call.fragments) == 4


@pytest.mark.parametrize(
    ("prefix", "value"),
    [
        ('{"to": "ops', {"to": "ops"}),
        ('{"to": "ops@example.com", ', {"to": "ops@example.com"}),
        ('{"to": "a", "subj', {"to": "a"}),
        ('{"to": "a", "subject":', {"to": "a"}),
        ('{"n": [1, 2', {"n": [1, 2]}),
        ('{"s": "tab\\', {"s": "tab"}),
        ('{"s": "\\u00e', {"s": ""}),
        ("[", []),
    ],
)
def test_the_partial_json_parser_closes_what_a_cut_left_open(prefix: str, value: Any) -> None:
    assert parse_partial_json(prefix) == (True, value)
    assert not is_complete_json(prefix)


def test_the_partial_parser_gives_up_on_a_cut_literal_and_an_empty_text() -> None:
    assert parse_partial_json("[tru") == (False, None)
    assert parse_partial_json("") == (False, None)


def test_an_idempotency_key_is_stable_per_logical_call_and_differs_between_calls() -> None:
    key = idempotency_key("body", 0, "send_email")
    assert key == idempotency_key("body", 0, "send_email")
    assert len({key, idempotency_key("body", 1, "send_email"), idempotency_key("x", 0, "f")}) == 3


def test_a_json_answer_is_wanted_only_for_json_response_formats() -> None:
    assert wants_json({"response_format": {"type": "json_schema", "json_schema": {}}})
    assert not wants_json({"response_format": {"type": "text"}})
    assert not wants_json({})


def test_the_recorder_writes_agent_fields_only_when_the_client_has_some() -> None:
    rec = Recorder(RequestSpec(0, "chat", {}))
    assert not {"tool_calls_executed", "json_acted_on", "reasoning"} & set(rec.to_json())
    rec.show_reasoning("hmm")
    rec.executed_tool_call("f", {"a": 1}, "k", 0)
    rec.acted_on_json("{}", {})
    rec.replace()  # a restart forgets what was shown, never what was done
    out = rec.to_json()
    assert "reasoning" not in out
    assert out["tool_calls_executed"][0]["idempotency_key"] == "k"
    assert out["json_acted_on"][0]["value"] == {}


def test_chunk_info_reads_reasoning_under_both_field_names_and_tool_call_entries() -> None:
    new = chunk_info({"choices": [{"index": 0, "delta": {"reasoning": "a"}}]})
    old = chunk_info({"choices": [{"index": 0, "delta": {"reasoning_content": "b"}}]})
    assert (new.reasoning, old.reasoning, new.text) == ("a", "b", "")
    tools = chunk_info(json.loads(NAME[6:-2]))
    assert tools.tool_calls[0]["function"]["name"] == "send_email"


def test_agent_clients_are_registered_but_run_only_where_a_scenario_names_them() -> None:
    from middlebox.clients import DEFAULT_CLIENTS

    assert set(SCENARIO_CLIENTS) <= set(BUILTIN_CLIENTS)
    assert not set(SCENARIO_CLIENTS) & set(DEFAULT_CLIENTS)
    assert sys.executable in BUILTIN_CLIENTS["tools-naive"]


def test_the_naive_turn_runs_a_call_when_the_next_one_starts_and_the_rest_at_the_end() -> None:
    from middlebox.clients.tools_naive import _Turn

    rec = Recorder(RequestSpec(0, "chat", {}))
    turn = _Turn(rec)

    def entry(index: int, **function: str) -> dict[str, Any]:
        return {"index": index, "function": function}

    turn.on_chunk(
        chunk_info({"choices": [{"index": 0, "delta": {"tool_calls": [entry(0, name="a")]}}]})
    )
    turn.on_chunk(
        chunk_info(
            {"choices": [{"index": 0, "delta": {"tool_calls": [entry(0, arguments='{"x": 1')]}}]}
        )
    )
    assert rec.tool_calls_executed == []  # still streaming: nothing run yet
    turn.on_chunk(
        chunk_info(
            {
                "choices": [
                    {"index": 0, "delta": {"tool_calls": [entry(1, name="b", arguments='{"y"')]}}
                ]
            }
        )
    )
    assert [(c["name"], c["arguments"]) for c in rec.tool_calls_executed] == [("a", {"x": 1})]
    turn.finish()
    turn.finish()  # each call runs once per attempt, however often the end is seen
    assert [(c["name"], c["arguments"]) for c in rec.tool_calls_executed] == [
        ("a", {"x": 1}),
        ("b", {}),
    ]
