"""The Node clients of the Responses and Messages APIs (node-openai-responses, node-anthropic,
node-ai-sdk-responses, node-ai-sdk-anthropic) against the emulator through a real middlebox
proxy (127.0.0.1, fast timing, bounded), scored from both legs as `middlebox run` scores
them: a whole stream shows the whole answer and its end in the API's words, a length limit
is reported as that API's reason, a cut with FIN, a cut with RST and an in-band error each
give what the library measurably does. Then the two halves of api_requests.mjs against the
Python rule they mirror: the request each API gets from a chat workload
(middlebox/clients/api_requests.py) and the meaning of every event of the recorded vLLM
streams (middlebox/core/dialects.py, the scorer's rule).

They skip where node or npm is missing, never under CI=true (.ci/run installs them).
"""

from __future__ import annotations

import json
import subprocess
from pathlib import Path
from typing import Any

import pytest

from middlebox.clients.api_requests import messages_request, responses_request
from middlebox.clients.contract import RequestSpec
from middlebox.clients.node import HERE, node_available
from middlebox.core.dialects import Dialect, read
from middlebox.core.sse import SseEvent, SseFramer
from tests.clients.test_dialect_clients import CUT, INBAND, NO_FAULT, run_process
from tests.harness import needs

pytestmark = [pytest.mark.e2e, needs(node_available(), "node (>= 20) and npm")]

RESPONSES_CLIENTS = ["node-openai-responses", "node-ai-sdk-responses"]
MESSAGES_CLIENTS = ["node-anthropic", "node-ai-sdk-anthropic"]
CLIENTS = RESPONSES_CLIENTS + MESSAGES_CLIENTS
# How each API says the model stopped, and that it was cut at its token limit.
NATURAL = {"responses": "completed", "messages": "end_turn"}
LIMIT = {"responses": "max_output_tokens", "messages": "max_tokens"}
STREAMS = Path(__file__).resolve().parents[1] / "core" / "streams"


def api(client: str) -> str:
    return "responses" if client in RESPONSES_CLIENTS else "messages"


def run_node(
    tmp_path: Path, client: str, path: str, max_tokens: int = 40, stream: bool = True
) -> Any:
    """The client's result entry, the emulator's ledger and the client's score."""
    entry, ledger, score = run_process(tmp_path, client, path, max_tokens, stream)
    assert json.loads((tmp_path / "result.json").read_text())["client"] == client
    assert entry["text"] == "".join(piece for _, piece in entry["chunks"])
    return entry, ledger, score


@pytest.mark.parametrize("client", CLIENTS)
def test_a_whole_stream_is_shown_whole_with_its_apis_natural_end(
    tmp_path: Path, client: str
) -> None:
    entry, ledger, score = run_node(tmp_path, client, NO_FAULT)
    assert entry["error"] is None and entry["finish_reason"] == NATURAL[api(client)]
    assert entry["text"] == ledger[0]["text"] and entry["text"]
    assert ledger[0]["endpoint"] == api(client)
    assert entry["usage"]["output_tokens"] == ledger[0]["completion_tokens"]
    assert entry["attempts"] == 1 and entry["resumes"] == 0 and not entry["saw_done"]
    assert [r.verdict for r in score.requests] == ["complete"]
    assert score.requests[0].finish_flag is None


@pytest.mark.parametrize("client", CLIENTS)
def test_a_token_limit_is_reported_in_the_apis_own_words(tmp_path: Path, client: str) -> None:
    entry, ledger, score = run_node(tmp_path, client, NO_FAULT, max_tokens=5)
    assert entry["finish_reason"] == LIMIT[api(client)] and entry["error"] is None
    assert entry["text"] == ledger[0]["text"] and ledger[0]["completion_tokens"] == 5
    (request,) = score.requests  # the whole (cut) answer, and the client said why
    assert request.verdict == "complete" and request.reached_finish_reason == LIMIT[api(client)]
    assert request.finish_flag is None  # neither length_hidden nor stop_invented


@pytest.mark.parametrize("client", ["node-openai-responses", "node-anthropic"])
def test_the_sdks_without_stream_show_the_response_body_and_its_end(
    tmp_path: Path, client: str
) -> None:
    entry, ledger, _ = run_node(tmp_path, client, NO_FAULT, max_tokens=5, stream=False)
    assert not ledger[0]["stream"] and ledger[0]["endpoint"] == api(client)
    assert entry["text"] == ledger[0]["text"] and entry["text"]
    assert entry["finish_reason"] == LIMIT[api(client)] and entry["error"] is None
    assert len(entry["chunks"]) == 1 and entry["usage"]["output_tokens"] == 5


# A clean close (FIN) four tokens in, as measured: the openai SDK's loop and the AI SDK's
# fullStream just end (the AI SDK finishes as `other`, no raw reason), while
# @anthropic-ai/sdk's finalMessage() throws because no message_stop completed a message.
FIN_ERRORS = {
    "node-openai-responses": None,
    "node-ai-sdk-responses": None,
    "node-anthropic": "AnthropicError: stream ended without producing a Message with "
    "role=assistant",
    "node-ai-sdk-anthropic": None,
}


@pytest.mark.parametrize("client", CLIENTS)
def test_a_stream_cut_with_fin_is_silent_for_all_but_the_anthropic_sdk(
    tmp_path: Path, client: str
) -> None:
    entry, ledger, score = run_node(tmp_path, client, CUT % "fin")
    whole = ledger[0]["planned_text"]  # the answer the server meant before the cut aborted it
    assert whole.startswith(entry["text"]) and len(entry["text"]) < len(whole)
    assert len(entry["chunks"]) == 4 and entry["finish_reason"] is None
    assert entry["error"] == FIN_ERRORS[client]
    verdict = "silent_truncation" if FIN_ERRORS[client] is None else "truncation_detected"
    assert [r.verdict for r in score.requests] == [verdict]


RST_ERRORS = {
    "node-openai-responses": "TypeError: terminated",
    "node-ai-sdk-responses": "APICallError: Failed to process successful response",
    "node-anthropic": "APIConnectionError: Connection error.",
    "node-ai-sdk-anthropic": "APICallError: Failed to process successful response",
}


@pytest.mark.parametrize("client", CLIENTS)
def test_a_stream_cut_with_rst_is_detected_by_every_client(tmp_path: Path, client: str) -> None:
    entry, ledger, score = run_node(tmp_path, client, CUT % "rst")
    whole = ledger[0]["planned_text"]
    assert whole.startswith(entry["text"]) and len(entry["text"]) < len(whole)
    # undici's cause says which of its socket's events came first on the reset
    # ("SocketError: other side closed" or "Error: read ECONNRESET"; both occur on loopback);
    # the error the library raises is the same either way.
    assert entry["finish_reason"] is None and entry["error"].startswith(RST_ERRORS[client])
    assert [r.verdict for r in score.requests] == ["truncation_detected"]


# The in-band error in each API's shape (faults/inband_error.py), as each library surfaces
# it: the openai SDK yields `error` and `response.failed` as events, which the driver reads
# by the dialect rule (finish_reason `error` / `failed`, as the Python client); the AI SDK
# hands its `error` part on with the server's message, before any finish; the Anthropic SDK
# throws an APIError on `event: error`.
INBAND_CASES = [
    ("node-openai-responses", "openai", "error", "ResponseFailed: The server had an error"),
    ("node-openai-responses", "openai-failed", "failed", "ResponseFailed: The server had an error"),
    ("node-ai-sdk-responses", "openai", None, "Error: The server had an error"),
    ("node-ai-sdk-responses", "openai-failed", None, "Error: The server had an error"),
    ("node-anthropic", "vllm", None, "APIError: Internal server error"),
    ("node-anthropic", "anthropic", None, "APIError: Overloaded"),
    ("node-ai-sdk-anthropic", "vllm", None, "Error: Internal server error"),
    ("node-ai-sdk-anthropic", "anthropic", None, "Error: Overloaded"),
]


@pytest.mark.parametrize(("client", "shape", "reason", "error"), INBAND_CASES)
def test_an_in_band_error_in_the_apis_shape_is_surfaced_not_shown(
    tmp_path: Path, client: str, shape: str, reason: str | None, error: str
) -> None:
    entry, ledger, score = run_node(tmp_path, client, INBAND % shape)
    assert entry["error"].startswith(error) and entry["finish_reason"] == reason
    assert "error" not in entry["text"].lower() and "overloaded" not in entry["text"].lower()
    assert ledger[0]["planned_text"].startswith(entry["text"])
    # the whole answer may have reached the client before the error frame on a loaded
    # machine (the emulator then writes several tokens in one delta): still surfaced
    assert [r.verdict for r in score.requests] in (["truncation_detected"], ["complete_then_error"])


# --- api_requests.mjs against the Python rule it mirrors ---------------------------------------


def node_eval(script: str, payload: Any) -> Any:
    """Run `script` (an ES module body with `input` bound to `payload`) with
    api_requests.mjs's exports in scope; what it prints as JSON."""
    module = (HERE / "api_requests.mjs").as_uri()
    source = f"""import * as api from {json.dumps(module)};
import fs from "node:fs";
const input = JSON.parse(fs.readFileSync(0, "utf8"));
{script}"""
    done = subprocess.run(
        ["node", "--input-type=module", "-e", source],
        input=json.dumps(payload),
        capture_output=True,
        text=True,
        timeout=30,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout)


CHAT = {"model": "m", "messages": [{"role": "system", "content": "be brief"},
        {"role": "developer", "content": "plain text"}, {"role": "user", "content": "hi"}],
        "max_tokens": 7, "stream": True, "stream_options": {"include_usage": True},
        "ignore_eos": True, "stop": "x", "temperature": 0.5, "top_k": 3, "n": 1}  # fmt: skip
OTHER = {**CHAT, "max_tokens": None, "stop": ["a", "b"], "max_completion_tokens": 9,
         "top_p": 0.9, "seed": 4}  # fmt: skip
SPECS = [
    RequestSpec(index=0, endpoint="chat", body=CHAT),
    RequestSpec(index=1, endpoint="completions", body={"model": "m", "prompt": "p"}),
    RequestSpec(index=2, endpoint="chat", body=OTHER),
]


def flat(request: dict[str, Any]) -> dict[str, Any]:
    """A Python SDK's keyword arguments as the body it sends (`extra_body` merged in)."""
    return {k: v for k, v in request.items() if k != "extra_body"} | request.get("extra_body", {})


def test_each_api_gets_the_request_the_python_clients_send_for_a_chat_workload() -> None:
    specs = [{"endpoint": s.endpoint, "body": s.body} for s in SPECS]
    got = node_eval(
        "console.log(JSON.stringify(input.map((spec) => [api.responsesRequest(spec), "
        "api.messagesRequest(spec), api.aiSdkSettings(spec, 1024)])));",
        specs,
    )
    for spec, (responses, messages, _) in zip(SPECS, got, strict=True):
        assert responses == flat(responses_request(spec))
        assert messages == flat(messages_request(spec))
    chat, prompt, other = (settings for _, _, settings in got)
    assert chat == {"messages": CHAT["messages"], "maxOutputTokens": 7, "temperature": 0.5,
                    "stopSequences": ["x"]}  # fmt: skip
    assert prompt == {"prompt": "p", "maxOutputTokens": 1024}
    assert other["maxOutputTokens"] == 9 and other["topP"] == 0.9 and other["seed"] == 4
    assert other["stopSequences"] == ["a", "b"]


def test_the_root_url_drops_v1_for_the_anthropic_sdk() -> None:
    urls = ["http://127.0.0.1:8000/v1", "http://127.0.0.1:8000/v1/", "http://h/gateway/v1"]
    got = node_eval("console.log(JSON.stringify(input.map(api.rootUrl)));", urls)
    assert got == ["http://127.0.0.1:8000", "http://127.0.0.1:8000", "http://h/gateway"]


# Events the recordings lack: how a Responses answer fails, is cancelled or is cut by a
# content filter, reasoning and tool deltas, and Messages' other deltas and stop reasons.
CONSTRUCTED = [
    ("error", {"type": "error", "code": "server_error", "message": "x", "sequence_number": 9}),
    ("response.failed", {"type": "response.failed", "sequence_number": 5,
     "response": {"status": "failed", "error": {"message": "x"}}}),
    ("response.incomplete", {"type": "response.incomplete", "sequence_number": 5,
     "response": {"status": "incomplete", "incomplete_details": {"reason": "content_filter"}}}),
    ("response.incomplete", {"type": "response.incomplete", "response": {"status": "incomplete"}}),
    ("response.completed", {"type": "response.completed", "response": {"status": "cancelled"}}),
    ("response.completed", {"type": "response.completed", "response": {}}),
    ("response.reasoning_text.delta", {"type": "response.reasoning_text.delta", "delta": "hm"}),
    ("response.function_call_arguments.delta",
     {"type": "response.function_call_arguments.delta", "delta": "{\"a", "sequence_number": 3}),
    ("response.output_text.delta", {"type": "response.output_text.delta", "delta": ""}),
    ("content_block_delta", {"type": "content_block_delta",
     "delta": {"type": "thinking_delta", "thinking": "so"}}),
    ("content_block_delta", {"type": "content_block_delta",
     "delta": {"type": "input_json_delta", "partial_json": "{"}}),
    ("content_block_delta", {"type": "content_block_delta",
     "delta": {"type": "signature_delta", "signature": "s"}}),
    ("message_delta", {"type": "message_delta", "delta": {"stop_reason": "tool_use"}}),
    ("message_delta", {"type": "message_delta", "delta": {"stop_reason": None}}),
    ("message_delta", {"type": "message_delta",
     "delta": {"stop_reason": "model_context_window_exceeded"}}),
    ("error", {"type": "error", "error": {"type": "overloaded_error", "message": "Overloaded"}}),
    ("ping", {"type": "ping"}),
]  # fmt: skip


def dialect_events() -> list[tuple[Dialect, SseEvent]]:
    events: list[tuple[Dialect, SseEvent]] = []
    for path in sorted(STREAMS.glob("*.sse")):
        dialect = Dialect.RESPONSES if "-responses-" in path.name else Dialect.MESSAGES
        if "-responses-" in path.name or "-messages-" in path.name:
            framed = SseFramer().feed(path.read_bytes())
            events += [(dialect, piece.event) for piece in framed if piece.event is not None]
    for name, payload in CONSTRUCTED:
        dialect = Dialect.RESPONSES if name.startswith("response.") else Dialect.MESSAGES
        if name == "error" and "code" in payload:
            dialect = Dialect.RESPONSES
        wire = f"event: {name}\ndata: {json.dumps(payload)}\n\n".encode()
        (event,) = [piece.event for piece in SseFramer().feed(wire) if piece.event is not None]
        events.append((dialect, event))
    return events


def test_the_node_reader_gives_every_event_the_meaning_the_scorer_gives_it() -> None:
    events = dialect_events()
    assert sum(d is Dialect.RESPONSES for d, _ in events) > 40
    assert sum(d is Dialect.MESSAGES for d, _ in events) > 10
    got = node_eval(
        "console.log(JSON.stringify(input.map(([dialect, name, data]) => "
        "api.readEvent(JSON.parse(data), dialect, name))));",
        [[d.value, e.event, e.data] for d, e in events],
    )
    for (dialect, event), node in zip(events, got, strict=True):
        python = read(event, dialect)
        expected = {
            "token": python.token.value if python.token else None,
            "text": python.text,
            "end": python.end.value if python.end else None,
            "reason": python.reason,
            "last": python.last,
            "sequence": python.sequence,
        }
        assert node == expected, (dialect, event.data[:120])
    reasons = {n["reason"] for n in got}
    assert {"completed", "max_output_tokens", "end_turn", "max_tokens", "error"} <= reasons
