"""`resilient`: the reference client that does everything a streaming client should.

- Timeouts derived from `max_tokens`: a connect timeout, a first-event timeout (queueing
  and prefill), a stall timeout between reads once events flow (any byte, including a
  `: keep-alive` comment, proves the server alive), and a total bound per attempt of
  first-event + max_tokens x per-token budget.
- Completion is proven, not assumed: a stream must carry a `finish_reason` (or `[DONE]`).
  A stream that ends without them (clean close, truncated chunked body, RST, stall) is a
  detected truncation: retried, and surfaced as `TruncatedStream` when retries run out.
- Bounded retries with exponential backoff and jitter that honour `Retry-After` /
  `retry-after-ms` on 429 and 503 (retrying 408, 409, 429 and 5xx like openai-python's
  `_should_retry`). The retry budget refills when an attempt made progress, under a hard
  cap on attempts, so amplification stays bounded.
- In-band `{"error": ...}` frames (vLLM §2.3) are surfaced as `InBandError`; only the
  retryable codes (429, 503) are retried.
- Resume: when events carry `id:`, a reconnect resends the same request with
  `Last-Event-ID: <last id>` and echoes any response header whose name contains
  `stream-id`; replayed events at or before the last id are skipped, so nothing is shown
  twice. Without ids, a retry restarts and replaces the displayed text; so that the
  restart cannot contradict what the user already read, every request carries a `seed`
  (vLLM's per-request sampling seed) fixed for the logical request, and a sampling server
  draws the same continuation again (the seed article: "a naive retry can contradict what
  the user already read").
- UTF-8-safe reassembly: `middlebox.core.sse.SseFramer` decodes whole lines only.
- Leaving (abandonment) unwinds through the response context, which closes the
  connection at once.
- Agent streams: tool-call fragments are accumulated by `index` (kept across a resume,
  dropped with a restart) and a call runs only once the stream proved it complete (a
  `finish_reason` other than `length`) and its arguments parse as JSON
  (`IncompleteToolCall` otherwise, surfaced without running anything); each call carries an
  idempotency key derived from the logical request and the call's index and tool, the same
  on every attempt. A `response_format` answer is acted on only when it parses
  (`InvalidJson`). Reasoning is shown apart from the answer (`reasoning` in the result).

Tunable for tests and the runner through environment variables
(`MIDDLEBOX_RESILIENT_<FIELD>` for each `Policy` field, e.g. `..._STALL_TIMEOUT=2`).
"""

from __future__ import annotations

import asyncio
import dataclasses
import email.utils
import json
import os
import random
import time
import zlib
from collections.abc import AsyncIterator, Mapping
from contextlib import asynccontextmanager
from dataclasses import dataclass, field, fields
from typing import Any

import httpx

from middlebox.clients.agent_stream import ToolCallAccumulator, idempotency_key, wants_json
from middlebox.clients.contract import ClientEnv, Handler, Recorder, RequestSpec, run_client
from middlebox.clients.plain_http import auth_headers, event_info, show_answer, show_info
from middlebox.core.sse import SseEvent, SseFramer

RETRYABLE_STATUS = frozenset({408, 409, 429})
RETRYABLE_INBAND = frozenset({429, 503})
DEFAULT_MAX_TOKENS = 1024


@dataclass(frozen=True)
class Policy:
    connect_timeout: float = 5.0
    first_event_timeout: float = 30.0
    stall_timeout: float = 10.0
    per_token_budget: float = 0.2
    max_retries: int = 3
    max_attempts: int = 8
    backoff_base: float = 0.5
    backoff_cap: float = 8.0
    max_retry_after: float = 60.0

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None) -> Policy:
        env = os.environ if environ is None else environ
        values: dict[str, Any] = {}
        for f in fields(cls):
            raw = env.get(f"MIDDLEBOX_RESILIENT_{f.name.upper()}")
            if raw:
                values[f.name] = int(raw) if f.type == "int" else float(raw)
        return cls(**values)

    def attempt_bound(self, body: Mapping[str, Any]) -> float:
        max_tokens = body.get("max_tokens") or body.get("max_completion_tokens")
        tokens = max_tokens if isinstance(max_tokens, int) else DEFAULT_MAX_TOKENS
        return self.first_event_timeout + tokens * self.per_token_budget

    def backoff(self, failures: int, rng: random.Random) -> float:
        ceiling = min(self.backoff_cap, self.backoff_base * 2.0 ** (failures - 1))
        return ceiling * rng.uniform(0.5, 1.0)


class TruncatedStream(Exception):
    """The stream ended without finish_reason or [DONE]."""


class StalledStream(Exception):
    """No byte arrived within the stall (or first-event) timeout."""


class InBandError(Exception):
    """An `{"error": ...}` frame inside a 200 stream."""

    def __init__(self, message: str, code: int | None) -> None:
        super().__init__(f"{message} (code {code})" if code is not None else message)
        self.code = code


class IncompleteToolCall(Exception):
    """The stream ended a tool call without complete JSON arguments (or at max_tokens)."""


class InvalidJson(Exception):
    """A `response_format` answer that does not parse as JSON."""


@dataclass
class AgentTurn:
    """Tool calls streamed for one logical request; acted on once it proved complete."""

    calls: ToolCallAccumulator = field(default_factory=ToolCallAccumulator)

    def act(self, spec: RequestSpec, rec: Recorder) -> None:
        """Run the calls and use a JSON answer, or raise without running anything."""
        complete = rec.finish_reason not in (None, "length")
        parsed: list[tuple[int, str, Any]] = []
        for call in self.calls.ordered():
            ok, value = call.parsed()
            if not complete or not ok:
                raise IncompleteToolCall(
                    f"tool call {call.index} ({call.name}) ended with finish_reason "
                    f"{rec.finish_reason!r} and {'valid' if ok else 'incomplete'} arguments"
                )
            parsed.append((call.index, call.name, value))
        identity = json.dumps(spec.body, sort_keys=True)
        for index, name, value in parsed:
            rec.executed_tool_call(name, value, idempotency_key(identity, index, name), index)
        if wants_json(spec.body) and not self.calls.calls:
            try:
                value = json.loads(rec.text)
            except ValueError as exc:
                raise InvalidJson(f"the answer is not valid JSON: {rec.text[-60:]!r}") from exc
            if not complete:
                raise InvalidJson(f"the JSON answer ended with finish_reason {rec.finish_reason!r}")
            rec.acted_on_json(rec.text, value)


class StatusError(Exception):
    """A non-2xx response before the stream started."""

    def __init__(self, status: int, body: str, retry_after: float | None) -> None:
        super().__init__(f"HTTP {status}: {body[:300]}")
        self.status = status
        self.retry_after = retry_after


def parse_retry_after(headers: httpx.Headers, now: float) -> float | None:
    """`retry-after-ms` (OpenAI's extension), then `Retry-After` as delta-seconds or an
    HTTP-date (RFC 9110 §10.2.3)."""
    ms = headers.get("retry-after-ms")
    if ms:
        try:
            return max(0.0, float(ms) / 1000)
        except ValueError:
            pass
    value = headers.get("retry-after")
    if not value:
        return None
    try:
        return max(0.0, float(value))
    except ValueError:
        pass
    try:
        when = email.utils.parsedate_to_datetime(value)
    except (TypeError, ValueError):
        return None
    return max(0.0, when.timestamp() - now)


@dataclass
class ResumeState:
    """Event ids seen so far, and the stream-id header to echo, across attempts."""

    last_id: str | None = None
    seen: set[str] = field(default_factory=set)
    stream_id_header: tuple[str, str] | None = None

    def is_replay(self, event_id: str) -> bool:
        """Already shown: the same id, or a numeric id at or before the last one (a
        server may replay from the start or from the last id inclusive)."""
        if event_id in self.seen:
            return True
        if self.last_id is not None and event_id.isdigit() and self.last_id.isdigit():
            return int(event_id) <= int(self.last_id)
        return False

    def record(self, event_id: str) -> None:
        self.seen.add(event_id)
        self.last_id = event_id

    def remember_stream_id(self, response: httpx.Response) -> None:
        if self.stream_id_header is not None:
            return
        for raw_name, raw_value in response.headers.raw:
            name = raw_name.decode("latin-1")
            if "stream-id" in name.lower():
                self.stream_id_header = (name, raw_value.decode("latin-1"))
                return

    def headers(self) -> dict[str, str]:
        if self.last_id is None:
            return {}
        headers = {"Last-Event-ID": self.last_id}
        if self.stream_id_header is not None:
            headers[self.stream_id_header[0]] = self.stream_id_header[1]
        return headers


class _Attempt:
    """One HTTP request of a logical request."""

    def __init__(self, http: httpx.AsyncClient, env: ClientEnv, policy: Policy) -> None:
        self.http = http
        self.env = env
        self.policy = policy

    async def run(
        self, spec: RequestSpec, rec: Recorder, resume: ResumeState, turn: AgentTurn
    ) -> None:
        """Show what this attempt brings; raise what went wrong."""
        headers = {**auth_headers(self.env), "Accept": "text/event-stream", **resume.headers()}
        p = self.policy
        timeout = httpx.Timeout(p.first_event_timeout, connect=p.connect_timeout)
        async with self.http.stream(
            "POST", self.env.url(spec.endpoint), json=spec.body, headers=headers, timeout=timeout
        ) as response:
            if response.status_code >= 300:
                body = (await response.aread()).decode("utf-8", "replace")
                raise StatusError(
                    response.status_code, body, parse_retry_after(response.headers, time.time())
                )
            resume.remember_stream_id(response)
            if not spec.streaming:
                show_answer(rec, json.loads(await response.aread()))
                return
            await self._read_events(response, rec, resume, turn)

    async def _read_events(
        self, response: httpx.Response, rec: Recorder, resume: ResumeState, turn: AgentTurn
    ) -> None:
        framer = SseFramer()
        chunks = response.aiter_bytes().__aiter__()
        # Until the first event (vLLM sends the role chunk at TTFT), queueing and prefill
        # may be long; after it, tokens should flow, so silence soon means a stall.
        got_event = False
        while True:
            wait = self.policy.stall_timeout if got_event else self.policy.first_event_timeout
            try:
                async with asyncio.timeout(wait):
                    data = await anext(chunks)
            except StopAsyncIteration:
                break
            except TimeoutError:
                if rec.finish_reason is not None:
                    return  # complete; only the [DONE] or the body's end went missing
                raise StalledStream(f"no data for {wait:g} s") from None
            for piece in framer.feed(data):
                if piece.event is None:
                    continue
                got_event = True
                if self._on_event(piece.event, rec, resume, turn):
                    return
        if rec.finish_reason is None and not rec.saw_done:
            raise TruncatedStream(
                f"stream ended without finish_reason or [DONE] after {rec.tokens_shown} pieces"
            )

    @staticmethod
    def _on_event(
        event: SseEvent, rec: Recorder, resume: ResumeState, turn: AgentTurn | None = None
    ) -> bool:
        """Show one event; True at [DONE]."""
        if event.id is not None:
            if resume.is_replay(event.id):
                return False
            resume.record(event.id)
        if event.data == "[DONE]":
            rec.saw_done = True
            return True
        try:
            info = event_info(event.data)
        except ValueError as exc:
            raise TruncatedStream(f"malformed event data: {event.data[:80]!r}") from exc
        if info.error is not None:
            raise InBandError(info.error, info.error_code)
        if turn is not None:
            turn.calls.feed(info.tool_calls)
        show_info(rec, info)
        return False


def _retry_delay(exc: Exception, failures: int, policy: Policy, rng: random.Random) -> float | None:
    """Seconds to wait before retrying, or None when the error must be surfaced."""
    if isinstance(exc, StatusError):
        if exc.status not in RETRYABLE_STATUS and exc.status < 500:
            return None
        if exc.retry_after is not None and exc.status in (429, 503):
            return exc.retry_after if exc.retry_after <= policy.max_retry_after else None
    elif isinstance(exc, InBandError):
        if exc.code not in RETRYABLE_INBAND:
            return None
    elif not isinstance(exc, TruncatedStream | StalledStream | httpx.TransportError):
        return None
    return policy.backoff(failures, rng)


def with_pinned_seed(spec: RequestSpec) -> RequestSpec:
    """The request with a `seed` of its own unless it has one: the same for every attempt of
    this logical request (derived from its body), so a restart redraws nothing."""
    if "seed" in spec.body:
        return spec
    digest = zlib.crc32(json.dumps(spec.body, sort_keys=True).encode("utf-8"))
    return dataclasses.replace(spec, body={**spec.body, "seed": digest & 0x7FFFFFFF})


@asynccontextmanager
async def session(env: ClientEnv, policy: Policy | None = None) -> AsyncIterator[Handler]:
    policy = policy or Policy.from_env()
    limits = httpx.Limits(max_connections=None, max_keepalive_connections=32)
    async with httpx.AsyncClient(limits=limits) as http:
        attempt = _Attempt(http, env, policy)

        async def handle(spec: RequestSpec, rec: Recorder) -> None:
            spec = with_pinned_seed(spec)
            # Jitter is seeded per request, so reruns of a workload wait the same.
            rng = random.Random(spec.index)
            bound = policy.attempt_bound(spec.body)
            deadline = time.monotonic() + 2 * bound
            resume = ResumeState()
            turn = AgentTurn()
            failures = 0
            while True:
                rec.attempts += 1
                shown_before = rec.tokens_shown
                try:
                    async with asyncio.timeout(min(bound, deadline - time.monotonic())):
                        await attempt.run(spec, rec, resume, turn)
                    turn.act(spec, rec)
                    return
                except TimeoutError:
                    error: Exception = StalledStream(f"attempt exceeded its {bound:g} s bound")
                except (StatusError, InBandError) as exc:
                    error = exc
                except (TruncatedStream, StalledStream, httpx.TransportError) as exc:
                    error = exc
                if rec.finish_reason is not None and not isinstance(error, InBandError):
                    turn.act(spec, rec)
                    return  # the answer is complete; only [DONE] or usage went missing
                # Resumed progress keeps what was shown, so it earns a fresh retry budget;
                # a restart throws its progress away, so it does not.
                resumed_progress = resume.last_id is not None and rec.tokens_shown > shown_before
                failures = 1 if resumed_progress else failures + 1
                delay = _retry_delay(error, failures, policy, rng)
                if (
                    delay is None
                    or failures > policy.max_retries
                    or rec.attempts >= policy.max_attempts
                    or time.monotonic() + delay >= deadline
                ):
                    raise error
                await asyncio.sleep(delay)
                if resume.last_id is not None:
                    rec.resumes += 1
                else:
                    rec.replace()
                    turn = AgentTurn()  # a restart streams its calls from the start

        yield handle


def main() -> int:
    return run_client("resilient", session)


if __name__ == "__main__":
    raise SystemExit(main())
