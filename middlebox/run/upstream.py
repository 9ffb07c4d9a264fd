"""The one client of the upstream's own HTTP API (not the traffic under test).

`UpstreamClient(base_url)` asks an OpenAI-compatible server (the emulator, a real vLLM, a
gateway) directly, never through the proxy, so its questions are no connection in a
journal: the first model (`GET /v1/models`), the emulator's ledger of generations
(`GET /emulator/requests`), and vLLM's Prometheus counters (`GET /metrics`, read by
`middlebox.observe.prometheus`). Calls are synchronous (`urllib`, bounded by
`HTTP_TIMEOUT`); trio code uses the `a*` helpers, which run them in a worker thread.
"""

from __future__ import annotations

import json
import time
import urllib.error
import urllib.request
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any, TypeVar

import trio

from middlebox.observe.prometheus import totals

HTTP_TIMEOUT = 10.0
LEDGER_SETTLE_TIMEOUT = 15.0
# vLLM's counters (vllm/v1/metrics/loggers.py) that scoring a real server reads
GENERATION_TOKENS = "vllm:generation_tokens_total"
RUNNING = "vllm:num_requests_running"
# /metrics is read back to back with this pause between reads: a read of vLLM's /metrics
# takes ~8 ms here, so samples land every ~10-20 ms, finer than the tens of milliseconds
# an abort takes (docs/real-vllm.md).
SAMPLE_INTERVAL = 0.002

T = TypeVar("T")


class UpstreamError(Exception):
    """The upstream did not answer a question about itself; the message says which."""


@dataclass(frozen=True)
class UpstreamClient:
    base_url: str

    def json(self, path: str, method: str = "GET") -> Any:
        data = b"" if method == "POST" else None
        request = urllib.request.Request(self.base_url + path, method=method, data=data)
        with urllib.request.urlopen(request, timeout=HTTP_TIMEOUT) as response:
            return json.loads(response.read() or b"null")

    def text(self, path: str) -> str:
        with urllib.request.urlopen(self.base_url + path, timeout=HTTP_TIMEOUT) as response:
            return str(response.read().decode("utf-8", "replace"))

    def model(self) -> str:
        """The first model the upstream lists."""
        try:
            return str(self.json("/v1/models")["data"][0]["id"])
        except (OSError, KeyError, IndexError, TypeError, ValueError) as error:
            raise UpstreamError(
                f"cannot list models at {self.base_url}/v1/models: {error}"
            ) from None

    def context(self) -> int | None:
        """The first model's `max_model_len` (vLLM's /v1/models lists it), or None."""
        try:
            length = self.json("/v1/models")["data"][0].get("max_model_len")
        except (OSError, KeyError, IndexError, TypeError, ValueError, AttributeError):
            return None
        return length if isinstance(length, int) and length > 0 else None

    def ledger(self) -> list[dict[str, Any]]:
        """The emulator's ledger: one entry per generation (see docs/emulator.md)."""
        return list(self.json("/emulator/requests")["requests"])

    def keeps_background_responses(self, model: str) -> bool:
        """Whether the upstream takes a background Responses request (vLLM does only when
        started with VLLM_ENABLE_RESPONSES_API_STORE=1: else a 400 names the variable).
        The question is a one-token background response, answered `queued` at once."""
        body = {
            "model": model, "input": "ping", "max_output_tokens": 1,
            "background": True, "store": True,
        }  # fmt: skip
        request = urllib.request.Request(
            self.base_url + "/v1/responses", method="POST", data=json.dumps(body).encode(),
            headers={"Content-Type": "application/json"},
        )  # fmt: skip
        try:
            with urllib.request.urlopen(request, timeout=HTTP_TIMEOUT) as response:
                return bool(response.status == 200)
        except urllib.error.HTTPError:
            return False
        except OSError as error:
            raise UpstreamError(
                f"cannot ask {self.base_url}/v1/responses for a background response: {error}"
            ) from None

    def metrics(self) -> dict[str, float] | None:
        """vLLM's /metrics summed over label sets, or None when the upstream has none."""
        try:
            return totals(self.text("/metrics"))
        except (OSError, ValueError):
            return None


def settled(ledger: list[dict[str, Any]]) -> bool:
    """Every generation has finished or been aborted."""
    return all(entry.get("finished_at") or entry.get("aborted_at") for entry in ledger)


async def amodel(upstream: UpstreamClient) -> str:
    return await trio.to_thread.run_sync(upstream.model)


async def acontext(upstream: UpstreamClient) -> int | None:
    return await trio.to_thread.run_sync(upstream.context)


async def akeeps_background_responses(upstream: UpstreamClient, model: str) -> bool:
    return await trio.to_thread.run_sync(upstream.keeps_background_responses, model)


async def ametrics(upstream: UpstreamClient) -> dict[str, float] | None:
    return await trio.to_thread.run_sync(upstream.metrics)


async def settled_ledger(
    upstream: UpstreamClient, wait: float = LEDGER_SETTLE_TIMEOUT
) -> list[dict[str, Any]]:
    """The ledger once every generation has finished or been aborted (bounded wait)."""
    ledger: list[dict[str, Any]] = []
    with trio.move_on_after(wait):
        while True:
            ledger = await trio.to_thread.run_sync(upstream.ledger)
            if settled(ledger):
                break
            await trio.sleep(0.1)
    return ledger


async def metered(upstream: UpstreamClient, run: Any) -> tuple[Any, dict[str, Any]]:
    """Await `run()` against a real vLLM and read its /metrics around it: the tokens it
    generated, and those generated after the client had finished (for nobody), once vLLM
    reports no running request (bounded wait)."""
    before = await ametrics(upstream)
    outcome = await run()
    ended = await ametrics(upstream)
    after = ended
    with trio.move_on_after(LEDGER_SETTLE_TIMEOUT):
        while after is not None and after.get(RUNNING, 0.0) > 0:
            await trio.sleep(0.1)
            after = await ametrics(upstream)
    if before is None or ended is None or after is None or GENERATION_TOKENS not in before:
        return outcome, {}
    return outcome, {
        "server.tokens_generated": int(after[GENERATION_TOKENS] - before[GENERATION_TOKENS]),
        "server.tokens_wasted": int(max(after[GENERATION_TOKENS] - ended[GENERATION_TOKENS], 0)),
    }


@dataclass(frozen=True)
class MetricsSample:
    """One read of a real vLLM's /metrics: when (wall clock, midway through the read, so
    it lines up with the journal and the clients' result files), the requests running
    and the generation tokens counted so far."""

    at: float
    running: float
    generated: float


def sample_of(metrics: dict[str, float] | None, began: float, ended: float) -> MetricsSample | None:
    if metrics is None or GENERATION_TOKENS not in metrics:
        return None
    return MetricsSample((began + ended) / 2, metrics.get(RUNNING, 0.0), metrics[GENERATION_TOKENS])


def quiet(samples: list[MetricsSample]) -> bool:
    """Nothing runs and the token counter stood still over the last two samples."""
    return (
        len(samples) >= 2
        and samples[-1].running == 0
        and samples[-1].generated == samples[-2].generated
    )


async def sampled(
    upstream: UpstreamClient,
    run: Callable[[], Awaitable[T]],
    interval: float = SAMPLE_INTERVAL,
    settle: float = LEDGER_SETTLE_TIMEOUT,
) -> tuple[T, list[MetricsSample]]:
    """Await `run()` while reading vLLM's /metrics back to back, and go on reading after it
    until nothing runs and the counter stands still (bounded by `settle`): the samples
    a real server's side is scored from (`middlebox.run.score.real_server_metrics`).
    An upstream without vLLM's counters gives no samples."""
    samples: list[MetricsSample] = []

    async def read_one() -> MetricsSample | None:
        began = time.time()
        metrics = await ametrics(upstream)
        found = sample_of(metrics, began, time.time())
        if found is not None:
            samples.append(found)
        return found

    if await read_one() is None:
        return await run(), []

    async def keep_reading() -> None:
        while True:
            await read_one()
            await trio.sleep(interval)

    async with trio.open_nursery() as nursery:
        nursery.start_soon(keep_reading)
        outcome = await run()
        with trio.move_on_after(settle):
            while True:
                if quiet(samples):
                    break
                await trio.sleep(interval)
        nursery.cancel_scope.cancel()
    return outcome, samples


PACE_TOKENS = 48


@dataclass(frozen=True)
class Pace:
    """How fast a real server generates now, and how it frames what it generates."""

    seconds_per_token: float
    tokens_per_frame: float
    """Generated tokens per token-bearing SSE frame: 1 on an idle vLLM (`--stream-interval
    1`), more when its API server falls behind the engine (vLLM V1's output collector
    merges the deltas its consumer has not taken yet into one chunk: measured here, 40
    tokens in 14 frames on the 2 loaded cores)."""


def pace(upstream: UpstreamClient, model: str, tokens: int = PACE_TOKENS) -> Pace | None:
    """One streamed chat completion of `tokens` tokens (`ignore_eos`, a vLLM sampling
    parameter, so it is exactly that long), timed from asking to its end. None when the
    server does not stream so."""
    body = {
        "model": model,
        "messages": [{"role": "user", "content": "pace"}],
        "max_tokens": tokens,
        "stream": True,
        "ignore_eos": True,
        "stream_options": {"include_usage": True},
    }
    request = urllib.request.Request(
        upstream.base_url + "/v1/chat/completions",
        data=json.dumps(body).encode(),
        headers={"Content-Type": "application/json"},
    )
    began = time.time()
    frames = 0
    try:
        with urllib.request.urlopen(request, timeout=HTTP_TIMEOUT * 3) as response:
            for line in response:
                if line.startswith(b"data: {") and b'"content"' in line and b'"role"' not in line:
                    frames += 1
                elif line.startswith(b"data: {") and b'"usage"' in line:
                    usage = json.loads(line[len(b"data: ") :]).get("usage") or {}
                    tokens = int(usage.get("completion_tokens") or tokens)
    except (OSError, ValueError):
        return None
    if not frames:
        return None
    # The whole request over its tokens (not its frames, which merge under load); chunks
    # arrive in bursts (several per read), so gaps between arrivals say nothing; a short
    # prompt's prefill is a token's worth.
    return Pace((time.time() - began) / tokens, max(tokens / frames, 1.0))


def seconds_per_token(
    upstream: UpstreamClient, model: str, tokens: int = PACE_TOKENS
) -> float | None:
    measured = pace(upstream, model, tokens)
    return None if measured is None else measured.seconds_per_token


async def apace(upstream: UpstreamClient, model: str) -> Pace | None:
    return await trio.to_thread.run_sync(pace, upstream, model)


async def aseconds_per_token(upstream: UpstreamClient, model: str) -> float | None:
    return await trio.to_thread.run_sync(seconds_per_token, upstream, model)
