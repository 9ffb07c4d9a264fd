"""The emulator's Responses API and Anthropic Messages API over real sockets (127.0.0.1, FAST
timing, bounded): the events vLLM 0.32 sends, read with middlebox's own rule for what each
event means (middlebox.core.dialects), background responses that outlive their client,
resume with `starting_after`, cancel, the store switch, errors, and the ledger."""

from __future__ import annotations

import json
from typing import Any

import pytest

from middlebox.core.dialects import Dialect, EndKind, read
from middlebox.core.sse import SseFramer
from vllm_emulator import apis

MODEL = "middlebox/emulated-7b"
STORE = {"responses_store": True}
# vLLM 0.32's order of a Responses stream (tests/core/streams/vllm-0.32-responses-*.sse).
OPENING = ["response.created", "response.in_progress", "response.output_item.added",
           "response.content_part.added"]  # fmt: skip
CLOSING = ["response.output_text.done", "response.content_part.done",
           "response.output_item.done", "response.completed"]  # fmt: skip


def response(**extra: Any) -> dict[str, Any]:
    return {"model": MODEL, "input": "Hi", "max_output_tokens": 6, "ignore_eos": True, **extra}


def message(**extra: Any) -> dict[str, Any]:
    body = {"model": MODEL, "messages": [{"role": "user", "content": "Hi"}], "max_tokens": 6}
    return {**body, "ignore_eos": True, **extra}


def events(body: bytes) -> list[dict[str, Any]]:
    found = [p.event for p in SseFramer().feed(body) if p.event is not None]
    return [json.loads(e.data) for e in found]


def meanings(body: bytes, dialect: Dialect) -> list[Any]:
    return [read(p.event, dialect) for p in SseFramer().feed(body) if p.event is not None]


def test_a_responses_stream_has_vllms_events_in_order_and_the_ledger_text(emulator: Any) -> None:
    server = emulator()
    result = server.raw("/v1/responses", response(stream=True))
    assert result.complete and result.status == 200
    assert all(c.startswith(b"event: ") and c.count(b"\ndata: ") == 1 for c in result.chunks)
    got = events(result.body)
    kinds = [e["type"] for e in got]
    deltas = kinds.count("response.output_text.delta")
    assert kinds == OPENING + ["response.output_text.delta"] * deltas + CLOSING
    assert [e["sequence_number"] for e in got] == list(range(len(got)))
    assert b"[DONE]" not in result.body
    final = got[-1]["response"]
    assert final["status"] == "incomplete"
    assert final["incomplete_details"] == {"reason": "max_output_tokens"}
    assert final["usage"]["output_tokens"] == 6
    read_back = meanings(result.body, Dialect.RESPONSES)
    text = "".join(m.text for m in read_back if m.token is not None)
    assert read_back[-1].end is EndKind.LENGTH and read_back[-1].last
    (entry,) = server.ledger()
    assert entry["endpoint"] == "responses" and entry["id"] == final["id"]
    assert entry["text"] == text == final["output"][0]["content"][0]["text"]
    assert entry["completion_tokens"] == 6 and entry["max_tokens"] == 6
    assert entry["bytes_written"] == len(result.body) and not entry["background"]


def test_a_response_without_ignore_eos_ends_at_its_natural_length_completed(
    emulator: Any,
) -> None:
    server = emulator(natural_length_min=3, natural_length_max=3, natural_ends=True)
    status, _, body = server.request(
        "POST", "/v1/responses", response(ignore_eos=False, max_output_tokens=50)
    )
    answer = json.loads(body)
    assert status == 200 and answer["status"] == "completed"
    assert answer["incomplete_details"] is None and answer["usage"]["output_tokens"] == 4
    # The same request cut by its limit: incomplete.
    _, _, body = server.request("POST", "/v1/responses", response(max_output_tokens=2))
    assert json.loads(body)["incomplete_details"] == {"reason": "max_output_tokens"}


def test_without_natural_ends_a_limit_is_generated_in_full_as_chat_s_max_tokens(
    emulator: Any,
) -> None:
    """The default: a scenario's workload asks for the same generation in every API."""
    server = emulator(natural_length_min=3, natural_length_max=3)
    _, _, body = server.request(
        "POST", "/v1/responses", response(ignore_eos=False, max_output_tokens=50)
    )
    answer = json.loads(body)
    assert answer["status"] == "incomplete" and answer["usage"]["output_tokens"] == 50
    _, _, body = server.request("POST", "/v1/messages", message(max_tokens=40, ignore_eos=False))
    assert json.loads(body)["stop_reason"] == "max_tokens"
    assert json.loads(body)["usage"]["output_tokens"] == 40


def test_a_foreground_responses_stream_aborts_when_its_client_leaves(emulator: Any) -> None:
    server = emulator(itl=0.02)
    server.raw("/v1/responses", response(stream=True, max_output_tokens=200), stop_after_frames=6)
    server.wait_until(lambda: server.ledger()[0]["aborted_at"] is not None)
    (entry,) = server.ledger()
    assert entry["finish_reason"] == "abort" and entry["completion_tokens"] < 200


def test_a_background_stream_outlives_its_client_and_resumes_after_event_n(
    emulator: Any,
) -> None:
    server = emulator(**STORE, itl=0.005)
    first = server.raw(
        "/v1/responses",
        response(stream=True, background=True, max_output_tokens=60),
        stop_after_frames=8,
    )
    seen = events(first.body)[:8]
    response_id = seen[0]["response"]["id"]
    server.wait_until(lambda: server.ledger()[0]["finished_at"] is not None)
    (entry,) = server.ledger()
    # Generation went on after the client left: no abort, every token made.
    assert entry["background"] and entry["disconnected_at"] is not None
    assert entry["aborted_at"] is None and entry["completion_tokens"] == 60
    after = seen[-1]["sequence_number"]
    path = f"/v1/responses/{response_id}?stream=true&starting_after={after}"
    resumed = server.raw(path, None, method="GET")
    assert resumed.complete
    later = events(resumed.body)
    assert [e["sequence_number"] for e in later] == list(range(after + 1, after + 1 + len(later)))
    assert later[-1]["type"] == "response.completed"
    pieces = [e["delta"] for e in seen + later if e["type"] == "response.output_text.delta"]
    status, _, stored = server.request("GET", f"/v1/responses/{response_id}")
    assert status == 200
    assert "".join(pieces) == json.loads(stored)["output"][0]["content"][0]["text"]
    (entry,) = server.ledger()
    assert entry["resumes"] == 1 and entry["resumed_from"] == after


def test_a_resume_at_the_last_event_sends_the_headers_and_then_nothing(emulator: Any) -> None:
    # vLLM 0.32's reader returns only after writing response.completed, so one that starts
    # after it waits for an event that never comes (measured on 0.32.0; docs/emulator.md).
    server = emulator(**STORE)
    whole = server.raw("/v1/responses", response(stream=True, background=True))
    last = events(whole.body)[-1]
    path = (f"/v1/responses/{last['response']['id']}?stream=true"
            f"&starting_after={last['sequence_number']}")  # fmt: skip
    waiting = server.raw(path, None, method="GET", timeout=0.5)
    assert waiting.status == 200 and waiting.chunks == [] and not waiting.complete
    one_before = server.raw(
        path.replace(f"={last['sequence_number']}", f"={last['sequence_number'] - 1}"),
        None,
        method="GET",
    )
    assert one_before.complete and [e["type"] for e in events(one_before.body)] == [
        "response.completed"]  # fmt: skip


def test_a_cancel_stops_a_background_response_and_a_second_cancel_is_refused(
    emulator: Any,
) -> None:
    server = emulator(**STORE, itl=0.02)
    status, _, body = server.request(
        "POST", "/v1/responses", response(background=True, max_output_tokens=500)
    )
    queued = json.loads(body)
    assert status == 200 and queued["status"] == "queued" and queued["output"] == []
    response_id = queued["id"]
    assert json.loads(server.request("GET", f"/v1/responses/{response_id}")[2])["status"] == (
        "queued")  # fmt: skip
    status, _, body = server.request("POST", f"/v1/responses/{response_id}/cancel")
    assert status == 200 and json.loads(body)["status"] == "cancelled"
    (entry,) = server.ledger()
    assert entry["cancelled_at"] is not None and entry["aborted_at"] is not None
    assert entry["finish_reason"] == "abort" and entry["completion_tokens"] < 500
    assert json.loads(server.request("GET", f"/v1/responses/{response_id}")[2])["status"] == (
        "cancelled")  # fmt: skip
    status, _, body = server.request("POST", f"/v1/responses/{response_id}/cancel")
    assert (status, body) == (400, apis.cannot_cancel_body())
    status, _, body = server.request("POST", "/v1/responses/resp_nope/cancel")
    assert (status, body) == (404, apis.not_found_body("resp_nope"))


def test_a_reader_of_a_cancelled_background_stream_gets_its_events_and_then_waits(
    emulator: Any,
) -> None:
    server = emulator(**STORE, itl=0.02)
    first = server.raw(
        "/v1/responses",
        response(stream=True, background=True, max_output_tokens=500),
        stop_after_frames=6,
    )
    response_id = events(first.body)[0]["response"]["id"]
    assert server.request("POST", f"/v1/responses/{response_id}/cancel")[0] == 200
    path = f"/v1/responses/{response_id}?stream=true&starting_after=1"
    follow = server.raw(path, None, method="GET", timeout=0.5)
    kinds = [e["type"] for e in events(follow.body)]
    assert kinds[:2] == OPENING[2:] and "response.completed" not in kinds
    assert not follow.complete


def test_without_the_store_background_is_refused_and_nothing_is_kept(emulator: Any) -> None:
    # vLLM's default (VLLM_ENABLE_RESPONSES_API_STORE unset): `store` is dropped silently,
    # `background` with `store` (true by default) is a 400.
    server = emulator()
    status, _, body = server.request("POST", "/v1/responses", response(background=True))
    error = json.loads(body)["error"]
    assert status == 400 and error["message"] == apis.STORE_DISABLED_MESSAGE
    assert (error["type"], error["param"], error["code"]) == (
        "invalid_request_error", "background", 400)  # fmt: skip
    status, _, body = server.request("POST", "/v1/responses", response())
    response_id = json.loads(body)["id"]
    assert status == 200
    assert server.request("GET", f"/v1/responses/{response_id}")[0] == 404
    # With the store on, the same foreground response is kept once it ends.
    stored = emulator(**STORE)
    response_id = json.loads(stored.request("POST", "/v1/responses", response())[2])["id"]
    status, _, body = stored.request("GET", f"/v1/responses/{response_id}")
    assert status == 200 and json.loads(body)["id"] == response_id


def test_a_streamed_get_of_a_response_without_events_drops_after_the_headers(
    emulator: Any,
) -> None:
    server = emulator(**STORE)
    response_id = json.loads(server.request("POST", "/v1/responses", response())[2])["id"]
    dropped = server.raw(f"/v1/responses/{response_id}?stream=true", None, method="GET",
                         timeout=2)  # fmt: skip
    assert dropped.status == 200 and dropped.chunks == [] and not dropped.complete


def test_a_messages_stream_has_anthropics_events_and_stop_reasons(emulator: Any) -> None:
    server = emulator(natural_length_min=3, natural_length_max=3, natural_ends=True)
    result = server.raw("/v1/messages", message(stream=True))
    got = events(result.body)
    kinds = [e["type"] for e in got]
    deltas = kinds.count("content_block_delta")
    assert deltas >= 1 and kinds == ["message_start", "content_block_start"] + [
        "content_block_delta"] * deltas + ["content_block_stop", "message_delta",
                                           "message_stop"]  # fmt: skip
    assert got[-2]["delta"] == {"stop_reason": "max_tokens", "stop_sequence": None}
    assert got[-2]["usage"]["output_tokens"] == 6
    read_back = meanings(result.body, Dialect.MESSAGES)
    (entry,) = server.ledger()
    assert entry["endpoint"] == "messages" and entry["id"] == got[0]["message"]["id"]
    assert entry["text"] == "".join(m.text for m in read_back if m.token is not None)
    assert any(m.end is EndKind.LENGTH for m in read_back) and read_back[-1].last
    # Without ignore_eos and within max_tokens the answer ends by EOS: end_turn.
    _, _, body = server.request("POST", "/v1/messages", message(ignore_eos=False, max_tokens=50))
    answer = json.loads(body)
    assert answer["stop_reason"] == "end_turn" and answer["usage"]["output_tokens"] == 4
    assert list(answer) == ["id", "type", "role", "content", "model", "stop_reason", "usage"]


@pytest.mark.parametrize(
    ("extra", "message_text"),
    [
        ({"tools": [{"name": "f", "input_schema": {"type": "object"}}]},
         '"auto" tool choice requires --enable-auto-tool-choice and --tool-call-parser to be '
         "set"),
        ({"tools": [{"name": "f", "input_schema": {"type": "object"}}],
          "tool_choice": {"type": "tool", "name": "f"}},
         'tool_choice=function "f" requires --tool-call-parser to be set'),
        ({"model": "other"}, f"The model `other` does not exist. Valid aliases: {MODEL}."),
    ],
)  # fmt: skip
def test_messages_errors_are_anthropic_shaped(
    emulator: Any, extra: dict[str, Any], message_text: str
) -> None:
    server = emulator()
    status, _, body = server.request("POST", "/v1/messages", message(**extra))
    assert status in (400, 404)
    assert json.loads(body) == {"type": "error", "error": {
        "type": "NotFoundError" if status == 404 else "BadRequestError",
        "message": message_text}}  # fmt: skip
    (entry,) = server.ledger()
    assert entry["endpoint"] == "messages" and entry["status"] == status


def test_a_messages_request_without_max_tokens_is_a_validation_error(emulator: Any) -> None:
    server = emulator(profile="vllm-0.32")
    status, _, body = server.request("POST", "/v1/messages",
                                     {"model": MODEL, "messages": []})  # fmt: skip
    error = json.loads(body)["error"]
    assert status == 400 and error["type"] == "Bad Request"
    assert error["param"] == "body.max_tokens" and "'type': 'missing'" in error["message"]


def test_a_failure_breaks_a_responses_stream_off_and_ends_a_messages_one_with_an_error(
    emulator: Any,
) -> None:
    server = emulator(fail_after_tokens=3)
    broken = server.raw("/v1/responses", response(stream=True, max_output_tokens=20))
    kinds = [e["type"] for e in events(broken.body)]
    assert broken.status == 200 and not broken.complete
    assert "response.completed" not in kinds and "error" not in kinds
    ended = server.raw("/v1/messages", message(stream=True, max_tokens=20))
    got = events(ended.body)
    assert ended.complete and got[-1] == {
        "type": "error",
        "error": {"type": "internal_error", "message": "Internal server error"},
    }
    assert [m.end for m in meanings(ended.body, Dialect.MESSAGES)][-1] is EndKind.ERROR


def test_a_previous_response_id_must_be_in_the_store(emulator: Any) -> None:
    server = emulator(**STORE)
    status, _, body = server.request("POST", "/v1/responses",
                                     response(previous_response_id="resp_nope"))  # fmt: skip
    assert (status, body) == (404, apis.not_found_body("resp_nope"))
    first = json.loads(server.request("POST", "/v1/responses", response())[2])["id"]
    status, _, body = server.request("POST", "/v1/responses",
                                     response(previous_response_id=first))  # fmt: skip
    assert status == 200 and json.loads(body)["previous_response_id"] == first


def test_a_failed_background_response_is_failed_but_a_failed_background_stream_stays_queued(
    emulator: Any,
) -> None:
    server = emulator(**STORE, fail_after_tokens=2)
    response_id = json.loads(
        server.request("POST", "/v1/responses", response(background=True, max_output_tokens=9))[2]
    )["id"]
    server.wait_until(lambda: server.ledger()[0]["finished_at"] is not None)
    answer = json.loads(server.request("GET", f"/v1/responses/{response_id}")[2])
    assert answer["status"] == "failed" and answer["output"] == []
    streamed = server.raw(
        "/v1/responses", response(stream=True, background=True, max_output_tokens=9), timeout=0.5
    )
    stream_id = events(streamed.body)[0]["response"]["id"]
    assert not streamed.complete  # its reader waits for a response.completed that never comes
    answer = json.loads(server.request("GET", f"/v1/responses/{stream_id}")[2])
    assert answer["status"] == "queued"


def test_resumable_streams_stay_a_chat_pattern_a_responses_stream_keeps_vllms_bytes(
    emulator: Any,
) -> None:
    # `resumable: true` adds `id:` lines and /v1/streams/{id} to chat and completions; the
    # Responses API has its own resume (background, starting_after) and Messages none.
    server = emulator(resumable=True, itl=0.02)
    whole = server.raw("/v1/responses", response(stream=True))
    assert whole.complete and not any(c.startswith(b"id:") for c in whole.chunks)
    server.raw("/v1/messages", message(stream=True, max_tokens=200), stop_after_frames=4)
    server.wait_until(lambda: server.ledger()[1]["aborted_at"] is not None)
    assert [e["stream_id"] for e in server.ledger()] == [None, None]
