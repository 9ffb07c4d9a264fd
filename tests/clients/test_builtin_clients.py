"""The built-in clients, run as real processes against exact wire conditions.

One scripted server per client (tests/clients/wire_server.py) plays every condition at
once: each request's `model` picks a behaviour, and each client runs all of them in one
process with full concurrency. The four processes run in parallel, once per module, and
each test below reads one story out of their result files and the servers' logs.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from middlebox.clients import BUILTIN_CLIENTS, chromium_path
from tests.clients.wire_server import (
    DONE_FRAME,
    END_CHUNK,
    HELLO,
    HELLO_FRAMES,
    SSE_HEAD,
    Behaviour,
    Conn,
    Seen,
    WireServer,
    chat_frame,
    http_chunk,
    text_frame,
)
from tests.harness import needs

pytestmark = pytest.mark.e2e

FULL = "".join(HELLO)
CUT = "Hello,"  # what every cut stream below delivers before it breaks
CLIENTS = ["raw", "openai", "httpx-sse", "resilient"]
PROCESS_LIMIT_S = 20.0
RESILIENT_ENV = {
    "MIDDLEBOX_RESILIENT_STALL_TIMEOUT": "1.5",
    "MIDDLEBOX_RESILIENT_BACKOFF_BASE": "0.05",
    "MIDDLEBOX_RESILIENT_MAX_RETRIES": "2",
}


# --- behaviours: what the server writes, per attempt ------------------------------------


def complete(conn: Conn, attempt: int, headers: dict[str, str]) -> bool:
    return conn.write(SSE_HEAD + b"\r\n") and conn.chunks(HELLO_FRAMES) and conn.write(END_CHUNK)


def complete_text(conn: Conn, attempt: int, headers: dict[str, str]) -> bool:
    frames = [text_frame(" Paris"), text_frame(" is", None), text_frame(".", "stop"), DONE_FRAME]
    return conn.write(SSE_HEAD + b"\r\n") and conn.chunks(frames) and conn.write(END_CHUNK)


def cut_head(conn: Conn) -> None:
    """Headers, the role chunk and two tokens ("Hello,"), then the stream breaks."""
    conn.write(SSE_HEAD + b"\r\n")
    conn.chunks([chat_frame(None, role=True), chat_frame("Hello"), chat_frame(",")])


def clean_close(conn: Conn) -> None:
    """The body ends properly (terminal chunk, FIN) but without finish_reason or [DONE]:
    a proxy's or a serverless platform's cap that cuts between events."""
    conn.write(END_CHUNK)
    conn.fin()


def rst(conn: Conn) -> None:
    # Linux still delivers bytes queued before an RST, then ECONNRESET: no wait needed.
    conn.rst()


def truncated_chunked(conn: Conn) -> None:
    """FIN without the terminal `0\\r\\n\\r\\n`: an incomplete chunked body."""
    conn.fin()


def cut_once(cut: Callable[[Conn], None]) -> Behaviour:
    """The first attempt is cut after "Hello,"; retries get the complete stream."""

    def behaviour(conn: Conn, attempt: int, headers: dict[str, str]) -> bool:
        if attempt > 1:
            return complete(conn, attempt, headers)
        cut_head(conn)
        cut(conn)
        return False

    return behaviour


def always_clean_close(conn: Conn, attempt: int, headers: dict[str, str]) -> bool:
    cut_head(conn)
    clean_close(conn)
    return False


def rate_limited(conn: Conn, attempt: int, headers: dict[str, str]) -> bool:
    if attempt > 1:
        return complete(conn, attempt, headers)
    body = (
        b'{"error":{"message":"Too many requests","type":"RateLimitError","param":null,"code":429}}'
    )
    conn.write(
        b"HTTP/1.1 429 Too Many Requests\r\ncontent-type: application/json\r\n"
        b"retry-after: 1\r\ncontent-length: %d\r\n\r\n" % len(body) + body
    )
    return True


INBAND_ERROR = (
    b'data: {"error":{"message":"Internal server error","type":"InternalServerError",'
    b'"param":null,"code":500}}\n\n'
)


def inband_error(conn: Conn, attempt: int, headers: dict[str, str]) -> bool:
    """vLLM 0.33.0 chat after a GenerationError (vllm-wire.md §2.3)."""
    frames = [chat_frame(None, role=True), chat_frame("Hello"), INBAND_ERROR, DONE_FRAME]
    return conn.write(SSE_HEAD + b"\r\n") and conn.chunks(frames) and conn.write(END_CHUNK)


def retryable_inband_error_once(conn: Conn, attempt: int, headers: dict[str, str]) -> bool:
    """vLLM 0.33.0 completions-style frame for a RetryableRequestError (503), then a
    healthy stream on the retry."""
    if attempt > 1:
        return complete(conn, attempt, headers)
    frame = (
        b'data: {"error": {"message": "Request failed; please retry", '
        b'"type": "ServiceUnavailableError", "param": null, "code": 503}}\n\n'
    )
    frames = [chat_frame(None, role=True), chat_frame("Hello"), frame, DONE_FRAME]
    return conn.write(SSE_HEAD + b"\r\n") and conn.chunks(frames) and conn.write(END_CHUNK)


RESUMABLE_EVENTS = [b"id: %d\n" % (i + 1) + frame for i, frame in enumerate(HELLO_FRAMES[:-1])]


def resumable(conn: Conn, attempt: int, headers: dict[str, str]) -> bool:
    """Events carry ids; the stream is cut after id 3 ("Hello,"). A reconnect with
    Last-Event-ID replays from that id inclusive (at-least-once, as resumable-stream
    servers do), so a client must skip what it already showed."""
    conn.write(SSE_HEAD + b"x-stream-id: s-42\r\n\r\n")
    last = headers.get("last-event-id")
    if last is None and attempt == 1:
        conn.chunks(RESUMABLE_EVENTS[:3])
        conn.fin()
        return False
    start = int(last) - 1 if last else 0
    return conn.chunks([*RESUMABLE_EVENTS[start:], DONE_FRAME]) and conn.write(END_CHUNK)


UTF8_PIECES = ["Grüße", " aus", " 東京", " 🙂"]


def write_utf8_split(conn: Conn, gap: float) -> bool:
    """The UTF8_PIECES answer with each frame cut after its first multi-byte character's
    lead byte, the two halves sent as separate HTTP chunks `gap` seconds apart."""
    conn.write(SSE_HEAD + b"\r\n")
    frames = [chat_frame(None, role=True)]
    frames += [
        chat_frame(p, "stop" if i == len(UTF8_PIECES) - 1 else None)
        for i, p in enumerate(UTF8_PIECES)
    ]
    for frame in [*frames, DONE_FRAME]:
        cut = next((i + 1 for i, b in enumerate(frame) if b >= 0xC0), len(frame) // 2)
        conn.write(http_chunk(frame[:cut]))
        time.sleep(gap)
        conn.write(http_chunk(frame[cut:]))
    return conn.write(END_CHUNK)


def utf8_split(conn: Conn, attempt: int, headers: dict[str, str]) -> bool:
    """Each multi-byte frame is cut inside a character, across two HTTP chunks sent as
    separate TCP writes, as a re-chunking proxy may do."""
    return write_utf8_split(conn, 0.02)


SLOW_TOKENS = 100


def slow(conn: Conn, attempt: int, headers: dict[str, str]) -> bool:
    """A token every 20 ms; notes how many were written before the client left."""
    conn.write(SSE_HEAD + b"\r\n")
    conn.chunks([chat_frame(None, role=True)])
    for i in range(SLOW_TOKENS):
        if not conn.write(http_chunk(chat_frame(f" t{i}"))):
            conn.note(gone_after_token=i)
            return False
        time.sleep(0.02)
    conn.note(gone_after_token=None)
    return conn.chunks([chat_frame("", "length"), DONE_FRAME]) and conn.write(END_CHUNK)


def hang(conn: Conn, attempt: int, headers: dict[str, str]) -> bool:
    """One token, then silence until the client closes."""
    cut_head(conn)
    conn.note(closed_at=conn.wait_for_client_close(10.0))
    return False


def heartbeats(conn: Conn, attempt: int, headers: dict[str, str]) -> bool:
    """After the first token, 2 s of `: keep-alive` comments only (vLLM's
    --sse-keep-alive-interval, vllm-wire.md §5), then the rest of the answer."""
    conn.write(SSE_HEAD + b"\r\n")
    conn.chunks(HELLO_FRAMES[:2])
    conn.chunks([b": keep-alive\n\n"] * 10, gap=0.2)
    return conn.chunks(HELLO_FRAMES[2:]) and conn.write(END_CHUNK)


def stall_once(conn: Conn, attempt: int, headers: dict[str, str]) -> bool:
    if attempt > 1:
        return complete(conn, attempt, headers)
    return hang(conn, attempt, headers)


BEHAVIOURS: dict[str, Behaviour] = {
    "complete": complete,
    "complete-text": complete_text,
    "clean-close": cut_once(clean_close),
    "rst": cut_once(rst),
    "truncated-chunked": cut_once(truncated_chunked),
    "always-clean-close": always_clean_close,
    "rate-limited": rate_limited,
    "inband-error": inband_error,
    "resumable": resumable,
    "utf8-split": utf8_split,
    "slow": slow,
    "hang": hang,
    "stall-once": stall_once,
    "heartbeats": heartbeats,
    "inband-503-once": retryable_inband_error_once,
}

COMMON = [
    "complete",
    "complete-text",
    "clean-close",
    "rst",
    "truncated-chunked",
    "rate-limited",
    "inband-error",
    "resumable",
    "utf8-split",
    "slow",
    "hang",
    "heartbeats",
]
# Conditions only the resilient client acts on (a silent stall, a clean close, a
# retryable in-band error); the others would wait out their read timeout or see
# nothing new.
RESILIENT_ONLY = ["stall-once", "always-clean-close", "inband-503-once"]
ABANDON: dict[str, dict[str, Any]] = {
    "slow": {"abandon_after_tokens": 3},
    # Sooner than resilient's 1.5 s stall timeout, so it leaves rather than retries.
    "hang": {"abandon_after_seconds": 1.0},
}


def workload_for(client: str) -> dict[str, Any]:
    names = COMMON + (RESILIENT_ONLY if client == "resilient" else [])
    requests = []
    for index, name in enumerate(names):
        completions = name == "complete-text"
        body: dict[str, Any] = {"model": name, "stream": True, "max_tokens": 64}
        if completions:
            body["prompt"] = "The capital of France"
        else:
            body["messages"] = [{"role": "user", "content": "hi"}]
            body["stream_options"] = {"include_usage": True}
        requests.append(
            {
                "index": index,
                "endpoint": "completions" if completions else "chat",
                "body": body,
                "start_after": 0.0,
                "abandon_after_tokens": None,
                "abandon_after_seconds": None,
                **ABANDON.get(name, {}),
            }
        )
    return {"scenario": "wire-conditions", "concurrency": len(requests), "requests": requests}


REPO = Path(__file__).resolve().parents[2]


@dataclass
class Run:
    server: WireServer
    result: dict[str, Any]
    by_name: dict[str, dict[str, Any]]


def assert_left_after_three_tokens(run: Run) -> None:
    """The "slow" request (abandon_after_tokens 3): three pieces shown, then the client
    closed: the server's writes fail once it has (its kernel answers with RST), long
    before the stream's end."""
    r = run.by_name["slow"]
    assert (r["abandoned"], r["error"]) == (True, None)
    assert [piece for _, piece in r["chunks"]] == [" t0", " t1", " t2"]
    gone = run.server.first_note("slow")["gone_after_token"]
    assert gone is not None and gone < SLOW_TOKENS - 10


def assert_left_after_a_second_of_silence(run: Run) -> None:
    """The "hang" request (abandon_after_seconds 1): one attempt, left after 1 s, the
    connection closed; bounds loose enough for a loaded 2-core machine, far below the
    server's 10 s silence."""
    r = run.by_name["hang"]
    assert (r["abandoned"], r["error"], r["attempts"]) == (True, None, 1)
    assert CUT.startswith(r["text"])  # all of it, unless this machine is very busy
    assert 0.99 <= r["ended_at"] - r["started_at"] < 4.0
    closed_at = run.server.first_note("hang")["closed_at"]
    assert closed_at is not None and closed_at - r["started_at"] < 4.0


class Started:
    """A client process running a workload against its own wire server, given `limit_s`
    seconds to finish it."""

    limit_s = PROCESS_LIMIT_S

    def __init__(
        self, client: str, argv: list[str], tmp: Path, workload: dict[str, Any], cwd: Path = REPO
    ) -> None:
        self.client = client
        self.server = WireServer(BEHAVIOURS)
        self.names = {r["index"]: r["body"]["model"] for r in workload["requests"]}
        self.result_path = tmp / f"{client}.result.json"
        (tmp / f"{client}.workload.json").write_text(json.dumps(workload))
        env = {
            **os.environ,
            "OPENAI_BASE_URL": self.server.base_url,
            "OPENAI_API_KEY": "test-key",
            "MIDDLEBOX_WORKLOAD": str(tmp / f"{client}.workload.json"),
            "MIDDLEBOX_RESULT": str(self.result_path),
            "PYTHONPATH": str(REPO),
            **RESILIENT_ENV,
        }
        self.proc = subprocess.Popen(argv, env=env, cwd=cwd, stderr=subprocess.PIPE, text=True)

    def finish(self) -> Run:
        _, stderr = self.proc.communicate(timeout=self.limit_s)
        assert self.proc.returncode == 0, f"{self.client} exited {self.proc.returncode}: {stderr}"
        result = json.loads(self.result_path.read_text(encoding="utf-8"))
        by_name = {self.names[r["index"]]: r for r in result["results"]}
        return Run(self.server, result, by_name)

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.communicate()
        self.server.close()


def start_docs_example(tmp: Path) -> Started:
    """The user client shown in docs/clients.md, run as `--client-cmd` would run it."""
    doc = (REPO / "docs" / "clients.md").read_text(encoding="utf-8")
    block = doc.split("<!-- example-client:")[1].split("```python\n")[1].split("```")[0]
    (tmp / "my_client.py").write_text(block)
    workload = workload_for("example")
    workload["requests"] = [
        r for r in workload["requests"] if r["body"]["model"] in {"complete", "clean-close"}
    ]
    return Started("example", [sys.executable, "my_client.py"], tmp, workload, cwd=tmp)


@contextmanager
def finished(started: list[Started]) -> Iterator[dict[str, Run]]:
    """Each started client's run once it finished, by client name; every process stopped
    at the end, whatever happened."""
    try:
        yield {s.client: s.finish() for s in started}
    finally:
        for s in started:
            s.stop()


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Run]]:
    tmp = tmp_path_factory.mktemp("clients")
    started = [Started(c, BUILTIN_CLIENTS[c], tmp, workload_for(c)) for c in CLIENTS]
    started.append(start_docs_example(tmp))
    with finished(started) as done:
        yield done


def entry(runs: dict[str, Run], client: str, name: str) -> dict[str, Any]:
    return runs[client].by_name[name]


def resumable_run(runs: dict[str, Run], client: str) -> tuple[dict[str, Any], Seen, Seen]:
    """The client's `resumable` result and the two requests it made (the second resumes)."""
    first, second = runs[client].server.requests_for("resumable")
    return entry(runs, client, "resumable"), first, second


# --- the stories -------------------------------------------------------------------------


def assert_follows_the_contract(run: Run, client: str) -> None:
    """A result file as the contract has it (middlebox/clients/__init__.py): the client's
    name, one result per request in order, exactly the contract's fields, the text made of
    the pieces shown, each shown within its request's time."""
    assert run.result["client"] == client
    assert [r["index"] for r in run.result["results"]] == list(range(len(run.by_name)))
    for r in run.result["results"]:
        assert set(r) == {
            "index", "text", "finish_reason", "error", "usage", "chunks", "started_at",
            "ended_at", "attempts", "resumes", "saw_done", "abandoned",
        }  # fmt: skip
        assert r["text"] == "".join(piece for _, piece in r["chunks"])
        assert all(r["started_at"] <= t <= r["ended_at"] for t, _ in r["chunks"])


def test_every_result_file_follows_the_contract(runs: dict[str, Run]) -> None:
    for client in CLIENTS:
        run = runs[client]
        assert_follows_the_contract(run, client)
        for r in run.result["results"]:
            times = [t for t, _ in r["chunks"]]
            assert times == sorted(times)
            assert r["attempts"] >= 1


@pytest.mark.parametrize("client", CLIENTS)
def test_a_complete_vllm_stream_is_shown_whole_by_every_client(
    runs: dict[str, Run], client: str
) -> None:
    chat = entry(runs, client, "complete")
    assert (chat["text"], chat["finish_reason"], chat["error"]) == (FULL, "stop", None)
    assert chat["usage"] == {"prompt_tokens": 12, "total_tokens": 17, "completion_tokens": 5}
    assert chat["attempts"] == 1
    assert [piece for _, piece in chat["chunks"]] == HELLO
    # The SDK swallows [DONE] without telling its caller.
    assert chat["saw_done"] is (client != "openai")
    text = entry(runs, client, "complete-text")
    assert (text["text"], text["finish_reason"], text["error"]) == (" Paris is.", "stop", None)
    assert runs[client].server.requests_for("complete-text")[0].path == "/v1/completions"


def test_raw_reports_success_with_the_truncated_text_however_the_stream_was_cut(
    runs: dict[str, Run],
) -> None:
    for name in ["clean-close", "rst", "truncated-chunked", "resumable"]:
        r = entry(runs, "raw", name)
        assert (r["text"], r["error"], r["finish_reason"]) == (CUT, None, None), name
        assert (r["attempts"], r["saw_done"]) == (1, False), name


def test_openai_raises_on_an_rst_or_broken_body_but_ends_silently_on_a_clean_close(
    runs: dict[str, Run],
) -> None:
    for name in ["rst", "truncated-chunked", "resumable"]:
        r = entry(runs, "openai", name)
        # openai >= 3.57 wraps mid-stream transport errors; older releases raise httpx's.
        assert r["error"] is not None, name
        assert r["error"].split(":")[0] in {"APIConnectionError", "RemoteProtocolError"}, name
        assert (r["text"], r["attempts"]) == (CUT, 1), name
    silent = entry(runs, "openai", "clean-close")
    assert (silent["text"], silent["error"], silent["finish_reason"]) == (CUT, None, None)
    assert silent["attempts"] == 1


def test_httpx_sse_raises_on_a_broken_body_and_ends_silently_on_a_clean_close(
    runs: dict[str, Run],
) -> None:
    for name in ["rst", "truncated-chunked"]:
        r = entry(runs, "httpx-sse", name)
        assert r["error"] is not None and r["error"].startswith(
            ("RemoteProtocolError", "ReadError")
        )
        assert r["text"] == CUT
    silent = entry(runs, "httpx-sse", "clean-close")
    assert (silent["text"], silent["error"], silent["saw_done"]) == (CUT, None, False)


def test_resilient_detects_every_truncation_and_retries_to_the_whole_answer_once(
    runs: dict[str, Run],
) -> None:
    for name in ["clean-close", "rst", "truncated-chunked", "stall-once"]:
        r = entry(runs, "resilient", name)
        assert (r["text"], r["finish_reason"], r["error"]) == (FULL, "stop", None), name
        assert (r["attempts"], r["resumes"], r["saw_done"]) == (2, 0, True), name
        # The restart replaced the display: the cut attempt's pieces are not kept.
        assert [piece for _, piece in r["chunks"]] == HELLO, name
        assert len(runs["resilient"].server.requests_for(name)) == 2, name


def test_resilient_gives_up_after_its_bounded_retries_and_says_the_stream_was_truncated(
    runs: dict[str, Run],
) -> None:
    r = entry(runs, "resilient", "always-clean-close")
    assert r["error"] is not None and r["error"].startswith("TruncatedStream:")
    assert r["attempts"] == 3  # MIDDLEBOX_RESILIENT_MAX_RETRIES=2
    assert len(runs["resilient"].server.requests_for("always-clean-close")) == 3


def test_resilient_notices_a_silent_stall_within_its_stall_timeout(runs: dict[str, Run]) -> None:
    first, second = runs["resilient"].server.requests_for("stall-once")
    closed_at = runs["resilient"].server.first_note("stall-once")["closed_at"]
    assert closed_at is not None
    assert 1.45 < closed_at - first.at < 5.0  # stall timeout 1.5 s after the last byte
    assert second.at >= closed_at


@pytest.mark.parametrize("client", CLIENTS)
def test_keep_alive_comments_keep_a_quiet_stream_alive_for_every_client(
    runs: dict[str, Run], client: str
) -> None:
    r = entry(runs, client, "heartbeats")
    # 2 s without data, longer than resilient's 1.5 s stall timeout, but never silent.
    assert (r["text"], r["error"], r["attempts"]) == (FULL, None, 1)
    gaps = [b[0] - a[0] for a, b in zip(r["chunks"], r["chunks"][1:], strict=False)]
    assert max(gaps) > 1.0


def test_a_429_with_retry_after_is_waited_out_by_resilient_and_openai_but_not_raw(
    runs: dict[str, Run],
) -> None:
    for client in ["resilient", "openai"]:
        r = entry(runs, client, "rate-limited")
        assert (r["text"], r["error"], r["attempts"]) == (FULL, None, 2), client
        first, second = runs[client].server.requests_for("rate-limited")
        assert second.at - first.at >= 0.95, client  # Retry-After: 1
    raw = entry(runs, "raw", "rate-limited")
    assert (raw["text"], raw["error"], raw["attempts"]) == ("", None, 1)
    sse = entry(runs, "httpx-sse", "rate-limited")
    assert sse["error"] is not None and sse["error"].startswith("SSEError:")
    assert "application/json" in sse["error"]


def test_an_in_band_error_frame_is_surfaced_by_openai_and_resilient_and_hidden_by_raw(
    runs: dict[str, Run],
) -> None:
    assert entry(runs, "openai", "inband-error")["error"] == "APIError: Internal server error"
    resilient = entry(runs, "resilient", "inband-error")
    assert resilient["error"] == "InBandError: Internal server error (code 500)"
    assert resilient["attempts"] == 1  # a 500 is not retryable; 429 and 503 would be
    for client in ["raw", "httpx-sse"]:
        r = entry(runs, client, "inband-error")
        assert (r["text"], r["error"], r["saw_done"]) == ("Hello", None, True), client


def test_resilient_retries_an_in_band_error_that_says_retry_and_redraws_the_answer(
    runs: dict[str, Run],
) -> None:
    r = entry(runs, "resilient", "inband-503-once")
    assert (r["text"], r["finish_reason"], r["error"]) == (FULL, "stop", None)
    assert (r["attempts"], r["resumes"]) == (2, 0)
    assert [piece for _, piece in r["chunks"]] == HELLO  # "Hello" of the first try is gone


def test_resilient_resumes_with_last_event_id_and_the_stream_id_without_duplicating_tokens(
    runs: dict[str, Run],
) -> None:
    r, first, second = resumable_run(runs, "resilient")
    assert (r["text"], r["finish_reason"], r["error"]) == (FULL, "stop", None)
    assert (r["attempts"], r["resumes"], r["saw_done"]) == (2, 1, True)
    assert [piece for _, piece in r["chunks"]] == HELLO
    assert "last-event-id" not in first.headers
    assert second.headers["last-event-id"] == "3"
    assert second.headers["x-stream-id"] == "s-42"
    assert second.body == first.body


@pytest.mark.parametrize("client", CLIENTS)
def test_a_character_split_across_writes_is_never_shown_as_mojibake(
    runs: dict[str, Run], client: str
) -> None:
    r = entry(runs, client, "utf8-split")
    assert r["text"] == "".join(UTF8_PIECES)
    assert "\ufffd" not in r["text"]


@pytest.mark.parametrize("client", CLIENTS)
def test_abandoning_after_three_tokens_stops_reading_and_closes_the_connection(
    runs: dict[str, Run], client: str
) -> None:
    assert_left_after_three_tokens(runs[client])


@pytest.mark.parametrize("client", CLIENTS)
def test_abandoning_after_a_second_of_silence_closes_the_connection_promptly(
    runs: dict[str, Run], client: str
) -> None:
    assert_left_after_a_second_of_silence(runs[client])


def test_the_example_client_in_the_docs_follows_the_contract(runs: dict[str, Run]) -> None:
    run = runs["example"]
    assert run.result["client"] == "my-client"
    complete_entry, cut_entry = run.by_name["complete"], run.by_name["clean-close"]
    assert (complete_entry["text"], complete_entry["finish_reason"]) == (FULL, "stop")
    assert complete_entry["usage"]["completion_tokens"] == 5
    assert (cut_entry["text"], cut_entry["error"]) == (CUT, None)  # the SDK's silent truncation
    for r in run.result["results"]:
        assert r["text"] == "".join(piece for _, piece in r["chunks"])
        assert r["started_at"] <= r["ended_at"]


@needs(chromium_path(), "Chromium (Debian package `chromium`, or MIDDLEBOX_CHROMIUM=PATH)")
def test_the_browser_client_reads_a_fetch_stream_as_chromium_does(tmp_path: Path) -> None:
    started = Started("browser", BUILTIN_CLIENTS["browser"], tmp_path, workload_for("browser"))
    try:
        run = started.finish()
    finally:
        started.stop()
    got = run.by_name
    for r in run.result["results"]:
        assert r["text"] == "".join(piece for _, piece in r["chunks"])
        assert all(r["started_at"] <= t <= r["ended_at"] for t, _ in r["chunks"])
    complete_entry = got["complete"]
    assert (complete_entry["text"], complete_entry["finish_reason"]) == (FULL, "stop")
    assert (complete_entry["saw_done"], complete_entry["error"]) == (True, None)
    assert complete_entry["usage"]["completion_tokens"] == 5
    assert (got["complete-text"]["text"], got["complete-text"]["error"]) == (" Paris is.", None)
    assert (got["clean-close"]["text"], got["clean-close"]["error"]) == (CUT, None)
    for name in ["rst", "truncated-chunked", "resumable"]:
        # Chromium may drop bytes that arrive in the same read as the broken end.
        assert got[name]["error"] == "TypeError: network error", name
        assert CUT.startswith(got[name]["text"]), name
    assert got["rate-limited"]["error"].startswith("Error: HTTP 429: ")
    assert (got["inband-error"]["text"], got["inband-error"]["error"]) == (
        "Hello",
        "Error: Internal server error",
    )
    assert got["utf8-split"]["text"] == "".join(UTF8_PIECES)
    assert [p for _, p in got["slow"]["chunks"]] == [" t0", " t1", " t2"]
    assert (
        got["slow"]["abandoned"] and run.server.first_note("slow")["gone_after_token"] is not None
    )
    hang_entry = got["hang"]
    assert hang_entry["abandoned"] and hang_entry["ended_at"] - hang_entry["started_at"] < 4.0
    assert run.server.first_note("hang")["closed_at"] is not None
