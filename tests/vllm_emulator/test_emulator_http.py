"""The emulator over real sockets: vLLM's bytes, headers, errors, aborts, keep-alives,
in-band failures, resumable streams and cassettes (127.0.0.1, FAST timing, bounded)."""

from __future__ import annotations

import asyncio
import base64
import json
import re
import socket
import threading
import time
from pathlib import Path
from typing import Any

from vllm_emulator import wire
from vllm_emulator.cassette import record

MODEL = "middlebox/emulated-7b"


def chat(max_tokens: int | None = 8, **extra: Any) -> dict[str, Any]:
    body: dict[str, Any] = {"model": MODEL, "messages": [{"role": "user", "content": "Hi"}]}
    if max_tokens is not None:
        body["max_tokens"] = max_tokens
    return {**body, **extra}


def test_a_chat_stream_has_vllms_headers_one_chunk_per_frame_and_the_ledger_text(
    emulator: Any,
) -> None:
    server = emulator()
    body = chat(8, stream=True, stream_options={"include_usage": True})
    result = server.raw("/v1/chat/completions", body)
    assert result.complete
    head = result.head.decode().split("\r\n")
    assert head[0] == "HTTP/1.1 200 OK"
    assert [line.split(":")[0] for line in head[1:]] == [
        "date", "server", "content-type", "transfer-encoding"
    ]  # fmt: skip
    assert "content-type: text/event-stream; charset=utf-8" in head
    assert all(c.startswith(b"data: ") and c.endswith(b"\n\n") for c in result.chunks)
    assert all(c.count(b"data: ") == 1 for c in result.chunks)
    frames = result.data_frames()
    assert frames[-1] == "[DONE]"
    chunks = [json.loads(f) for f in frames[:-1]]
    assert chunks[0]["choices"][0]["delta"] == {"role": "assistant", "content": ""}
    assert chunks[-2]["choices"][0]["finish_reason"] == "length"
    assert chunks[-1]["usage"]["completion_tokens"] == 8
    text = "".join(c["choices"][0]["delta"]["content"] for c in chunks if c["choices"])
    (entry,) = server.ledger()
    assert entry["text"] == entry["planned_text"] == text
    assert entry["completion_tokens"] == 8 and len(entry["token_times"]) == 8
    assert entry["finish_reason"] == "length" and entry["status"] == 200
    assert entry["bytes_written"] == len(result.body)
    assert entry["id"] == chunks[0]["id"] and len(entry["request_id"]) == 16


def test_the_same_request_gives_the_same_text_streamed_or_not(emulator: Any) -> None:
    # `seed` pins vLLM's sampler per request; without it the second request draws anew
    server = emulator(seed=42)
    status, _, body = server.request("POST", "/v1/chat/completions", chat(12, seed=5))
    assert status == 200
    streamed = server.raw("/v1/chat/completions", chat(12, stream=True, seed=5))
    text = "".join(
        json.loads(f)["choices"][0]["delta"]["content"] for f in streamed.data_frames()[:-1]
    )
    assert json.loads(body)["choices"][0]["message"]["content"] == text


def test_headers_are_flushed_before_the_first_token(emulator: Any) -> None:
    server = emulator(prefill_overhead=0.4)
    start = time.time()
    result = server.raw("/v1/completions", {"prompt": "x", "max_tokens": 1, "stream": True})
    (entry,) = server.ledger()
    assert entry["first_token_at"] - start >= 0.35
    assert entry["write_times"][0] - start >= 0.35
    assert result.complete


def test_x_request_id_names_the_response_and_is_echoed_when_enabled(emulator: Any) -> None:
    server = emulator(enable_request_id_headers=True)
    status, headers, body = server.request(
        "POST", "/v1/completions", {"prompt": "x", "max_tokens": 2}, {"X-Request-Id": "abc123"}
    )
    assert status == 200 and json.loads(body)["id"] == "cmpl-abc123"
    assert headers["x-request-id"] == "abc123"
    assert server.ledger()[0]["request_id"] == "abc123"


def test_bad_requests_get_vllms_status_codes_and_bodies(emulator: Any) -> None:
    server = emulator(max_model_len=64, kv_num_blocks=8)
    status, _, body = server.request("POST", "/v1/chat/completions", chat(model="foo"))
    assert status == 404
    assert json.loads(body)["error"] == {
        "message": f"The model `foo` does not exist. Valid aliases: {MODEL}.",
        "type": "NotFoundError",
        "param": "model",
        "code": 404,
    }
    status, _, body = server.request("POST", "/v1/chat/completions", b"{not json")
    error = json.loads(body)["error"]
    assert status == 400 and error["type"] == "Bad Request" and error["code"] == 400
    assert error["message"].startswith("1 validation error:\n  {'type': 'json_invalid'")
    status, _, body = server.request("POST", "/v1/chat/completions", chat(max_tokens="many"))
    error = json.loads(body)["error"]
    assert status == 400 and error["param"] == "body.max_tokens"
    status, _, body = server.request("POST", "/v1/completions", {"prompt": "word " * 100})
    error = json.loads(body)["error"]
    assert status == 400 and error["param"] == "input_tokens"
    assert error["message"].startswith("This model's maximum context length is 64 tokens.")
    status, _, body = server.request("POST", "/v1/completions", {"prompt": "x", "max_tokens": 65})
    assert status == 400 and json.loads(body)["error"]["param"] == "max_tokens"
    status, _, body = server.request(
        "POST", "/v1/completions", b'{"prompt":"x"}', {"Content-Type": "text/plain"}
    )
    assert status == 400 and b"Only 'application/json' is allowed" in body
    status, _, body = server.request(
        "POST", "/v1/completions", {"prompt": "x", "stream_options": {"include_usage": True}}
    )
    assert status == 400 and b"Stream options can only be defined when `stream=True`." in body
    status, _, body = server.request("POST", "/v1/completions", {"prompt": "x", "n": 0})
    assert status == 400 and json.loads(body)["error"]["message"] == "n must be at least 1, got 0."
    assert [e["status"] for e in server.ledger()] == [404, 400, 400, 400, 400, 400, 400, 400]


def test_max_tokens_beyond_the_room_left_is_clamped_in_033_and_rejected_in_011(
    emulator: Any,
) -> None:
    prompt = {"prompt": " ".join(["word"] * 20), "max_tokens": 60}  # 20 prompt tokens, 64 max
    new = emulator(max_model_len=64, kv_num_blocks=8)
    status, _, body = new.request("POST", "/v1/completions", prompt)
    assert status == 200 and json.loads(body)["usage"]["completion_tokens"] == 44
    old = emulator(max_model_len=64, kv_num_blocks=8, profile="vllm-0.11")
    status, _, body = old.request("POST", "/v1/completions", prompt)
    assert status == 400
    assert json.loads(body)["error"]["message"] == (
        "'max_tokens' or 'max_completion_tokens' is too large: 60. This model's maximum "
        "context length is 64 tokens and your request has 20 input tokens (60 > 64 - 20)."
    )


def test_without_max_tokens_a_request_ends_at_a_seeded_eos(emulator: Any) -> None:
    server = emulator(natural_length_min=5, natural_length_max=9)
    result = server.raw("/v1/chat/completions", chat(None, stream=True))
    chunks = [json.loads(f) for f in result.data_frames()[:-1]]
    assert chunks[-1]["choices"][0]["finish_reason"] == "stop"
    assert chunks[-1]["choices"][0]["delta"] == {"content": ""}
    (entry,) = server.ledger()
    assert 6 <= entry["completion_tokens"] <= 10 and entry["finish_reason"] == "stop"


def test_stop_strings_trim_the_text_and_are_reported(emulator: Any) -> None:
    server = emulator()
    planned = json.loads(
        server.request("POST", "/v1/completions", {"prompt": "x", "max_tokens": 80, "seed": 1})[2]
    )
    full = planned["choices"][0]["text"]
    stop = full[40:43]
    _, _, body = server.request(
        "POST", "/v1/completions", {"prompt": "x", "max_tokens": 80, "stop": [stop], "seed": 1}
    )
    choice = json.loads(body)["choices"][0]
    assert choice["text"] == full[: full.find(stop)]
    assert choice["finish_reason"] == "stop" and choice["stop_reason"] == stop


def test_n_2_streams_interleave_choices_after_both_role_chunks(emulator: Any) -> None:
    server = emulator()
    result = server.raw("/v1/chat/completions", chat(4, n=2, stream=True))
    chunks = [json.loads(f) for f in result.data_frames()[:-1]]
    assert [c["choices"][0]["delta"].get("role") for c in chunks[:2]] == ["assistant"] * 2
    finishes = [c["choices"][0]["index"] for c in chunks if c["choices"][0]["finish_reason"]]
    assert sorted(finishes) == [0, 1]
    (entry,) = server.ledger()
    assert entry["completion_tokens"] == 8 and len(entry["texts"]) == 2


def test_the_011_profile_streams_completions_ending_in_usage_null(emulator: Any) -> None:
    server = emulator(profile="vllm-0.11")
    result = server.raw("/v1/completions", {"prompt": "x", "max_tokens": 2, "stream": True})
    first = result.data_frames()[0]
    assert first.endswith(',"usage":null}') and len(json.loads(first)["id"]) == len("cmpl-") + 32


def test_a_client_that_leaves_after_10_tokens_of_2000_aborts_within_one_itl(
    emulator: Any,
) -> None:
    itl = 0.02
    server = emulator(itl=itl)
    body = {"prompt": "x", "max_tokens": 2000, "stream": True}
    result = server.raw("/v1/completions", body, stop_after_frames=10)
    server.wait_until(lambda: server.ledger()[0]["aborted_at"] is not None)
    (entry,) = server.ledger()
    assert entry["finish_reason"] == "abort" and entry["finished_at"] is None
    assert entry["aborted_at"] - result.closed_at < itl
    assert entry["disconnected_at"] <= entry["aborted_at"]
    assert len([t for t in entry["token_times"] if t > result.closed_at]) <= 1
    assert len(result.data_frames()) >= 10 and entry["completion_tokens"] < 100
    generated = server.metric("vllm:generation_tokens_total")
    time.sleep(5 * itl)  # nothing more may be generated
    assert server.metric("vllm:generation_tokens_total") == generated == entry["completion_tokens"]
    assert server.metric("vllm:request_success_total", finished_reason="abort") == 0.0
    assert server.metric("vllm:e2e_request_latency_seconds_count") == 0.0
    assert server.metric("vllm:num_requests_running") == 0.0
    assert server.metric("vllm:kv_cache_usage_perc") == 0.0
    assert entry["wasted_tokens"] == entry["completion_tokens"] - entry["delivered_tokens"] <= 2


def test_without_abort_on_disconnect_generation_runs_to_max_tokens_for_nobody(
    emulator: Any,
) -> None:
    server = emulator(itl=0.0005, abort_on_disconnect=False)
    body = {"prompt": "x", "max_tokens": 2000, "stream": True}
    server.raw("/v1/completions", body, stop_after_frames=10)
    server.wait_until(lambda: server.ledger()[0]["finished_at"] is not None, timeout=15)
    (entry,) = server.ledger()
    assert entry["completion_tokens"] == 2000 and entry["finish_reason"] == "length"
    assert entry["aborted_at"] is None and entry["disconnected_at"] is not None
    # Tokens written before the server saw the close count as delivered, not wasted.
    assert entry["wasted_tokens"] == 2000 - entry["delivered_tokens"] > 1800
    assert server.metric("vllm:generation_tokens_total") == 2000


def test_a_half_close_after_the_request_is_a_disconnect_and_gets_nothing(emulator: Any) -> None:
    server = emulator(prefill_overhead=0.2)
    result = server.raw("/v1/chat/completions", chat(50, stream=True), half_close=True, timeout=3)
    assert result.body == b""
    server.wait_until(lambda: server.ledger()[0]["aborted_at"] is not None)
    (entry,) = server.ledger()
    assert entry["completion_tokens"] == 0 and entry["finish_reason"] == "abort"
    assert server.metric("vllm:generation_tokens_total") == 0.0


def test_a_non_streaming_request_is_aborted_when_its_client_leaves(emulator: Any) -> None:
    server = emulator(itl=0.01)
    server.raw("/v1/completions", {"prompt": "x", "max_tokens": 500}, timeout=0.2)
    server.wait_until(lambda: server.ledger()[0]["aborted_at"] is not None)
    assert server.ledger()[0]["completion_tokens"] < 100


def test_a_generation_failure_mid_stream_is_an_in_band_error_then_done(emulator: Any) -> None:
    server = emulator(fail_after_tokens=3)
    result = server.raw("/v1/chat/completions", chat(20, stream=True))
    assert result.complete
    assert result.chunks[-2] == wire.error_frame("vllm-0.33", "chat")
    assert result.chunks[-1] == wire.DONE
    (entry,) = server.ledger()
    assert entry["completion_tokens"] == 3 and entry["finish_reason"] == "error"
    assert server.metric("vllm:request_success_total", finished_reason="error") == 1.0
    status, _, body = server.request("POST", "/v1/chat/completions", chat(20))
    assert status == 500 and json.loads(body)["error"]["type"] == "InternalServerError"


def test_keep_alive_comments_fill_a_pause_and_stop_when_tokens_flow(emulator: Any) -> None:
    server = emulator(sse_keep_alive_interval=0.1, pauses=[{"after_tokens": 2,
                                                            "duration": 0.35}])  # fmt: skip
    result = server.raw("/v1/completions", {"prompt": "x", "max_tokens": 4, "stream": True})
    kinds = "".join("k" if c == wire.KEEP_ALIVE else "d" for c in result.chunks)
    # Two tokens, a 0.35 s pause filled every 0.1 s, then the rest (a lagging writer
    # may merge the last tokens into one frame, as vLLM does) and [DONE].
    assert kinds.startswith("ddkk") and kinds.rstrip("d").endswith("k")
    assert 2 <= kinds.count("k") <= 3 and result.chunks[-1] == wire.DONE


def test_requests_beyond_max_num_seqs_queue_and_metrics_show_it(emulator: Any) -> None:
    server = emulator(max_num_seqs=1, itl=0.01)
    results = []
    threads = [
        threading.Thread(
            target=lambda: results.append(
                server.request("POST", "/v1/completions", {"prompt": "x", "max_tokens": 20})
            )
        )
        for _ in range(2)
    ]
    for thread in threads:
        thread.start()
    server.wait_until(lambda: len(server.ledger()) == 2)
    assert server.metric("vllm:num_requests_waiting") == 1.0
    assert server.metric("vllm:num_requests_running") == 1.0
    for thread in threads:
        thread.join(10)
    first, second = sorted(server.ledger(), key=lambda e: e["first_token_at"])
    assert second["first_token_at"] >= first["finished_at"]
    assert server.metric("vllm:request_success_total", finished_reason="length") == 2.0
    assert server.metric("vllm:request_queue_time_seconds_count") == 2.0


def test_models_health_version_and_metrics_look_like_vllm(emulator: Any) -> None:
    server = emulator()
    status, _, body = server.request("GET", "/v1/models")
    assert status == 200 and json.loads(body)["data"][0]["id"] == MODEL
    assert server.request("GET", "/health")[:3:2] == (200, b"")
    assert json.loads(server.request("GET", "/version")[2]) == {"version": "0.33.0"}
    text = server.request("GET", "/metrics")[2].decode()
    labels = f'engine="0",model_name="{MODEL}"'
    for line in [
        "# TYPE vllm:num_requests_running gauge",
        "# TYPE vllm:generation_tokens_total counter",
        "# TYPE vllm:time_to_first_token_seconds histogram",
        f'vllm:request_success_total{{engine="0",finished_reason="abort",model_name="{MODEL}"}} 0.0',  # noqa: E501
        f'vllm:time_to_first_token_seconds_bucket{{engine="0",le="0.08",model_name="{MODEL}"}} 0.0',
        f'vllm:inter_token_latency_seconds_bucket{{engine="0",le="+Inf",model_name="{MODEL}"}} 0.0',
        f"vllm:generation_tokens_total{{{labels}}} 0.0",
        f'vllm:num_requests_waiting_by_reason{{{labels},reason="capacity"}} 0.0',
        "# TYPE vllm:prefix_cache_queries_total counter",
    ]:
        assert line in text.splitlines()


def test_reset_clears_the_ledger_and_counters(emulator: Any) -> None:
    server = emulator()
    server.request("POST", "/v1/completions", {"prompt": "x", "max_tokens": 3})
    assert server.metric("vllm:generation_tokens_total") == 3.0
    assert server.request("POST", "/emulator/reset")[0] == 200
    assert server.ledger() == [] and server.metric("vllm:generation_tokens_total") == 0.0


def test_a_resumable_stream_replays_from_last_event_id_and_continues(emulator: Any) -> None:
    server = emulator(resumable=True, itl=0.01)
    body = {"prompt": "x", "max_tokens": 40, "stream": True}
    first = server.raw("/v1/completions", body, stop_after_frames=5)
    stream_id = next(
        line.split(": ")[1] for line in first.head.decode().split("\r\n")
        if line.startswith("x-stream-id")
    )  # fmt: skip
    events = [c for c in first.chunks if c.startswith(b"id: ")]
    last_id = int(events[-1].split(b"\n")[0][4:])
    assert last_id == len(events)
    rest = server.raw(f"/v1/streams/{stream_id}", None, {"Last-Event-ID": str(last_id)},
                      method="GET")  # fmt: skip
    assert rest.complete and rest.chunks[0].startswith(f"id: {last_id + 1}\n".encode())
    texts = [
        json.loads(c.split(b"data: ", 1)[1])["choices"][0]["text"]
        for c in first.chunks + rest.chunks
        if b'"choices":[{' in c
    ]
    (entry,) = server.ledger()
    assert "".join(texts) == entry["planned_text"] == entry["text"]
    assert entry["resumed_from"] == last_id and entry["aborted_at"] is None
    assert entry["wasted_tokens"] == 0
    status, _, error = server.request("GET", "/v1/streams/nope")
    assert status == 404 and json.loads(error)["error"]["param"] == "stream_id"


def test_the_original_post_resent_with_stream_id_and_last_event_id_resumes_too(
    emulator: Any,
) -> None:
    server = emulator(resumable=True, itl=0.01)
    body = {"prompt": "x", "max_tokens": 30, "stream": True}
    first = server.raw("/v1/completions", body, stop_after_frames=4)
    stream_id = next(
        line.split(": ")[1] for line in first.head.decode().split("\r\n")
        if line.startswith("x-stream-id")
    )  # fmt: skip
    rest = server.raw("/v1/completions", body, {"X-Stream-Id": stream_id, "Last-Event-ID": "2"})
    assert rest.complete and rest.chunks[0].startswith(b"id: 3\n")
    (entry,) = server.ledger()  # one generation, resumed; no second request
    assert entry["resumed_from"] == 2 and entry["resumes"] == 1


def test_a_resume_older_than_the_buffer_is_refused_clearly(emulator: Any) -> None:
    server = emulator(resumable=True, resume_buffer_size=1000)
    # A live reader that lags past so small a buffer is cut (handlers._Evicted: a loaded
    # machine woke the emulator late, its overdue tokens came at once and evicted frames
    # not written yet; CI 2026-12-01 22:47). The stream id is in the head either way, and
    # a resumable stream runs on to its end without its reader.
    first = server.raw("/v1/completions", {"prompt": "x", "max_tokens": 30, "stream": True})
    found = re.search(rb"(?i)\r\nx-stream-id: (\S+)", first.head)
    assert first.status == 200 and found is not None
    server.wait_until(lambda: bool(server.ledger()[0]["finished_at"]))
    status, _, body = server.request(
        "GET", f"/v1/streams/{found.group(1).decode()}", headers={"Last-Event-ID": "1"}
    )
    assert status == 409 and b"no longer buffered" in body


def test_a_cassette_is_replayed_with_its_status_headers_bytes_and_timing(
    emulator: Any, tmp_path: Path
) -> None:
    writes = [b'data: {"a":1}\n\n', b'data: {"b":"\xc3\xa9"}\n\n', b"data: [DONE]\n\n"]
    cassette = {
        "status": 200,
        "headers": [["content-type", "text/event-stream; charset=utf-8"],
                    ["transfer-encoding", "chunked"]],
        "writes": [[0.0, base64.b64encode(writes[0]).decode()],
                   [0.2, base64.b64encode(writes[1]).decode()],
                   [0.25, base64.b64encode(writes[2]).decode()]],
    }  # fmt: skip
    path = tmp_path / "cassette.json"
    path.write_text(json.dumps(cassette))
    server = emulator(cassette=str(path))
    result = server.raw("/v1/chat/completions", chat(5, stream=True))
    assert result.chunks == writes
    assert 0.15 <= result.times[1] - result.times[0] <= 0.4
    (entry,) = server.ledger()
    assert entry["cassette"] is True and entry["bytes_written"] == sum(map(len, writes))


def test_a_cassette_recorded_from_a_server_replays_the_same_chunks(
    emulator: Any, tmp_path: Path
) -> None:
    source = emulator(itl=0.01)
    body = chat(6, stream=True, stream_options={"include_usage": True})
    cassette = asyncio.run(record(source.url + "/v1/chat/completions", body))
    recorded = [base64.b64decode(data) for _, data in cassette["writes"]]
    assert cassette["status"] == 200 and recorded[-1] == wire.DONE
    assert all(chunk.count(b"data: ") == 1 for chunk in recorded)  # one frame per chunk
    path = tmp_path / "recorded.json"
    path.write_text(json.dumps(cassette))
    replay = emulator(cassette=str(path)).raw("/v1/chat/completions", body)
    assert replay.chunks == recorded
    assert b"content-type: text/event-stream; charset=utf-8" in replay.head


def test_stale_gauges_keep_the_last_engine_step_after_everything_aborts(emulator: Any) -> None:
    server = emulator(stale_gauges=True, itl=0.01)
    server.raw("/v1/completions", {"prompt": "x", "max_tokens": 500, "stream": True},
               stop_after_frames=3)  # fmt: skip
    server.wait_until(lambda: server.ledger()[0]["aborted_at"] is not None)
    # vllm-project/vllm#22545: no engine step runs after a mass abort, so stats freeze.
    assert server.metric("vllm:num_requests_running") == 1.0
    assert server.metric("vllm:kv_cache_usage_perc") > 0.0
    fresh = emulator(itl=0.01)
    fresh.raw("/v1/completions", {"prompt": "x", "max_tokens": 500, "stream": True},
              stop_after_frames=3)  # fmt: skip
    fresh.wait_until(lambda: fresh.ledger()[0]["aborted_at"] is not None)
    assert fresh.metric("vllm:num_requests_running") == 0.0


def test_a_retryable_failure_is_a_503_frame_and_engine_death_has_its_own_message(
    emulator: Any,
) -> None:
    retry = emulator(fail_after_tokens=1, fail_kind="retryable")
    frames = retry.raw("/v1/completions", {"prompt": "x", "max_tokens": 5, "stream": True})
    assert frames.chunks[-2] == (
        b'data: {"error": {"message": "Request failed; please retry", "type": '
        b'"ServiceUnavailableError", "param": null, "code": 503}}\n\n'
    )
    status, _, _ = retry.request("POST", "/v1/completions", {"prompt": "x", "max_tokens": 5})
    assert status == 503
    dead = emulator(fail_after_tokens=1, fail_kind="engine_dead")
    frames = dead.raw("/v1/chat/completions", chat(5, stream=True))
    error = json.loads(frames.chunks[-2][6:])["error"]
    assert error["message"] == "The server had an error while processing your request."
    assert error["code"] == 500


def test_a_full_queue_gets_vllms_503_before_any_stream(emulator: Any) -> None:
    server = emulator(max_num_seqs=1, max_num_queued_reqs=1, itl=0.005)
    body = {"prompt": "x", "max_tokens": 100}
    threads = [threading.Thread(target=server.request, args=("POST", "/v1/completions", body))
               for _ in range(2)]  # fmt: skip
    for thread in threads:
        thread.start()
    server.wait_until(lambda: len(server.ledger()) == 2)
    status, _, payload = server.request("POST", "/v1/completions", {**body, "stream": True})
    assert status == 503
    assert json.loads(payload)["error"] == {
        "message": wire.QUEUE_FULL_MESSAGE, "type": "Service Unavailable", "param": None,
        "code": 503,
    }  # fmt: skip
    for thread in threads:
        thread.join(10)


def test_an_http_1_0_request_streams_close_delimited_as_uvicorn_does(emulator: Any) -> None:
    """nginx talks HTTP/1.0 upstream by default; uvicorn then ends the body by closing
    (RFC 9112 §6.3 rule 8) instead of chunking, which HTTP/1.0 does not have."""
    server = emulator(itl=0.005)
    body = json.dumps({"prompt": "x", "max_tokens": 5, "stream": True}).encode()
    request = (
        b"POST /v1/completions HTTP/1.0\r\nHost: 127.0.0.1\r\n"
        b"Content-Type: application/json\r\nContent-Length: %d\r\n\r\n" % len(body)
    )
    with socket.create_connection(("127.0.0.1", server.port), timeout=10) as sock:
        sock.sendall(request + body)
        received = b""
        while chunk := sock.recv(65536):
            received += chunk
    head, _, payload = received.partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.0 200") or head.startswith(b"HTTP/1.1 200")
    assert b"transfer-encoding" not in head.lower()
    assert payload.startswith(b"data: {") and payload.endswith(b"data: [DONE]\n\n")
