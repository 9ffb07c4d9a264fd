"""The Responses and Messages clients against the emulator through a real middlebox proxy
(127.0.0.1, fast timing, bounded): a whole stream shows the whole answer and its end, a
`cut` stream is reported as not complete, the resuming client reads a background response
to its end exactly once across a reset, and `max_tokens` is Anthropic's stop reason.

The openai clients run in this process (`run_client`, as their `main` does); the anthropic
client runs as the matrix runs it, in its own environment (built on first use)."""

from __future__ import annotations

import json
import os
import subprocess
import time
from pathlib import Path
from typing import Any

import pytest
from openai.resources.responses import AsyncResponses

from middlebox.clients import BUILTIN_CLIENTS, openai_responses
from middlebox.clients.api_requests import (
    DEFAULT_MAX_TOKENS,
    messages_request,
    responses_request,
    root_url,
)
from middlebox.clients.contract import RequestSpec, run_client
from middlebox.compose import load
from middlebox.run.background import BackgroundProxy, start_background
from middlebox.run.score import ClientScore, score_client

pytestmark = pytest.mark.e2e

# 10 ms a token: at 2 ms a loaded machine's writer fell behind and vLLM's merging of lagging
# deltas (the emulator's too) put the whole answer in fewer events than the faults count
UPSTREAM = "upstream: {itl: 10ms, prefill_overhead: 5ms, responses_store: true, " \
    "natural_ends: true, natural_length_min: 12, natural_length_max: 12}\n"  # fmt: skip
CLIENT_BOUND = 60
TAG = "[middlebox dialect-clients/c/0]"


def proxy_for(
    tmp_path: Path, path: str, store: bool = True, upstream: str = UPSTREAM
) -> BackgroundProxy:
    scenario = tmp_path / "scenario.yaml"
    if not store:
        upstream = upstream.replace("responses_store: true", "responses_store: false")
    scenario.write_text(f"name: dialect-clients\nseed: 3\npath:\n{path}{upstream}")
    return start_background(load(scenario), tmp_path)


def workload(
    tmp_path: Path, model: str, max_tokens: int, stream: bool = True, **user: Any
) -> dict[str, str]:
    """One chat request; `user` adds the contract's request fields (`abandon_after_tokens`)."""
    body = {
        "model": model,
        "messages": [{"role": "user", "content": f"{TAG} hello"}],
        "max_tokens": max_tokens,
        "stream": stream,
    }
    request = {"index": 0, "endpoint": "chat", "body": body, **user}
    (tmp_path / "workload.json").write_text(json.dumps({"requests": [request]}))
    return {
        "MIDDLEBOX_WORKLOAD": str(tmp_path / "workload.json"),
        "MIDDLEBOX_RESULT": str(tmp_path / "result.json"),
    }


def scored(proxy: BackgroundProxy, client: str, result: Path, ledger: Any) -> ClientScore:
    """The client's run scored as `middlebox run` scores it, from both legs' journals."""

    def legs() -> tuple[list[Any], list[Any]]:
        journals = [j for _, j in sorted(proxy.proxy.store.journals.items())]
        return [j.leg("upstream") for j in journals], [j.leg("client") for j in journals]

    upstream, client_legs = proxy._call(legs)
    return score_client(
        "dialect-clients", client, [TAG], json.loads(result.read_text()), ledger, upstream,
        [], [], client_traffic=client_legs,
    )  # fmt: skip


def run_openai(
    tmp_path: Path,
    path: str,
    *,
    resume: bool,
    max_tokens: int = 40,
    store: bool = True,
    stream: bool = True,
    restart: bool = False,
    abandon: int | None = None,
    upstream: str = UPSTREAM,
) -> Any:
    """The result entry, the emulator's ledger of one request and the client's score."""
    proxy = proxy_for(tmp_path, path, store, upstream)
    try:
        user = {} if abandon is None else {"abandon_after_tokens": abandon}
        request = workload(tmp_path, proxy.model, max_tokens, stream, **user)
        environ = {"OPENAI_BASE_URL": proxy.base_url, **request}
        if resume:
            code = run_client("openai-responses-resume", openai_responses.resuming_session, environ)
        elif restart:
            code = run_client(
                "openai-responses-restart", openai_responses.restarting_session, environ
            )
        else:
            code = run_client("openai-responses", openai_responses.session, environ)
        assert code == 0
        proxy.settle()
        ledger = ended(proxy)
        score = scored(proxy, "openai-responses", tmp_path / "result.json", ledger)
    finally:
        proxy.close()
    (entry,) = json.loads((tmp_path / "result.json").read_text())["results"]
    return entry, ledger, score


def ended(proxy: BackgroundProxy, bound: float = 10.0) -> list[dict[str, Any]]:
    """The ledger once every generation has ended: a background response left by its
    client generates on after the client's run is over (bounded wait, 20 ms polls)."""
    deadline = time.monotonic() + bound
    while True:
        ledger = proxy.ledger()
        running = [e for e in ledger if e["finished_at"] is None and e["aborted_at"] is None]
        if not running or time.monotonic() > deadline:
            return ledger
        time.sleep(0.02)


def run_process(
    tmp_path: Path,
    client: str,
    path: str,
    max_tokens: int,
    stream: bool = True,
    upstream: str = UPSTREAM,
    **user: Any,
) -> Any:
    """A built-in client run as the matrix runs it, in its own process (with the runner's API
    key in its environment): its result entry, the emulator's ledger and its score; its
    stderr is left in `stderr.log`."""
    argv = BUILTIN_CLIENTS[client]  # builds its environment (or npm ci) on first use
    proxy = proxy_for(tmp_path, path, upstream=upstream)
    try:
        env = {**os.environ, "OPENAI_BASE_URL": proxy.base_url, "OPENAI_API_KEY": "sk-test"}
        env |= workload(tmp_path, proxy.model, max_tokens, stream, **user)
        done = subprocess.run(argv, env=env, timeout=CLIENT_BOUND, capture_output=True, text=True)
        (tmp_path / "stderr.log").write_text(done.stderr)
        assert done.returncode == 0, done.stderr
        proxy.settle()
        ledger = proxy.ledger()
        score = scored(proxy, client, tmp_path / "result.json", ledger)
    finally:
        proxy.close()
    (entry,) = json.loads((tmp_path / "result.json").read_text())["results"]
    return entry, ledger, score


def run_anthropic(tmp_path: Path, path: str, max_tokens: int) -> Any:
    return run_process(tmp_path, "anthropic-messages", path, max_tokens)


NO_FAULT = "  - latency: {delay: 0ms}\n"
CUT = "  - cut: {after: tokens, count: 4, end: %s}\n"
CUT_FIRST_POST = "  - cut: {after: tokens, count: 4, end: rst, match: {method: POST}}\n"


def test_the_responses_client_shows_the_whole_answer_and_its_completed_end(
    tmp_path: Path,
) -> None:
    entry, ledger, score = run_openai(tmp_path, NO_FAULT, resume=False)
    assert entry["error"] is None and entry["finish_reason"] == "completed"
    assert entry["text"] == ledger[0]["text"] and len(ledger[0]["text"]) > 0
    assert entry["text"] == "".join(piece for _, piece in entry["chunks"])
    assert entry["usage"]["output_tokens"] == ledger[0]["completion_tokens"]
    assert entry["resumes"] == 0
    assert entry["attempts"] == 1 and not entry["saw_done"]
    assert [r.verdict for r in score.requests] == ["complete"]
    assert score.metrics["server.usage_reported"] == 1


def test_the_responses_client_without_stream_shows_the_response_body(tmp_path: Path) -> None:
    entry, ledger, _ = run_openai(tmp_path, NO_FAULT, resume=False, max_tokens=5, stream=False)
    assert entry["text"] == ledger[0]["text"] and entry["text"]
    assert entry["finish_reason"] == "max_output_tokens" and not ledger[0]["stream"]


def test_the_responses_client_reports_a_length_cut_as_max_output_tokens(tmp_path: Path) -> None:
    entry, ledger, score = run_openai(tmp_path, NO_FAULT, resume=False, max_tokens=5)
    assert entry["finish_reason"] == "max_output_tokens" and entry["error"] is None
    assert entry["text"] == ledger[0]["text"]
    (request,) = score.requests  # the whole (cut) answer, and the client said why
    assert request.verdict == "complete" and request.reached_finish_reason == "max_output_tokens"


@pytest.mark.parametrize(("end", "error"), [("fin", None), ("rst", "APIConnectionError")])
def test_a_cut_responses_stream_is_reported_as_not_complete(
    tmp_path: Path, end: str, error: str | None
) -> None:
    entry, ledger, score = run_openai(tmp_path, CUT % end, resume=False)
    whole = ledger[0]["planned_text"]  # the answer the server meant before the cut aborted it
    assert entry["finish_reason"] is None  # no terminal event reached it
    assert whole.startswith(entry["text"]) and len(entry["text"]) < len(whole)
    assert len(entry["chunks"]) == 4
    (request,) = score.requests
    if error is None:
        assert entry["error"] is None  # the README's loop ends without a word
        assert request.verdict == "silent_truncation"
    else:
        assert entry["error"].startswith(error)
        assert request.verdict == "truncation_detected"


def test_the_resuming_client_reads_a_background_response_once_across_a_reset(
    tmp_path: Path,
) -> None:
    entry, ledger, score = run_openai(tmp_path, CUT_FIRST_POST, resume=True)
    (generated,) = ledger
    assert generated["background"]
    assert entry["error"] is None and entry["finish_reason"] == "completed"
    assert entry["text"] == generated["text"]  # no piece twice, none missing
    assert entry["resumes"] == 1 and entry["attempts"] == 2
    # scored as middlebox run scores it: the resume GET carries no body, yet it is this
    # request's second attempt (the id its first stream named), and the answer is whole
    (request,) = score.requests
    assert request.verdict == "complete" and request.attempts == 2
    assert request.reported_attempts == 2 and request.finish_flag is None
    # it ran on while nobody read it, and all of it was read on the resume: no waste
    assert score.metrics["server.tokens_wasted"] == 0 and score.metrics["server.aborted"] == 0
    assert score.metrics["client.sequence_gaps"] == score.metrics["client.sequence_repeats"] == 0
    assert score.metrics["server.generations_per_request"] == 1


CUT_FIRST_CREATE = (
    "  - cut: {after: tokens, count: 4, end: rst, match: {method: POST, requests: [0]}}\n"
)
# a whole answer that takes a while: the first background response is still generating
# when the restart creates the second, and runs on to its limit with nobody reading it
SLOW = UPSTREAM.replace("itl: 2ms", "itl: 10ms").replace("natural_ends: true, ", "")


def test_the_restarting_client_creates_the_response_again_and_shows_its_start_twice(
    tmp_path: Path,
) -> None:
    entry, ledger, score = run_openai(
        tmp_path, CUT_FIRST_CREATE, resume=False, restart=True, max_tokens=24, upstream=SLOW
    )
    first, second = ledger  # two background generations of one request, two response ids
    assert first["background"] and second["background"] and first["id"] != second["id"]
    assert entry["error"] is None and entry["finish_reason"] in ("completed", "max_output_tokens")
    assert entry["resumes"] == 0 and entry["attempts"] == 2
    shown_first = "".join(piece for _, piece in entry["chunks"][:4])
    assert entry["text"] == shown_first + second["text"]  # the start shown again
    (request,) = score.requests
    assert request.verdict in ("duplicated", "contradicted") and request.generations == 2
    assert score.metrics["server.generations_per_request"] == 2
    # the first response ran on unwatched: what it made past the 4 tokens shown is waste
    unread = first["completion_tokens"] - first["delivered_tokens"]
    assert first["completion_tokens"] == 24 and unread >= 24 - 8
    assert score.metrics["server.tokens_wasted"] == unread
    assert score.metrics["client.sequence_gaps"] == score.metrics["client.sequence_repeats"] == 0


def test_the_restarting_client_without_a_fault_creates_once(tmp_path: Path) -> None:
    entry, ledger, score = run_openai(tmp_path, NO_FAULT, resume=False, restart=True)
    assert len(ledger) == 1 and entry["text"] == ledger[0]["text"] and entry["attempts"] == 1
    assert [r.verdict for r in score.requests] == ["complete"]
    assert score.metrics["server.tokens_wasted"] == 0
    assert score.metrics["server.generations_per_request"] == 1


def test_a_background_response_left_without_a_cancel_wastes_what_it_makes_after(
    tmp_path: Path,
) -> None:
    entry, ledger, score = run_openai(
        tmp_path, NO_FAULT, resume=True, abandon=4, max_tokens=24, upstream=SLOW
    )
    (generated,) = ledger
    assert entry["abandoned"] and generated["background"] and generated["cancelled_at"] is None
    assert generated["completion_tokens"] == 24  # it kept generating for nobody
    assert score.metrics["server.tokens_wasted"] >= 24 - 8
    assert score.metrics["server.aborted"] == 0


@pytest.mark.parametrize("shift", [1, -1], ids=["one-too-far", "one-too-early"])
def test_a_resume_from_the_wrong_event_is_caught_on_the_wire(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, shift: int
) -> None:
    """The resuming client with its `starting_after` off by one: one too far skips an
    event (a gap, text missing); one too early is sent an event again (a repeat), which
    this client skips, so its text stays whole."""
    retrieve = AsyncResponses.retrieve

    async def off_by_one(self: Any, response_id: str, **options: Any) -> Any:
        options["starting_after"] = options["starting_after"] + shift
        return await retrieve(self, response_id, **options)

    monkeypatch.setattr(AsyncResponses, "retrieve", off_by_one)
    entry, ledger, score = run_openai(tmp_path, CUT_FIRST_POST, resume=True)
    assert entry["resumes"] == 1 and entry["error"] is None
    (request,) = score.requests
    if shift > 0:
        assert request.verdict == "missing_tokens" and score.metrics["client.missing_tokens"] == 1
        assert (request.sequence_gaps, request.sequence_repeats) == (1, 0)
        assert score.metrics["client.sequence_gaps"] == 1
    else:
        assert entry["text"] == ledger[0]["text"] and request.verdict == "complete"
        assert (request.sequence_gaps, request.sequence_repeats) == (0, 1)
        assert score.metrics["client.sequence_repeats"] == 1
        assert score.metrics["client.duplicated"] == 0


def test_the_resuming_client_without_a_fault_never_resumes(tmp_path: Path) -> None:
    entry, ledger, score = run_openai(tmp_path, NO_FAULT, resume=True)
    assert ledger[0]["background"] and entry["text"] == ledger[0]["text"]
    assert entry["resumes"] == 0 and entry["attempts"] == 1
    assert [(r.verdict, r.attempts) for r in score.requests] == [("complete", 1)]
    assert entry["finish_reason"] == "completed"


def test_the_anthropic_client_shows_the_whole_answer_and_end_turn(tmp_path: Path) -> None:
    entry, ledger, score = run_anthropic(tmp_path, NO_FAULT, max_tokens=40)
    assert entry["error"] is None and entry["finish_reason"] == "end_turn"
    assert entry["text"] == ledger[0]["text"] and entry["text"]
    assert ledger[0]["endpoint"] == "messages"
    assert [r.verdict for r in score.requests] == ["complete"]
    assert score.metrics["server.usage_reported"] == 1


def test_the_anthropic_client_reports_max_tokens_as_its_stop_reason(tmp_path: Path) -> None:
    entry, ledger, score = run_anthropic(tmp_path, NO_FAULT, max_tokens=5)
    assert entry["finish_reason"] == "max_tokens" and entry["error"] is None
    assert entry["text"] == ledger[0]["text"]
    (request,) = score.requests
    assert request.verdict == "complete" and request.reached_finish_reason == "max_tokens"


def test_a_cut_messages_stream_has_no_stop_reason(tmp_path: Path) -> None:
    entry, ledger, score = run_anthropic(tmp_path, CUT % "fin", max_tokens=40)
    assert entry["finish_reason"] is None
    assert ledger[0]["planned_text"].startswith(entry["text"])
    assert len(entry["text"]) < len(ledger[0]["planned_text"])
    assert entry["error"] is None  # text_stream just ends: nothing tells the user
    assert [r.verdict for r in score.requests] == ["silent_truncation"]


def test_the_resuming_client_against_a_server_without_the_store_reports_its_refusal(
    tmp_path: Path,
) -> None:
    """vLLM refuses `background` unless VLLM_ENABLE_RESPONSES_API_STORE=1 (its default is
    off): the guide's pattern then fails before a byte of answer, and says so."""
    entry, ledger, score = run_openai(tmp_path, NO_FAULT, resume=True, store=False)
    assert [e["status"] for e in ledger] == [400] and not ledger[0]["text"]
    assert entry["text"] == "" and entry["resumes"] == 0
    assert entry["error"].startswith("BadRequestError")
    assert [r.verdict for r in score.requests] == ["error_reported"]


def test_a_chat_workload_request_becomes_each_apis_own_request() -> None:
    chat = {"model": "m", "messages": [{"role": "system", "content": "be brief"},
            {"role": "user", "content": "hi"}], "max_tokens": 7, "stream": True,
            "stream_options": {"include_usage": True}, "ignore_eos": True, "stop": "x",
            "temperature": 0.5}  # fmt: skip
    spec = RequestSpec(index=0, endpoint="chat", body=chat)
    assert responses_request(spec) == {
        "model": "m", "temperature": 0.5, "input": chat["messages"], "max_output_tokens": 7,
        "extra_body": {"ignore_eos": True},
    }  # fmt: skip
    assert messages_request(spec) == {
        "model": "m", "temperature": 0.5, "messages": [{"role": "user", "content": "hi"}],
        "system": "be brief", "max_tokens": 7, "stop_sequences": ["x"],
        "extra_body": {"ignore_eos": True},
    }  # fmt: skip
    prompt = RequestSpec(index=1, endpoint="completions", body={"model": "m", "prompt": "p"})
    assert responses_request(prompt) == {"model": "m", "input": "p"}
    assert messages_request(prompt)["max_tokens"] == DEFAULT_MAX_TOKENS


def test_the_anthropic_sdk_gets_the_server_root_it_appends_v1_messages_to() -> None:
    assert root_url("http://127.0.0.1:8000/v1") == "http://127.0.0.1:8000"
    assert root_url("http://127.0.0.1:8000/v1/") == "http://127.0.0.1:8000"
    assert root_url("http://h/gateway/v1") == "http://h/gateway"


INBAND = "  - inband_error: {events: 8, shape: %s}\n"


@pytest.mark.parametrize("shape", ["openai", "openai-failed"])
def test_an_error_event_in_a_responses_stream_is_surfaced_not_shown(
    tmp_path: Path, shape: str
) -> None:
    entry, _, score = run_openai(tmp_path, INBAND % shape, resume=False)
    assert entry["error"].startswith("ResponseFailed: ")
    assert entry["finish_reason"] in ("error", "failed")
    assert "error" not in entry["text"].lower()
    assert [r.verdict for r in score.requests] == ["truncation_detected"]


def test_an_error_event_in_a_messages_stream_is_raised_by_the_sdk(tmp_path: Path) -> None:
    entry, _, score = run_anthropic(tmp_path, INBAND % "vllm", max_tokens=40)
    assert entry["error"].startswith("APIStatusError: ") and entry["finish_reason"] is None
    assert [r.verdict for r in score.requests] == ["truncation_detected"]
