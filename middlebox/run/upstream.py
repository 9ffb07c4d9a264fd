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
import urllib.request
from dataclasses import dataclass
from typing import Any

import trio

from middlebox.observe.prometheus import totals

HTTP_TIMEOUT = 10.0
LEDGER_SETTLE_TIMEOUT = 15.0
# vLLM's counters (vllm/v1/metrics/loggers.py) that scoring a real server reads
GENERATION_TOKENS = "vllm:generation_tokens_total"
RUNNING = "vllm:num_requests_running"


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

    def ledger(self) -> list[dict[str, Any]]:
        """The emulator's ledger: one entry per generation (see docs/emulator.md)."""
        return list(self.json("/emulator/requests")["requests"])

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
