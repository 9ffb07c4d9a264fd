"""Clients under test: separate processes with one small result contract.

Rule: each client runs as its own process; imports only core (its pure framers), clients and
the one library it drives, and is never named after that library.

A user's own client (`middlebox run --client-cmd CMD`) and the built-in ones are scored
the same way. docs/clients.md has the same contract with an example client.

Environment given to the client process:
- `OPENAI_BASE_URL`: e.g. `http://127.0.0.1:PORT/v1` (the proxy);
- `OPENAI_API_KEY`;
- `MIDDLEBOX_WORKLOAD`: path of the JSON workload file;
- `MIDDLEBOX_RESULT`: path the client writes its JSON result to, atomically (write a
  temp file in the same directory, then rename it over this path).

Workload:
    {"scenario": str, "concurrency": int,
     "requests": [{"index": int, "endpoint": "chat" | "completions",
                   "body": {the full OpenAI request body: model, messages or prompt,
                            stream, max_tokens, stream_options, ...},
                   "start_after": float (seconds after the client started),
                   "abandon_after_tokens": int | null,
                   "abandon_after_seconds": float | null}]}
A request starts no earlier than `start_after`, with at most `concurrency` in flight.
Abandoning means: stop reading, close the connection, mark `abandoned: true`
(`abandon_after_tokens` counts shown text pieces, i.e. content deltas; seconds count from
the request's start).

Result:
    {"client": name,
     "results": [{"index": int,
                  "text": str (what the client would show),
                  "finish_reason": str | null,
                  "error": str | null ("ExceptionType: message" surfaced to the user),
                  "usage": object | null,
                  "chunks": [[display_time, text_piece], ...] (time.time() when shown),
                  "started_at": float, "ended_at": float (time.time()),
                  "attempts": int (HTTP requests made for this logical request),
                  "resumes": int (reconnects with Last-Event-ID),
                  "saw_done": bool (the client itself observed data: [DONE]),
                  "abandoned": bool}]}
The runner checks the result where it reads it (`middlebox.clients.result_file`): `index`
is required, every other field present must have the type above, and a file that breaks
this is reported as that client's problem instead of being scored.
Invariant of the built-in clients: `text == "".join(piece for _, piece in chunks)`; a
client that restarts a request and replaces its display clears `chunks` too. Choice 0
only (n=1). The process exits 0 once the result is written, whatever the requests'
errors; a contract violation (missing env, bad workload) exits 2 without a result.

Built-in clients (BUILTIN_CLIENTS: name -> argv):
- `raw`: reads to the end and trusts it, like `curl -N`: no status, `[DONE]` or
  finish_reason check, no retries (silent truncation);
- `openai`: the official SDK with its default timeout and retries (raises on RST, silent
  on a clean close without `[DONE]`);
- `httpx-sse`: httpx + httpx-sse `aconnect_sse`/`aiter_sse` until `[DONE]` or the end;
- `httpx-h2`: the same over `httpx.AsyncClient(http2=True)`: concurrent requests are
  streams of one HTTP/2 connection to a TLS proxy (scored where a scenario names it);
- `resilient`: the reference client (timeouts from max_tokens, finish_reason/[DONE]
  checks, bounded retries honouring Retry-After, Last-Event-ID resume without
  duplicates, UTF-8-safe reassembly, prompt cancellation);
- `browser`: headless Chromium running fetch() streaming, only when Chromium is installed;
- `browser-tls`: the `browser` page against a TLS proxy (`--ignore-certificate-errors`):
  Chromium's own HTTP/2, or HTTP/1.1 with its six connections per origin;
- `browser-eventsource`: headless Chromium following a resumable server's stream with
  `EventSource` (its own reconnect sends Last-Event-ID), only when Chromium is installed.
The compatibility matrix's clients (docs/compatibility.md), scored when named or by
`make matrix`, never by default:
- `aiohttp-lines`: aiohttp's line iterator over the body until `[DONE]`;
- `aiohttp-naive`: aiohttp `iter_any()` with each read decoded on its own (mojibake);
- `openai-v1`, `openai-v2`: the openai SDK's 1.x and 2.x lines, run as `openai` is;
- `langchain-openai`: `ChatOpenAI(...).astream`;
- `litellm`: `acompletion(stream=True)` against the OpenAI-compatible base;
- `openai-responses`: the openai SDK's `responses.create(stream=True)` (the Responses API);
- `openai-responses-resume`: a background response (`background`, `store`) resumed with
  `responses.retrieve(id, stream=True, starting_after=N)` when its stream breaks;
- `openai-responses-restart`: the same background response created again (a new response,
  a new generation) when its stream breaks, its text shown on top of what was shown;
- `anthropic-messages`: the anthropic SDK's `messages.stream` against `/v1/messages`;
- `openai-agents`: the OpenAI Agents SDK's `Runner.run_streamed` with its Responses model
  pointed at the server (tracing off: its default exports to api.openai.com).
`openai-v1`, `openai-v2`, `langchain-openai`, `litellm`, `anthropic-messages` and
`openai-agents` run in their own environments (`middlebox.clients.envs`), built from a lock
file the first time the client is looked up in BUILTIN_CLIENTS.
The Node clients (`middlebox.clients.node`, NODE_CLIENTS; node >= 20 and npm), scored when
named or by `make matrix`: `node-openai`, `node-ai-sdk`, `node-eventsource`,
`node-fetch-event-source`, `node-fetch-naive` on chat completions, and `node-openai-responses`,
`node-anthropic`, `node-ai-sdk-responses`, `node-ai-sdk-anthropic` on the Responses and
Messages APIs.
Agent clients (SCENARIO_CLIENTS), scored in the scenarios whose `workload.clients` names
them: `tools-naive` (acts on partial tool calls and JSON, retries without idempotency
keys, shows reasoning as the answer) and `openai-tools` (the SDK's documented tool-call
loop); `resilient` is their reference. Results may carry `tool_calls_executed`,
`json_acted_on` and `reasoning` (docs/clients.md). `openai-responses-resume` and
`openai-responses-restart` are scored the same way: only where a scenario names them (they
need a server with the Responses store).
`openai-responses` and `anthropic-messages` (DIALECT_CLIENTS) are matrix clients that also
run wherever a scenario names them: the library's Responses and Messages scenarios.
"""

from __future__ import annotations

import os
import shutil
import sys
from collections.abc import Iterator, MutableMapping

from middlebox.clients import envs
from middlebox.clients.node import NODE_CLIENTS, node_available
from middlebox.clients.node.launch import ready as ensure_node_packages


class ClientRegistry(MutableMapping[str, list[str]]):
    """Client name -> argv. Looking up a client whose library lives in its own
    environment (`envs.LOCKED_CLIENTS`) builds that environment first if it is missing
    (saying so on stderr), so `--client NAME` works from a fresh clone and the build never
    runs inside a scenario's client bound. Iterating names builds nothing."""

    def __init__(self, argvs: dict[str, list[str]]) -> None:
        self._argvs = dict(argvs)

    def __getitem__(self, name: str) -> list[str]:
        if name in envs.LOCKED_CLIENTS and name not in self._argvs:
            envs.ensure(name)
            return envs.argv(name)
        if name in NODE_CLIENTS and node_available():
            # `npm ci` takes ~30 s on a loaded machine: once, before the scenario's client
            # bound starts, not inside it (the first run of a fresh clone scored a hang)
            ensure_node_packages()
        return self._argvs[name]

    def __setitem__(self, name: str, argv: list[str]) -> None:
        self._argvs[name] = argv

    def __delitem__(self, name: str) -> None:
        del self._argvs[name]

    def __iter__(self) -> Iterator[str]:
        yield from self._argvs
        yield from (name for name in envs.LOCKED_CLIENTS if name not in self._argvs)

    def __len__(self) -> int:
        return len(self._argvs) + sum(1 for name in envs.LOCKED_CLIENTS if name not in self._argvs)


BUILTIN_CLIENTS = ClientRegistry(
    {
        "raw": [sys.executable, "-m", "middlebox.clients.raw"],
        "openai": [sys.executable, "-m", "middlebox.clients.openai_sdk"],
        "httpx-sse": [sys.executable, "-m", "middlebox.clients.httpx_sse_reader"],
        "httpx-h2": [sys.executable, "-m", "middlebox.clients.httpx_h2"],
        "resilient": [sys.executable, "-m", "middlebox.clients.resilient"],
        "browser": [sys.executable, "-m", "middlebox.clients.browser"],
        "browser-eventsource": [
            sys.executable,
            "-m",
            "middlebox.clients.browser",
            "--eventsource",
        ],
        "browser-tls": [sys.executable, "-m", "middlebox.clients.browser_tls"],
        "aiohttp-lines": [sys.executable, "-m", "middlebox.clients.aiohttp_lines"],
        "aiohttp-naive": [sys.executable, "-m", "middlebox.clients.aiohttp_naive"],
        "tools-naive": [sys.executable, "-m", "middlebox.clients.tools_naive"],
        "openai-tools": [sys.executable, "-m", "middlebox.clients.sdk_tool_loop"],
        "openai-responses": [sys.executable, "-m", "middlebox.clients.openai_responses"],
        "openai-responses-resume": [
            sys.executable,
            "-m",
            "middlebox.clients.openai_responses",
            "--resume",
        ],
        "openai-responses-restart": [
            sys.executable,
            "-m",
            "middlebox.clients.openai_responses",
            "--restart",
        ],
    }
)

# Agent clients (docs/clients.md "Agent streams"): scored in the scenarios whose
# `workload.clients` names them (tool calls, JSON answers, reasoning), never by default.
# `openai-responses-resume` and `-restart` need a server with the Responses store (vLLM's
# VLLM_ENABLE_RESPONSES_API_STORE=1, off by default; the emulator's `responses_store`), which
# only the scenarios that name it configure: elsewhere `background` is refused with a 400.
SCENARIO_CLIENTS = (
    "tools-naive",
    "openai-tools",
    "httpx-h2",
    "browser-tls",
    "openai-responses-resume",
    "openai-responses-restart",
)

# The Python clients of the Responses and Messages APIs: matrix clients (scored when named,
# or by `make matrix`), and also scored wherever a scenario's `workload.clients` names them,
# so the library's Responses and Messages scenarios run in `middlebox run` with no --client.
DIALECT_CLIENTS = ("openai-responses", "anthropic-messages")

# What `middlebox run` scores when no --client is given (browsers only with Chromium): the
# matrix's clients (docs/compatibility.md) are scored when named, or all by `make matrix`.
DEFAULT_CLIENTS = ("raw", "openai", "httpx-sse", "resilient", "browser", "browser-eventsource")

BUILTIN_CLIENTS.update(NODE_CLIENTS)  # node-openai, node-ai-sdk, ...: middlebox/clients/node

CHROMIUM_CANDIDATES = ("chromium", "chromium-browser", "/usr/bin/chromium")


def chromium_path() -> str | None:
    """The Chromium binary (Debian's `chromium` package), or None when not installed."""
    override = os.environ.get("MIDDLEBOX_CHROMIUM")
    for candidate in (override, *CHROMIUM_CANDIDATES):
        if candidate:
            found = shutil.which(candidate)
            if found:
                return found
    return None


def available_clients(*, every: bool = False) -> list[str]:
    """The built-in clients this machine can run, of DEFAULT_CLIENTS (or of every
    registered client, the matrix's, when `every`): the browsers only with Chromium."""
    return [
        name
        for name in BUILTIN_CLIENTS
        if (every or name in DEFAULT_CLIENTS)
        and (not name.startswith("browser") or chromium_path() is not None)
        and (name not in NODE_CLIENTS or node_available())
    ]
