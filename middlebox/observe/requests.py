"""Observations grouped per logical request, shared by the scorer and the views.

A logical request is found in the upstream's ledger by the workload tag its prompt carries
(scenario.workload.request_tag); shown text is grouped into bursts the way a person sees
it: pieces that arrive within BURST_GAP of each other came from one proxy flush. Of the
tokens a request's generations made, those made after its client left reached nobody
(`tokens_wasted`); only the rest can be in the client's bursts (`tokens_reached`).
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

BURST_GAP = 0.010
"""Pieces shown within 10 ms of each other count as one burst (one proxy flush)."""


def ledger_for(ledger: Iterable[Mapping[str, Any]], tag: str) -> list[Mapping[str, Any]]:
    """Every generation the upstream ran for one logical request (matched by its tag)."""
    return [entry for entry in ledger if tag in json.dumps(entry.get("prompt"), ensure_ascii=False)]


WASTE_SLACK = 0.05
"""Tokens generated within 50 ms of the client leaving were already in flight, not waste."""


def tokens_after(entries: Iterable[Mapping[str, Any]], left_at: float) -> int:
    """Tokens the upstream generated after the client had stopped reading: for nobody.

    This sees waste the server cannot: behind a proxy that ignores the client's close,
    the server never learns the client left, so its own ledger counts nothing wasted.
    """
    return sum(
        1 for entry in entries for t in entry.get("token_times") or [] if t > left_at + WASTE_SLACK
    )


def tokens_wasted(entries: Sequence[Mapping[str, Any]], left_at: float | None) -> int:
    """Tokens of one request's generations that were generated for nobody: what the
    upstream's ledger counts after it saw the disconnect, or, when more, those generated
    after the client left (`left_at`, its result's `ended_at`; None: it never left)."""
    by_ledger = sum(int(entry.get("wasted_tokens") or 0) for entry in entries)
    after = tokens_after(entries, left_at) if left_at is not None else 0
    return max(by_ledger, after)


def tokens_reached(entries: Sequence[Mapping[str, Any]], left_at: float | None) -> int:
    """Tokens of one request's generations that could reach its client: all it generated
    less those generated for nobody. An abandoned request's upstream may go on to
    max_tokens (no abort, or a proxy that ignores the close); those tokens never reach
    the client, so they count in no measure of what the client saw (tokens per burst)."""
    generated = sum(_generated(entry) for entry in entries)
    return max(generated - tokens_wasted(entries, left_at), 0)


def _generated(entry: Mapping[str, Any]) -> int:
    """A generation's tokens: the ledger's count, else its token times."""
    count = entry.get("completion_tokens")
    return int(count) if count is not None else len(entry.get("token_times") or [])


def arrivals(times: Iterable[float]) -> list[float]:
    """The start of each burst of `times` (sorted; a gap over BURST_GAP starts one)."""
    starts: list[float] = []
    last: float | None = None
    for at in sorted(times):
        if last is None or at - last > BURST_GAP:
            starts.append(at)
        last = at
    return starts


def upstream_tokens_per_burst(entries: Iterable[Mapping[str, Any]]) -> float | None:
    """The upstream's own lumpiness: its tokens over the bursts their generation times
    fall in, per generation, by the rule the client's bursts are counted with. vLLM
    flushes every token, so this is 1 at an inter-token latency over BURST_GAP; at 5 ms a
    token a whole answer is one burst at its source, and a client that shows it in one
    burst shows it as smoothly as it was made. None when no token times are known."""
    tokens = bursts = 0
    for entry in entries:
        times = [float(t) for t in entry.get("token_times") or []]
        tokens += len(times)
        bursts += len(arrivals(times))
    return tokens / bursts if bursts else None
