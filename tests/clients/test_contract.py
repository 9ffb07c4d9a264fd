"""The shared client contract and the resilient client's decisions, without sockets.

Wire-level behaviour is in test_builtin_clients.py; here are the pieces it rests on: the
SSE reading of `raw` and `resilient` at every split point, chunk extraction for each
vLLM version's frames, workload validation, atomic results, the request loop's
concurrency and abandonment, and the resilient client's retry and resume rules.
"""

from __future__ import annotations

import asyncio
import json
import os
import random
import stat
from datetime import UTC, datetime
from email.utils import format_datetime
from pathlib import Path
from typing import Any

import httpx
import pytest

from middlebox import clients
from middlebox.clients import available_clients, raw, resilient
from middlebox.clients.contract import (
    ChunkInfo,
    ClientEnv,
    ContractError,
    Recorder,
    RequestSpec,
    Workload,
    chunk_info,
    non_stream_info,
    run_client,
    run_workload,
    write_result,
)
from middlebox.clients.resilient import (
    InBandError,
    Policy,
    ResumeState,
    StatusError,
    TruncatedStream,
    _retry_delay,
    parse_retry_after,
)
from middlebox.core.sse import SseFramer

FRAMES = (
    b'data: {"choices":[{"index":0,"delta":{"content":"Gr\xc3\xbc\xc3\x9fe"}}]}\r\n\r\n'
    b": keep-alive\n\n"
    b'id: 7\ndata: {"choices":[{"index":0,"delta":{"content":" \xe6\x9d\xb1\xe4\xba\xac"},'
    b'"finish_reason":"stop"}]}\r\r'
    b"data: [DONE]\n\n"
)


def shown_by_raw(*reads: bytes) -> Recorder:
    rec = Recorder(RequestSpec(0, "chat", {}))
    framer = SseFramer()
    for data in reads:
        for piece in framer.feed(data):
            raw._show_line(rec, piece)
    return rec


def shown_by_resilient(*reads: bytes) -> Recorder:
    rec = Recorder(RequestSpec(0, "chat", {}))
    framer, resume = SseFramer(), ResumeState()
    for data in reads:
        for piece in framer.feed(data):
            if piece.event is not None:
                resilient._Attempt._on_event(piece.event, rec, resume)
    return rec


def test_raw_and_resilient_show_the_same_text_for_every_split_of_the_bytes() -> None:
    for show in (shown_by_raw, shown_by_resilient):
        for cut in range(len(FRAMES) + 1):
            rec = show(FRAMES[:cut], FRAMES[cut:])
            assert (rec.text, rec.finish_reason, rec.saw_done) == ("Grüße 東京", "stop", True)


def test_decoding_each_read_on_its_own_would_show_mojibake_where_the_clients_do_not() -> None:
    cut = FRAMES.index("東".encode()) + 1
    naive = FRAMES[:cut].decode("utf-8", "replace") + FRAMES[cut:].decode("utf-8", "replace")
    assert "\ufffd" in naive
    assert "\ufffd" not in shown_by_raw(FRAMES[:cut], FRAMES[cut:]).text
    assert "\ufffd" not in shown_by_resilient(FRAMES[:cut], FRAMES[cut:]).text


def test_resilient_surfaces_an_in_band_error_and_skips_replayed_events() -> None:
    resume = ResumeState()
    resume.record("7")
    rec = Recorder(RequestSpec(0, "chat", {}))
    event = SseFramer().feed(b'id: 7\ndata: {"choices":[{"index":0,"text":"again"}]}\n\n')[-1]
    assert event.event is not None
    resilient._Attempt._on_event(event.event, rec, resume)
    assert rec.text == ""  # id 7 was already shown before the reconnect
    with pytest.raises(InBandError, match="x"):
        shown_by_resilient(b'data: {"error":{"message":"x","code":500}}\n\n')


VLLM_CHAT = (
    '{"id":"chatcmpl-1","object":"chat.completion.chunk","created":1,"model":"m","choices":'
    '[{"index":0,"delta":{"content":" How"},"logprobs":null,"finish_reason":"length",'
    '"stop_reason":null,"token_ids":null,"weight_versions":null}],"kv_transfer_params":null}'
)
VLLM_USAGE = (
    '{"id":"chatcmpl-1","object":"chat.completion.chunk","created":1,"model":"m","choices":[],'
    '"usage":{"prompt_tokens":12,"total_tokens":15,"completion_tokens":3}}'
)
VLLM_TEXT = (
    '{"id":"cmpl-1","object":"text_completion","created":1,"model":"m","choices":[{"index":0,'
    '"text":" Paris","logprobs":null,"finish_reason":null,"stop_reason":null}],"usage":null}'
)


def test_chunk_info_reads_chat_completions_and_usage_chunks_of_vllm() -> None:
    assert chunk_info(json.loads(VLLM_CHAT)) == ChunkInfo(" How", "length")
    assert chunk_info(json.loads(VLLM_USAGE)) == ChunkInfo(
        usage={"prompt_tokens": 12, "total_tokens": 15, "completion_tokens": 3}
    )
    assert chunk_info(json.loads(VLLM_TEXT)) == ChunkInfo(" Paris")
    other_choice = {"choices": [{"index": 1, "delta": {"content": "x"}, "finish_reason": "stop"}]}
    assert chunk_info(other_choice) == ChunkInfo()
    assert chunk_info([1, 2]) == ChunkInfo()


@pytest.mark.parametrize(
    "frame",
    [
        # 0.33.0 chat (compact), 0.33.0 completions (spaced), <= 0.10.0 (flat "object")
        '{"error":{"message":"Internal server error","type":"InternalServerError",'
        '"param":null,"code":500}}',
        '{"error": {"message": "Internal server error", "type": "InternalServerError", '
        '"param": null, "code": 500}}',
        '{"error": {"object": "error", "message": "Internal server error", '
        '"type": "BadRequestError", "param": null, "code": 500}}',
    ],
)
def test_in_band_error_frames_of_every_vllm_version_are_recognised(frame: str) -> None:
    assert chunk_info(json.loads(frame)) == ChunkInfo(error="Internal server error", error_code=500)


def test_a_non_streaming_body_is_one_piece_with_its_finish_reason_and_usage() -> None:
    body = {
        "choices": [{"index": 0, "message": {"content": "Hi!"}, "finish_reason": "stop"}],
        "usage": {"completion_tokens": 2},
    }
    assert non_stream_info(body) == ChunkInfo("Hi!", "stop", {"completion_tokens": 2})


def request(index: int = 0, **extra: Any) -> dict[str, Any]:
    return {"index": index, "endpoint": "chat", "body": {"model": "m", "stream": True}, **extra}


@pytest.mark.parametrize(
    ("workload", "complaint"),
    [
        ({"requests": [request(endpoint="embeddings")]}, "endpoint"),
        ({"requests": [request(0), request(0)]}, "unique"),
        ({"requests": [request(abandon_after_tokens=0)]}, "abandon_after_tokens"),
        ({"requests": [request(abandon_after_seconds=-1)]}, "abandon_after_seconds"),
        ({"requests": [{"index": 0, "endpoint": "chat", "body": []}]}, "body"),
        ({"concurrency": 0, "requests": []}, "concurrency"),
        ({"requests": {}}, "requests"),
    ],
)
def test_a_workload_that_breaks_the_contract_is_refused_with_a_reason(
    workload: dict[str, Any], complaint: str
) -> None:
    with pytest.raises(ContractError, match=complaint):
        Workload.from_json(workload)


def test_the_environment_must_name_the_base_url_workload_and_result() -> None:
    with pytest.raises(ContractError, match="OPENAI_BASE_URL, MIDDLEBOX_RESULT"):
        ClientEnv.from_environ({"MIDDLEBOX_WORKLOAD": "w.json"})
    env = ClientEnv.from_environ(
        {"OPENAI_BASE_URL": "http://h:1/v1/", "MIDDLEBOX_WORKLOAD": "w", "MIDDLEBOX_RESULT": "r"}
    )
    assert (env.url("chat"), env.url("completions")) == (
        "http://h:1/v1/chat/completions",
        "http://h:1/v1/completions",
    )
    assert env.api_key == "EMPTY"


def test_a_client_without_its_environment_exits_2_and_writes_nothing(tmp_path: Path) -> None:
    async def never(spec: RequestSpec, rec: Recorder) -> None:
        raise AssertionError("no request may run")

    result = tmp_path / "result.json"
    environ = {"MIDDLEBOX_RESULT": str(result), "MIDDLEBOX_WORKLOAD": str(tmp_path / "none")}
    assert run_client("x", lambda env: never, environ) == 2  # type: ignore[arg-type,return-value]
    assert not result.exists()


def test_the_result_is_written_whole_under_its_name_with_no_temp_file_left(
    tmp_path: Path,
) -> None:
    rec = Recorder(RequestSpec(3, "chat", {}), started_at=1.0, ended_at=2.0, attempts=1)
    rec.show("héllo")
    path = tmp_path / "result.json"
    write_result(str(path), "mine", [rec])
    assert os.listdir(tmp_path) == ["result.json"]
    data = json.loads(path.read_text(encoding="utf-8"))
    assert data["client"] == "mine"
    (entry,) = data["results"]
    assert (entry["index"], entry["text"], entry["chunks"][0][1]) == (3, "héllo", "héllo")


def run(workload: dict[str, Any], handler: Any) -> dict[int, Recorder]:
    records = asyncio.run(run_workload(Workload.from_json(workload), handler))
    return {r.spec.index: r for r in records}


def test_no_more_requests_than_the_concurrency_are_in_flight_at_once() -> None:
    in_flight: list[int] = []
    peak = 0

    async def handler(spec: RequestSpec, rec: Recorder) -> None:
        nonlocal peak
        in_flight.append(spec.index)
        peak = max(peak, len(in_flight))
        for _ in range(5):
            await asyncio.sleep(0)
        in_flight.remove(spec.index)

    run({"concurrency": 2, "requests": [request(i) for i in range(6)]}, handler)
    assert peak == 2


def test_requests_take_their_slots_in_start_order() -> None:
    order: list[int] = []

    async def handler(spec: RequestSpec, rec: Recorder) -> None:
        order.append(spec.index)

    starts = [0.002, 0.0, 0.001]
    run(
        {"concurrency": 1, "requests": [request(i, start_after=s) for i, s in enumerate(starts)]},
        handler,
    )
    assert order == [1, 2, 0]


def test_abandoning_after_n_tokens_unwinds_even_through_a_clients_except_exception() -> None:
    closed = []

    async def handler(spec: RequestSpec, rec: Recorder) -> None:
        try:
            for piece in ["a", "", "b", "c", "d"]:
                try:
                    rec.show(piece)
                except Exception:  # a client's own error handling must not swallow it
                    pytest.fail("Abandoned was caught as an Exception")
        finally:
            closed.append(True)

    (rec,) = run({"requests": [request(abandon_after_tokens=2)]}, handler).values()
    assert (rec.abandoned, rec.text, rec.error, closed) == (True, "ab", None, [True])


def test_what_a_handler_raises_becomes_the_error_it_surfaced() -> None:
    async def handler(spec: RequestSpec, rec: Recorder) -> None:
        rec.show("partial")
        if spec.index == 0:
            raise ConnectionResetError("peer reset")
        raise TimeoutError

    records = run({"requests": [request(0), request(1)]}, handler)
    assert records[0].error == "ConnectionResetError: peer reset"
    assert records[0].text == "partial"
    assert (records[1].error, records[1].abandoned) == ("TimeoutError", False)
    assert all(r.started_at <= r.ended_at for r in records.values())


def test_replacing_the_display_clears_text_and_chunks_together() -> None:
    rec = Recorder(RequestSpec(0, "chat", {}))
    rec.show("Hel")
    rec.saw_done = True
    rec.replace()
    rec.show("Hello")
    assert (rec.text, [p for _, p in rec.chunks], rec.saw_done) == ("Hello", ["Hello"], False)


def test_the_browsers_are_offered_only_where_chromium_is_installed(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(clients, "CHROMIUM_CANDIDATES", ("chromium",))
    monkeypatch.setenv("PATH", str(tmp_path))
    monkeypatch.delenv("MIDDLEBOX_CHROMIUM", raising=False)
    assert available_clients() == ["raw", "openai", "httpx-sse", "resilient"]
    fake = tmp_path / "chromium"
    fake.write_text("#!/bin/sh\n")
    fake.chmod(fake.stat().st_mode | stat.S_IXUSR)
    assert available_clients() == [
        "raw", "openai", "httpx-sse", "resilient", "browser", "browser-eventsource"
    ]  # fmt: skip


# --- the resilient client's rules ------------------------------------------------------


def test_retry_after_is_read_as_seconds_milliseconds_or_an_http_date() -> None:
    now = 1_800_000_000.0
    date = format_datetime(datetime.fromtimestamp(now + 7, UTC), usegmt=True)
    assert parse_retry_after(httpx.Headers({"retry-after": "3"}), now) == 3.0
    assert (
        parse_retry_after(httpx.Headers({"retry-after-ms": "250", "retry-after": "9"}), now) == 0.25
    )
    assert parse_retry_after(httpx.Headers({"retry-after": date}), now) == pytest.approx(7.0)
    assert parse_retry_after(httpx.Headers({"retry-after": "soon"}), now) is None
    assert parse_retry_after(httpx.Headers(), now) is None


def test_what_resilient_retries_and_how_long_it_waits() -> None:
    policy = Policy(backoff_base=0.5, backoff_cap=8.0, max_retry_after=60.0)
    rng = random.Random(0)
    assert _retry_delay(StatusError(429, "", 2.0), 1, policy, rng) == 2.0
    assert _retry_delay(StatusError(503, "", 120.0), 1, policy, rng) is None  # too long a wait
    assert _retry_delay(StatusError(400, "", None), 1, policy, rng) is None
    assert _retry_delay(StatusError(404, "", 1.0), 1, policy, rng) is None
    assert _retry_delay(InBandError("boom", 500), 1, policy, rng) is None
    assert _retry_delay(ValueError("bug"), 1, policy, rng) is None
    for failures, ceiling in [(1, 0.5), (2, 1.0), (3, 2.0), (6, 8.0), (9, 8.0)]:
        for exc in [TruncatedStream(), InBandError("retry", 503), StatusError(500, "", None)]:
            delay = _retry_delay(exc, failures, policy, rng)
            assert delay is not None and ceiling / 2 <= delay <= ceiling


def test_replayed_events_at_or_before_the_last_id_are_recognised() -> None:
    state = ResumeState()
    for event_id in ["1", "2", "3"]:
        state.record(event_id)
    assert [state.is_replay(i) for i in ["2", "3", "4", "10"]] == [True, True, False, False]
    opaque = ResumeState()
    opaque.record("s-42:a")
    assert (opaque.is_replay("s-42:a"), opaque.is_replay("s-42:b")) == (True, False)


def test_the_resume_headers_echo_the_stream_id_under_the_servers_own_name() -> None:
    state = ResumeState()
    response = httpx.Response(200, headers=[("X-Vercel-Stream-Id", "abc"), ("Server", "x")])
    state.remember_stream_id(response)
    assert state.headers() == {}  # nothing to resume before an id was seen
    state.record("7")
    assert state.headers() == {"Last-Event-ID": "7", "X-Vercel-Stream-Id": "abc"}


def test_the_resilient_policy_reads_its_overrides_and_bounds_attempts_by_max_tokens() -> None:
    policy = Policy.from_env(
        {"MIDDLEBOX_RESILIENT_MAX_RETRIES": "5", "MIDDLEBOX_RESILIENT_STALL_TIMEOUT": "0.5"}
    )
    assert (policy.max_retries, policy.stall_timeout) == (5, 0.5)
    assert policy.attempt_bound({"max_tokens": 100}) == pytest.approx(30.0 + 100 * 0.2)
    assert policy.attempt_bound({"max_completion_tokens": 10}) == pytest.approx(32.0)


def test_the_resilient_client_pins_one_seed_per_logical_request_so_a_restart_redraws_nothing() -> (
    None
):
    spec = RequestSpec(
        index=3, endpoint="chat", body={"model": "m", "messages": [], "stream": True}
    )
    pinned = resilient.with_pinned_seed(spec)
    again = resilient.with_pinned_seed(spec)
    assert isinstance(pinned.body["seed"], int) and 0 <= pinned.body["seed"] < 2**31
    assert again.body["seed"] == pinned.body["seed"]  # every attempt sends the same seed
    other = RequestSpec(index=4, endpoint="chat", body={**spec.body, "max_tokens": 7})
    assert resilient.with_pinned_seed(other).body["seed"] != pinned.body["seed"]
    own = RequestSpec(index=3, endpoint="chat", body={**spec.body, "seed": 42})
    assert resilient.with_pinned_seed(own).body["seed"] == 42  # the caller's seed is kept
    assert "seed" not in spec.body  # the workload itself is not changed


def test_split_options_keeps_named_fields_and_sends_the_rest_as_extra_body() -> None:
    from middlebox.clients.contract import split_options

    body = {"model": "m", "messages": [], "max_tokens": 5, "top_k": 3, "ignore_eos": True}
    assert split_options(body, {"max_tokens"}, {"model", "messages"}) == {
        "max_tokens": 5,
        "extra_body": {"top_k": 3, "ignore_eos": True},
    }
    assert split_options({"max_tokens": 5}, {"max_tokens"}, set()) == {"max_tokens": 5}


LINGERING_CLIENT = """
import sys, threading, time
from contextlib import asynccontextmanager
from middlebox.clients.contract import run_client_and_leave

@asynccontextmanager
async def session(env):
    async def handle(spec, rec):
        rec.attempts += 1
    yield handle

# a library's exit hook: a non-daemon worker the interpreter would wait 60 s for
threading.Thread(target=time.sleep, args=(60,)).start()
run_client_and_leave("lingering", session)
"""


def test_run_client_and_leave_exits_once_the_result_is_written(tmp_path: Path) -> None:
    import subprocess
    import sys

    (tmp_path / "w.json").write_text(json.dumps({"requests": [{"index": 0, "body": {}}]}))
    environ = {
        **os.environ,
        "OPENAI_BASE_URL": "http://127.0.0.1:9/v1",
        "MIDDLEBOX_WORKLOAD": str(tmp_path / "w.json"),
        "MIDDLEBOX_RESULT": str(tmp_path / "r.json"),
    }
    # bounded: without os._exit the worker would hold the process for 60 s
    done = subprocess.run(
        [sys.executable, "-c", LINGERING_CLIENT], env=environ, timeout=30, capture_output=True
    )
    assert done.returncode == 0, done.stderr
    (entry,) = json.loads((tmp_path / "r.json").read_text())["results"]
    assert (entry["index"], entry["attempts"], entry["error"]) == (0, 1, None)
