"""The `openai-agents` client (the OpenAI Agents SDK's `Runner.run_streamed`) against the
emulator through a real middlebox proxy, run as the matrix runs it, in its own environment
(built on first use), scored from both legs: a whole stream shows the server's answer and
its `completed` end, a cut with FIN or RST and an in-band error are raised by the runner
(it needs a final response), a `max_output_tokens` limit is the answer's reason, a user
who leaves stops the server's generation, and the SDK's tracing sends nothing anywhere."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path
from typing import Any

import pytest

from middlebox.clients import BUILTIN_CLIENTS
from tests.clients.test_dialect_clients import (
    CLIENT_BOUND,
    CUT,
    INBAND,
    NO_FAULT,
    UPSTREAM,
    proxy_for,
    run_process,
    workload,
)

pytestmark = pytest.mark.e2e

CLIENT = "openai-agents"


def run_agents(tmp_path: Path, path: str, max_tokens: int = 40, **request: Any) -> Any:
    return run_process(tmp_path, CLIENT, path, max_tokens, **request)


def test_the_agents_client_shows_the_whole_answer_and_its_completed_end(tmp_path: Path) -> None:
    entry, ledger, score = run_agents(tmp_path, NO_FAULT)
    assert entry["error"] is None and entry["finish_reason"] == "completed"
    assert entry["text"] == ledger[0]["text"] and len(ledger[0]["text"]) > 0
    assert entry["text"] == "".join(piece for _, piece in entry["chunks"])
    assert entry["usage"]["output_tokens"] == ledger[0]["completion_tokens"]
    assert ledger[0]["endpoint"] == "responses" and ledger[0]["stream"]
    assert entry["attempts"] == 1 and not entry["saw_done"] and entry["resumes"] == 0
    assert [r.verdict for r in score.requests] == ["complete"]
    assert score.metrics["server.usage_reported"] == 1


def test_the_agents_client_reports_a_length_cut_as_max_output_tokens(tmp_path: Path) -> None:
    """vLLM ends a response cut by `max_output_tokens` with `response.completed` whose status
    is `incomplete`: the runner takes it as the final response and raises nothing."""
    entry, ledger, score = run_agents(tmp_path, NO_FAULT, max_tokens=5)
    assert entry["finish_reason"] == "max_output_tokens" and entry["error"] is None
    assert entry["text"] == ledger[0]["text"] and ledger[0]["max_tokens"] == 5
    (request,) = score.requests
    assert request.verdict == "complete" and request.reached_finish_reason == "max_output_tokens"


# The cut's 4 tokens 30 ms apart, not 2: an RST flushes what the client has not read yet
# (RFC 793, 3.9: "all segment queues should be flushed"), and a client that had not read the
# response's head by then saw a request with no answer, which the openai SDK retries, and the
# cut fires once (seen once on a loaded machine at 2 ms: the RST run reported `completed`).
PACED = UPSTREAM.replace("itl: 2ms", "itl: 30ms")


@pytest.mark.parametrize(
    ("end", "error"),
    [
        ("fin", "ModelBehaviorError: Model did not produce a final response!"),
        ("rst", "APIConnectionError: "),
    ],
)
def test_a_cut_stream_is_raised_by_the_runner(tmp_path: Path, end: str, error: str) -> None:
    """A clean close before the terminal event is no silent truncation here (the plain
    openai SDK's Responses loop ends without a word): the runner needs a final response."""
    entry, ledger, score = run_agents(tmp_path, CUT % end, upstream=PACED)
    whole = ledger[0]["planned_text"]
    assert entry["finish_reason"] is None  # no terminal event reached it
    assert whole.startswith(entry["text"]) and len(entry["text"]) < len(whole)
    assert len(entry["chunks"]) == 4 and entry["attempts"] == 1  # nothing retried
    assert entry["error"].startswith(error)
    assert [r.verdict for r in score.requests] == ["truncation_detected"]


@pytest.mark.parametrize(("shape", "event"), [("openai", "error"), ("openai-failed", "failed")])
def test_an_error_event_is_raised_by_the_runner_not_shown(
    tmp_path: Path, shape: str, event: str
) -> None:
    entry, _, score = run_agents(tmp_path, INBAND % shape)
    assert entry["error"].startswith("ModelBehaviorError: Responses stream ended with terminal")
    assert f"`{'response.' if event == 'failed' else ''}{event}`" in entry["error"]
    assert entry["finish_reason"] == event
    assert "error" not in entry["text"].lower() and entry["text"]
    assert [r.verdict for r in score.requests] == ["truncation_detected"]


# An answer of 200 tokens 20 ms apart: generation is still going when the user leaves.
LONG = UPSTREAM.replace("itl: 2ms", "itl: 20ms").replace("length_max: 12", "length_max: 200")
LONG = LONG.replace("length_min: 12", "length_min: 200")


def test_a_user_who_leaves_cancels_the_run_and_the_server_stops(tmp_path: Path) -> None:
    """`result.cancel()`: the run reads its stream in a task of its own, so leaving the loop
    alone let the server generate all 201 tokens while the other request of the workload
    went on (measured); a single request would hide it (the session's end closes all)."""
    proxy = proxy_for(tmp_path, NO_FAULT, upstream=LONG)
    try:
        env = {**os.environ, "OPENAI_BASE_URL": proxy.base_url}
        env |= workload(tmp_path, proxy.model, 400, abandon_after_tokens=3)
        document = json.loads((tmp_path / "workload.json").read_text())
        stays = {**document["requests"][0], "index": 1, "abandon_after_tokens": None}
        document |= {"concurrency": 2, "requests": [document["requests"][0], stays]}
        (tmp_path / "workload.json").write_text(json.dumps(document))
        argv = BUILTIN_CLIENTS[CLIENT]
        done = subprocess.run(argv, env=env, timeout=CLIENT_BOUND, capture_output=True, text=True)
        assert done.returncode == 0, done.stderr
        proxy.settle()
        ledger = proxy.ledger()
    finally:
        proxy.close()
    left, stayed = json.loads((tmp_path / "result.json").read_text())["results"]
    assert left["abandoned"] and left["error"] is None and len(left["chunks"]) == 3
    assert not stayed["abandoned"] and stayed["finish_reason"] == "completed"
    ends = sorted((entry["finish_reason"], entry["completion_tokens"]) for entry in ledger)
    (aborted, aborted_tokens), (stopped, stopped_tokens) = ends
    assert (aborted, stopped) == ("abort", "stop")
    assert aborted_tokens < stopped_tokens // 2


def test_without_stream_the_run_shows_its_final_output(tmp_path: Path) -> None:
    entry, ledger, _ = run_agents(tmp_path, NO_FAULT, stream=False)
    assert not ledger[0]["stream"] and entry["error"] is None
    assert entry["text"] == ledger[0]["text"] and entry["text"]
    assert entry["finish_reason"] == "completed"


def test_tracing_is_off_so_nothing_is_exported(tmp_path: Path) -> None:
    """With an API key in the environment (the runner sets one), the SDK's default would
    post the run's spans to api.openai.com and log each failed try on stderr."""
    run_agents(tmp_path, NO_FAULT)
    stderr = (tmp_path / "stderr.log").read_text()
    assert "Tracing" not in stderr and "trace export" not in stderr
    assert json.loads((tmp_path / "result.json").read_text())["client"] == CLIENT
