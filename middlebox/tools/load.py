"""`middlebox load`: many concurrent streaming chat completions, TTFT and ITL at the client.

Each of N users opens a connection, POSTs a streaming chat completion, reads the SSE
stream to its end and starts the next one, until the duration is over; requests in
flight then get `request_timeout` more seconds and are cancelled. Total requests are
capped too, so a run is bounded in time and in count.

It speaks HTTP/1.1 on trio sockets and reads the response with the project's own
passive framers (`middlebox.core.http1`, `middlebox.core.sse`), which cost far less per event
than a full HTTP client: a Python load generator at thousands of events per second
would otherwise eat the core the proxy under test needs (performance-anchors.md).
Still, for proxy-cost figures use the C load client in bench/; this tool measures
what a client sees, and `middlebox.tools.locustfile` spreads the same measurement over machines.

TTFT is from sending the request to the first event carrying content (vLLM's first
chunk carries only the role); ITL is the gap between consecutive content events.

A user whose request failed waits before its next one (`failure_backoff`: 50 ms, doubling
to 1 s, back to none after a success), so an upstream that refuses or 404s every request
gets a few requests a second per user instead of thousands, and its log a readable count;
a stream cut by a fault after seconds of tokens waits only 50 ms, so a faulted run's load
stays nearly what was asked for.
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import trio

from middlebox.core.http1 import Http1Framer, PieceKind
from middlebox.core.sse import SseFramer

DEFAULT_PATH = "/v1/chat/completions"
# The model name the bundled emulator serves; a real vLLM needs its own (--model).
DEFAULT_MODEL = "middlebox/emulated-7b"
READ_SIZE = 65536
# After a failed request: the first wait, and the most a wait doubles to.
FIRST_BACKOFF = 0.05
MAX_BACKOFF = 1.0


def failure_backoff(previous: float) -> float:
    """How long a user waits after a failure, given its wait after the one before (0: the
    request before it succeeded): 50 ms, then doubling up to 1 s."""
    return min(MAX_BACKOFF, previous * 2) if previous else FIRST_BACKOFF


def locustfile_path() -> Path:
    """The installed locustfile (`locust -f PATH`): beside this module wherever the package
    is, a wheel's site-packages or a checkout."""
    return Path(__file__).with_name("locustfile.py")


def chat_body(model: str, prompt: str, max_tokens: int) -> dict[str, Any]:
    """The OpenAI-style streaming chat request both `middlebox load` and Locust send."""
    return {
        "model": model,
        "messages": [{"role": "user", "content": prompt}],
        "stream": True,
        "max_tokens": max_tokens,
    }


def event_text(data: str) -> str | None:
    """The content an SSE `data:` payload carries (chat delta or completion text);
    None for `[DONE]`, role-only or unparsable events."""
    if data == "[DONE]":
        return None
    try:
        obj = json.loads(data)
        choice = obj["choices"][0]
    except (ValueError, KeyError, IndexError, TypeError):
        return None
    if not isinstance(choice, dict):
        return None
    delta = choice.get("delta")
    text = delta.get("content") if isinstance(delta, dict) else choice.get("text")
    return text if isinstance(text, str) and text else None


class TokenClock:
    """Turns content events into TTFT and ITL, given when the request was sent."""

    def __init__(self, sent_at: float) -> None:
        self.sent_at = sent_at
        self.ttft: float | None = None
        self.last: float | None = None
        self.itls: list[float] = []
        self.tokens = 0
        self.done = False

    def event(self, data: str, now: float) -> None:
        if data == "[DONE]":
            self.done = True
            return
        if event_text(data) is None:
            return
        self.tokens += 1
        if self.last is None:
            self.ttft = now - self.sent_at
        else:
            self.itls.append(now - self.last)
        self.last = now


@dataclass
class Target:
    host: str
    port: int
    path: str

    @classmethod
    def parse(cls, url: str) -> Target:
        """An http:// URL's host, port (80 if none) and path; ValueError saying what it lacks."""
        parts = urlsplit(url)
        if parts.scheme != "http" or not parts.hostname:
            raise ValueError(f"expected an http:// URL such as http://127.0.0.1:9000, got {url!r}")
        try:
            port = parts.port
        except ValueError:
            port = 0
        if port == 0 or (port is None and parts.netloc.endswith(":")):
            raise ValueError(f"expected a port from 1 to 65535 to connect to, got {url!r}")
        path = parts.path if parts.path not in ("", "/") else DEFAULT_PATH
        return cls(parts.hostname, port or 80, path)

    def request(self, body: dict[str, Any]) -> bytes:
        payload = json.dumps(body).encode()
        host = f"[{self.host}]" if ":" in self.host else self.host
        head = (
            f"POST {self.path} HTTP/1.1\r\nHost: {host}:{self.port}\r\n"
            "Content-Type: application/json\r\nAccept: text/event-stream\r\n"
            f"Content-Length: {len(payload)}\r\nConnection: close\r\n\r\n"
        )
        return head.encode() + payload


@dataclass
class StreamResult:
    status: int | None = None
    ttft: float | None = None
    itls: list[float] = field(default_factory=list)
    tokens: int = 0
    done: bool = False
    error: str | None = None

    @property
    def ok(self) -> bool:
        return self.error is None and self.status == 200 and self.done


async def one_stream(target: Target, request: bytes) -> StreamResult:
    """One request on a fresh connection, read to the end of its response."""
    result = StreamResult()
    try:
        stream = await trio.open_tcp_stream(target.host, target.port)
    except OSError as error:
        result.error = f"connect: {error}"
        return result
    async with stream:
        clock = TokenClock(trio.current_time())
        http, sse = Http1Framer("response"), SseFramer()
        try:
            await stream.send_all(request)
            ended = False
            while not ended:
                data = await stream.receive_some(READ_SIZE)
                now = trio.current_time()
                pieces = http.feed(data) if data else http.feed_eof()
                ended = not data
                for piece in pieces:
                    if piece.head is not None and not piece.head.is_interim:
                        result.status = piece.head.status
                    if piece.kind is PieceKind.BODY and piece.data:
                        for line in sse.feed(piece.data):
                            if line.event is not None:
                                clock.event(line.event.data, now)
                    if piece.end_of_message and piece.head is None:
                        ended = True
        except (trio.BrokenResourceError, trio.ClosedResourceError) as error:
            result.error = f"connection broken: {error}"
        result.ttft, result.itls, result.tokens = clock.ttft, clock.itls, clock.tokens
        result.done = clock.done
        if result.error is None and result.status != 200:
            result.error = f"HTTP {result.status}"
        elif result.error is None and not result.done:
            result.error = "stream ended without [DONE]"
    return result


def percentiles(values: list[float]) -> dict[str, float | None]:
    """p50/p90/p99/max in milliseconds (nearest rank), None when there are no values."""
    if not values:
        return {"p50_ms": None, "p90_ms": None, "p99_ms": None, "max_ms": None}
    ordered = sorted(values)

    def rank(p: float) -> float:
        return ordered[min(len(ordered) - 1, max(0, math.ceil(p * len(ordered)) - 1))] * 1000

    return {
        "p50_ms": rank(0.5),
        "p90_ms": rank(0.9),
        "p99_ms": rank(0.99),
        "max_ms": ordered[-1] * 1000,
    }


@dataclass
class LoadReport:
    url: str
    streams: int
    duration_s: float
    requests: int = 0
    completed: int = 0
    errors: dict[str, int] = field(default_factory=dict)
    tokens: int = 0
    elapsed_s: float = 0.0
    ttfts: list[float] = field(default_factory=list, repr=False)
    itls: list[float] = field(default_factory=list, repr=False)

    def add(self, result: StreamResult) -> None:
        self.requests += 1
        self.tokens += result.tokens
        if result.ttft is not None:
            self.ttfts.append(result.ttft)
        self.itls.extend(result.itls)
        if result.ok:
            self.completed += 1
        else:
            kind = (result.error or "error").split(":")[0]
            self.errors[kind] = self.errors.get(kind, 0) + 1

    def to_json(self) -> dict[str, Any]:
        return {
            "url": self.url,
            "streams": self.streams,
            "duration_s": self.duration_s,
            "elapsed_s": round(self.elapsed_s, 3),
            "requests": self.requests,
            "completed": self.completed,
            "errors": self.errors,
            "tokens": self.tokens,
            "tokens_per_s": round(self.tokens / self.elapsed_s, 1) if self.elapsed_s else 0.0,
            "ttft": percentiles(self.ttfts),
            "itl": percentiles(self.itls),
        }

    def text(self) -> str:
        data = self.to_json()

        def row(name: str, p: dict[str, float | None]) -> str:
            cells = " ".join(
                f"{key[:-3]} {value:8.2f}" if value is not None else f"{key[:-3]}      n/a"
                for key, value in p.items()
            )
            return f"{name:5} ms  {cells}"

        errors = ", ".join(f"{k}: {v}" for k, v in self.errors.items()) or "none"
        return "\n".join(
            [
                f"{data['requests']} requests ({data['completed']} complete) on "
                f"{self.streams} streams in {data['elapsed_s']:.1f} s; "
                f"{data['tokens']} tokens ({data['tokens_per_s']}/s); errors: {errors}",
                row("TTFT", data["ttft"]),
                row("ITL", data["itl"]),
            ]
        )


@dataclass(frozen=True)
class LoadPlan:
    """What a load run does: `streams` users for `duration` seconds (then `request_timeout`
    at most to finish), starting `ramp` users per second, and at most `max_requests`
    requests, each a streaming chat completion of `max_tokens` for `prompt`."""

    url: str
    streams: int
    duration: float
    model: str = DEFAULT_MODEL
    prompt: str = "Tell me a story."
    max_tokens: int = 64
    ramp: float = 100.0
    max_requests: int = 100_000
    request_timeout: float = 60.0


async def run_load(
    url: str,
    streams: int,
    duration: float,
    *,
    progress: Callable[[LoadReport], None] | None = None,
    **options: Any,
) -> LoadReport:
    """`run_plan` of `LoadPlan(url, streams, duration, **options)` (options: its other
    fields), for callers inside a trio loop."""
    return await run_plan(LoadPlan(url, streams, duration, **options), progress)


async def run_plan(
    plan: LoadPlan, progress: Callable[[LoadReport], None] | None = None
) -> LoadReport:
    """Run the plan in the current trio loop; `progress` gets the report every second."""
    if plan.streams < 1 or plan.duration <= 0 or plan.ramp <= 0 or plan.max_requests < 1:
        raise ValueError("streams, duration, ramp and max_requests must be positive")
    target = Target.parse(plan.url)
    request = target.request(chat_body(plan.model, plan.prompt, plan.max_tokens))
    report = LoadReport(plan.url, plan.streams, plan.duration)
    started = trio.current_time()
    stop_starting = started + plan.duration
    budget = [plan.max_requests]

    async def user(index: int) -> None:
        await trio.sleep(index / plan.ramp)
        backoff = 0.0
        while trio.current_time() < stop_starting and budget[0] > 0:
            budget[0] -= 1
            with trio.move_on_at(stop_starting + plan.request_timeout) as scope:
                result = await one_stream(target, request)
            if scope.cancelled_caught:
                result = StreamResult(error="timeout: no end within the request timeout")
            report.add(result)
            backoff = 0.0 if result.ok else failure_backoff(backoff)
            if backoff:
                await trio.sleep_until(min(trio.current_time() + backoff, stop_starting))

    async def report_progress() -> None:
        while progress is not None:
            await trio.sleep(1.0)
            report.elapsed_s = trio.current_time() - started
            progress(report)

    async with trio.open_nursery() as nursery:
        nursery.start_soon(report_progress)
        async with trio.open_nursery() as users:
            for index in range(plan.streams):
                users.start_soon(user, index)
        nursery.cancel_scope.cancel()
    report.elapsed_s = trio.current_time() - started
    return report


def load_test(plan: LoadPlan, json_file: Path | None = None) -> LoadReport:
    """`middlebox load`: `run_plan` in its own trio loop; the report also written as JSON to
    `json_file` when given."""
    report = trio.run(run_plan, plan)
    if json_file is not None:
        json_file.write_text(json.dumps(report.to_json(), indent=2) + "\n")
    return report
