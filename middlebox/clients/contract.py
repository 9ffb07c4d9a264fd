"""The client result contract, written once for every built-in client.

A client under test is a process (see `middlebox.clients` for the contract in full). This
module holds what all built-in clients share: reading the environment and the workload,
running the requests with their concurrency, start times and abandonment, recording what
was shown and when, writing the result atomically, and OpenAI chunk extraction. The
clients that parse the wire themselves (`raw`, `resilient`) split it with the project's
WHATWG framer, `middlebox.core.sse.SseFramer`, which cuts on bytes and decodes whole lines, so
a multi-byte character split across reads never becomes U+FFFD.

Only asyncio is used here: clients are separate processes from the trio proxy, and the
design keeps each module on one event loop.
"""

from __future__ import annotations

import asyncio
import json
import os
import sys
import time
import traceback
from collections.abc import Awaitable, Callable, Mapping
from contextlib import AbstractAsyncContextManager
from dataclasses import dataclass, field
from typing import Any, Literal, NoReturn

Endpoint = Literal["chat", "completions"]

ENDPOINT_PATHS: dict[str, str] = {"chat": "/chat/completions", "completions": "/completions"}


class ContractError(ValueError):
    """The environment or the workload file does not follow the contract."""


class Abandoned(BaseException):
    """The simulated user stopped reading (abandon_after_tokens).

    A BaseException, like `asyncio.CancelledError`, so that a client's own
    `except Exception` (retry loops, SDK error handling) cannot swallow it: it must
    unwind through every `async with` so the connection is closed at once.
    """


# ---------------------------------------------------------------------------------------
# Environment and workload


@dataclass(frozen=True)
class ClientEnv:
    """The four environment variables of the contract."""

    base_url: str
    api_key: str
    workload_path: str
    result_path: str

    @classmethod
    def from_environ(cls, environ: Mapping[str, str] | None = None) -> ClientEnv:
        env = os.environ if environ is None else environ
        missing = [
            name
            for name in ("OPENAI_BASE_URL", "MIDDLEBOX_WORKLOAD", "MIDDLEBOX_RESULT")
            if not env.get(name)
        ]
        if missing:
            raise ContractError(f"missing environment variable(s): {', '.join(missing)}")
        return cls(
            base_url=env["OPENAI_BASE_URL"].rstrip("/"),
            # The openai SDK refuses to start without a key; vLLM without --api-key ignores it.
            api_key=env.get("OPENAI_API_KEY") or "EMPTY",
            workload_path=env["MIDDLEBOX_WORKLOAD"],
            result_path=env["MIDDLEBOX_RESULT"],
        )

    def url(self, endpoint: str) -> str:
        return self.base_url + ENDPOINT_PATHS[endpoint]


@dataclass(frozen=True)
class RequestSpec:
    """One logical request of the workload."""

    index: int
    endpoint: Endpoint
    body: dict[str, Any]
    start_after: float = 0.0
    abandon_after_tokens: int | None = None
    abandon_after_seconds: float | None = None

    @property
    def streaming(self) -> bool:
        return bool(self.body.get("stream", False))

    @classmethod
    def from_json(cls, raw: Any) -> RequestSpec:
        if not isinstance(raw, dict):
            raise ContractError(f"a request must be an object, got {raw!r}")
        endpoint = raw.get("endpoint", "chat")
        if endpoint not in ENDPOINT_PATHS:
            raise ContractError(f"endpoint must be 'chat' or 'completions', got {endpoint!r}")
        body = raw.get("body")
        if not isinstance(body, dict):
            raise ContractError(f"request {raw.get('index')!r}: body must be an object")
        tokens = raw.get("abandon_after_tokens")
        seconds = raw.get("abandon_after_seconds")
        if tokens is not None and (not isinstance(tokens, int) or tokens < 1):
            raise ContractError(f"abandon_after_tokens must be a positive int, got {tokens!r}")
        if seconds is not None and (not isinstance(seconds, int | float) or seconds <= 0):
            raise ContractError(f"abandon_after_seconds must be positive, got {seconds!r}")
        return cls(
            index=int(raw["index"]),
            endpoint=endpoint,
            body=body,
            start_after=float(raw.get("start_after") or 0.0),
            abandon_after_tokens=tokens,
            abandon_after_seconds=None if seconds is None else float(seconds),
        )


@dataclass(frozen=True)
class Workload:
    scenario: str
    concurrency: int
    requests: tuple[RequestSpec, ...]

    @classmethod
    def from_json(cls, raw: Any) -> Workload:
        if not isinstance(raw, dict) or not isinstance(raw.get("requests"), list):
            raise ContractError("a workload is an object with a 'requests' list")
        concurrency = raw.get("concurrency", 1)
        if not isinstance(concurrency, int) or concurrency < 1:
            raise ContractError(f"concurrency must be >= 1, got {concurrency}")
        requests = tuple(RequestSpec.from_json(r) for r in raw["requests"])
        if len({r.index for r in requests}) != len(requests):
            raise ContractError("request indexes must be unique")
        return cls(str(raw.get("scenario", "")), concurrency, requests)

    @classmethod
    def load(cls, path: str) -> Workload:
        with open(path, encoding="utf-8") as f:
            return cls.from_json(json.load(f))


# ---------------------------------------------------------------------------------------
# What a client shows, and the result file


@dataclass
class Recorder:
    """What one logical request showed the user, and when; becomes one result entry.

    Invariant: `text == "".join(piece for _, piece in chunks)`. A client that restarts a
    request and replaces what it displayed calls `replace()`, which clears both.
    """

    spec: RequestSpec
    started_at: float = 0.0
    ended_at: float = 0.0
    pieces: list[str] = field(default_factory=list)
    chunks: list[tuple[float, str]] = field(default_factory=list)
    finish_reason: str | None = None
    error: str | None = None
    usage: dict[str, Any] | None = None
    attempts: int = 0
    resumes: int = 0
    saw_done: bool = False
    abandoned: bool = False
    # Agent streams (optional in the result; old clients stay valid): the tool calls the
    # client executed, the JSON it acted on, and the reasoning it showed apart from `text`.
    tool_calls_executed: list[dict[str, Any]] = field(default_factory=list)
    json_acted_on: list[dict[str, Any]] = field(default_factory=list)
    reasoning: list[tuple[float, str]] = field(default_factory=list)

    @property
    def text(self) -> str:
        return "".join(self.pieces)

    @property
    def tokens_shown(self) -> int:
        return len(self.chunks)

    def show(self, piece: str) -> None:
        """Display a text piece now; raise Abandoned once the user has read enough."""
        if not piece:
            return
        self.shown_at(time.time(), piece)
        limit = self.spec.abandon_after_tokens
        if limit is not None and self.tokens_shown >= limit:
            raise Abandoned

    def shown_at(self, when: float, piece: str) -> None:
        """Record a piece displayed at `when` (a time.time() value) elsewhere, e.g. in a page."""
        self.pieces.append(piece)
        self.chunks.append((when, piece))

    def show_reasoning(self, piece: str) -> None:
        """Display a reasoning piece now, apart from the answer (a "thinking" pane)."""
        if piece:
            self.reasoning.append((time.time(), piece))

    def executed_tool_call(
        self, name: str, arguments: Any, idempotency_key: str | None, index: int | None = None
    ) -> None:
        """Record a tool call the client ran (its side effect happened now)."""
        self.tool_calls_executed.append(
            {
                "name": name,
                "arguments": arguments,
                "idempotency_key": idempotency_key,
                "index": index,
                "at": time.time(),
            }
        )

    def acted_on_json(self, text: str, value: Any) -> None:
        """Record JSON the client acted on: the text it parsed and the value it used."""
        self.json_acted_on.append({"text": text, "value": value, "at": time.time()})

    def replace(self) -> None:
        """Forget what was shown: a restarted request redraws its answer from scratch.
        Executed tool calls and acted-on JSON stay: their side effects already happened."""
        self.pieces.clear()
        self.chunks.clear()
        self.reasoning.clear()
        self.finish_reason = None
        self.usage = None
        self.saw_done = False

    def to_json(self) -> dict[str, Any]:
        return {
            "index": self.spec.index,
            "text": self.text,
            "finish_reason": self.finish_reason,
            "error": self.error,
            "usage": self.usage,
            "chunks": [[t, piece] for t, piece in self.chunks],
            "started_at": self.started_at,
            "ended_at": self.ended_at,
            "attempts": self.attempts,
            "resumes": self.resumes,
            "saw_done": self.saw_done,
            "abandoned": self.abandoned,
            **self.agent_json(),
        }

    def agent_json(self) -> dict[str, Any]:
        """The optional agent fields, present only when the client has something to say."""
        out: dict[str, Any] = {}
        if self.tool_calls_executed:
            out["tool_calls_executed"] = list(self.tool_calls_executed)
        if self.json_acted_on:
            out["json_acted_on"] = list(self.json_acted_on)
        if self.reasoning:
            out["reasoning"] = [[t, piece] for t, piece in self.reasoning]
        return out


def describe_error(exc: BaseException) -> str:
    """The contract's error string: "ExceptionType: message" as a user would see it."""
    message = str(exc)
    return f"{type(exc).__name__}: {message}" if message else type(exc).__name__


def write_result(path: str, client: str, records: list[Recorder]) -> None:
    """Write the result file atomically (temp file in the same directory, then rename),
    so a runner polling for it never reads half a file."""
    payload = {
        "client": client,
        "results": [r.to_json() for r in sorted(records, key=lambda r: r.spec.index)],
    }
    directory = os.path.dirname(os.path.abspath(path))
    tmp = os.path.join(directory, f".{os.path.basename(path)}.{os.getpid()}.tmp")
    with open(tmp, "w", encoding="utf-8") as f:
        json.dump(payload, f, ensure_ascii=False)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


# ---------------------------------------------------------------------------------------
# Running a workload

Handler = Callable[[RequestSpec, Recorder], Awaitable[None]]
"""Runs one logical request, recording into the Recorder; raises what it surfaces."""

Session = Callable[[ClientEnv], AbstractAsyncContextManager[Handler]]
"""Opens the client's shared state (an HTTP client, an SDK client) and yields its Handler."""


async def _run_one(spec: RequestSpec, rec: Recorder, handler: Handler, self_timed: bool) -> None:
    rec.started_at = time.time()
    deadline = asyncio.timeout(None if self_timed else spec.abandon_after_seconds)
    try:
        async with deadline:
            await handler(spec, rec)
    except Abandoned:
        rec.abandoned = True
    except TimeoutError as exc:
        if deadline.expired():
            rec.abandoned = True
        else:
            rec.error = describe_error(exc)
    except Exception as exc:  # what the client surfaced to its user
        rec.error = describe_error(exc)
    finally:
        rec.ended_at = time.time()


async def run_workload(
    workload: Workload, handler: Handler, *, self_timed: bool = False
) -> list[Recorder]:
    """Run every request: each starts no earlier than `start_after` seconds after the
    client started, and at most `concurrency` are in flight at once.

    `abandon_after_seconds` is enforced here by cancelling the handler, unless
    `self_timed`: then the handler leaves on time itself (the browser client, whose
    requests live in the page) and records `abandoned`."""
    loop = asyncio.get_running_loop()
    t0 = loop.time()
    slots = asyncio.Semaphore(workload.concurrency)
    records = [Recorder(spec) for spec in workload.requests]

    async def one(rec: Recorder) -> None:
        await asyncio.sleep(max(0.0, t0 + rec.spec.start_after - loop.time()))
        async with slots:
            await _run_one(rec.spec, rec, handler, self_timed)

    # Requests are queued in start order so that a later one never takes a slot first.
    ordered = sorted(records, key=lambda r: (r.spec.start_after, r.spec.index))
    async with asyncio.TaskGroup() as tg:
        for rec in ordered:
            tg.create_task(one(rec))
    return records


def run_client(
    name: str,
    session: Session,
    environ: Mapping[str, str] | None = None,
    *,
    self_timed: bool = False,
) -> int:
    """The `main()` of a built-in client: read the contract, run, write the result.

    Exits 0 whenever the result file was written, whatever the requests' errors (those
    are data for the scorer); 2 when the environment or workload breaks the contract.
    """
    try:
        env = ClientEnv.from_environ(environ)
        workload = Workload.load(env.workload_path)
    except (ContractError, OSError, json.JSONDecodeError, KeyError, TypeError) as exc:
        print(f"{name}: {describe_error(exc)}", file=sys.stderr)
        return 2

    async def main() -> list[Recorder]:
        async with session(env) as handler:
            return await run_workload(workload, handler, self_timed=self_timed)

    try:
        records = asyncio.run(main())
    except BaseException:
        traceback.print_exc()
        return 1
    write_result(env.result_path, name, records)
    return 0


def run_client_and_leave(name: str, session: Session) -> NoReturn:
    """`run_client`, then leave at once (`os._exit`) once the result is written.

    For the heavy libraries (LangChain, LiteLLM): their exit hooks (background logging and
    telemetry workers) can hold the interpreter for tens of seconds, which the runner
    would count against the scenario's bound as a hang the user never saw."""
    code = run_client(name, session)
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


def split_options(body: Mapping[str, Any], named: set[str], consumed: set[str]) -> dict[str, Any]:
    """Keyword arguments for a library call from a request body: the fields the library
    names itself as they are, the ones the call consumes left out, the rest sent as
    `extra_body` (the openai SDK's way through, which LangChain and LiteLLM pass on)."""
    options = {k: v for k, v in body.items() if k in named}
    extra = {k: v for k, v in body.items() if k not in named | consumed}
    if extra:
        options["extra_body"] = extra
    return options


# ---------------------------------------------------------------------------------------
# OpenAI stream chunks


@dataclass(frozen=True)
class ChunkInfo:
    """What a client shows from one OpenAI stream chunk (choice 0 only: n=1 is assumed)."""

    text: str = ""
    finish_reason: str | None = None
    usage: dict[str, Any] | None = None
    error: str | None = None
    """The message of an in-band `{"error": ...}` frame (vLLM §2.3), else None."""
    error_code: int | None = None
    reasoning: str = ""
    """`delta.reasoning` (vLLM 0.32's field) or `delta.reasoning_content` (older parsers)."""
    tool_calls: tuple[dict[str, Any], ...] = ()
    """`delta.tool_calls` entries as sent: `index`, then `id`/`type`/`function.name` in the
    first, `function.arguments` fragments after (tool-call-named-stream.txt)."""


def chunk_info(obj: Any) -> ChunkInfo:
    """Extract text, finish_reason, usage or an in-band error from a decoded chunk.

    Chat chunks carry `choices[0].delta.content`, completions chunks `choices[0].text`.
    The usage chunk has `choices: []`. Anything else yields an empty ChunkInfo.
    """
    if not isinstance(obj, dict):
        return ChunkInfo()
    err = obj.get("error")
    if err:
        if isinstance(err, dict):
            code = err.get("code")
            message = str(err.get("message") or "An error occurred during streaming")
            return ChunkInfo(error=message, error_code=code if isinstance(code, int) else None)
        return ChunkInfo(error=str(err))
    usage = obj.get("usage") if isinstance(obj.get("usage"), dict) else None
    text = reasoning = ""
    finish = None
    tool_calls: list[dict[str, Any]] = []
    choices = obj.get("choices")
    if isinstance(choices, list):
        for choice in choices:
            if not isinstance(choice, dict) or choice.get("index", 0) != 0:
                continue
            delta = choice.get("delta")
            piece = delta.get("content") if isinstance(delta, dict) else choice.get("text")
            text += piece if isinstance(piece, str) else ""
            if isinstance(delta, dict):
                thought = delta.get("reasoning") or delta.get("reasoning_content")
                reasoning += thought if isinstance(thought, str) else ""
                calls = delta.get("tool_calls")
                tool_calls += (
                    [c for c in calls if isinstance(c, dict)] if isinstance(calls, list) else []
                )
            if isinstance(choice.get("finish_reason"), str):
                finish = choice["finish_reason"]
    return ChunkInfo(
        text=text,
        finish_reason=finish,
        usage=usage,
        reasoning=reasoning,
        tool_calls=tuple(tool_calls),
    )


def apply_chunk(rec: Recorder, info: ChunkInfo) -> None:
    """Show a chunk's text and keep its finish_reason and usage."""
    if info.finish_reason is not None:
        rec.finish_reason = info.finish_reason
    if info.usage is not None:
        rec.usage = info.usage
    rec.show(info.text)


def non_stream_info(obj: Any) -> ChunkInfo:
    """A non-streaming response body (`stream: false`) as one ChunkInfo."""
    if isinstance(obj, dict) and isinstance(obj.get("choices"), list):
        for choice in obj["choices"]:
            if isinstance(choice, dict) and choice.get("index", 0) == 0:
                message = choice.get("message")
                piece = message.get("content") if isinstance(message, dict) else choice.get("text")
                return ChunkInfo(
                    text=piece if isinstance(piece, str) else "",
                    finish_reason=choice.get("finish_reason"),
                    usage=obj.get("usage") if isinstance(obj.get("usage"), dict) else None,
                )
    return chunk_info(obj)
