"""Observations grouped per logical request, shared by the scorer and the views.

A logical request is found in the upstream's ledger by the workload tag its prompt carries
(scenario.workload.request_tag); shown text is grouped into bursts the way a person sees
it: pieces that arrive within BURST_GAP of each other came from one proxy flush.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from typing import Any

BURST_GAP = 0.010
"""Pieces shown within 10 ms of each other count as one burst (one proxy flush)."""


def ledger_for(ledger: Iterable[Mapping[str, Any]], tag: str) -> list[Mapping[str, Any]]:
    """Every generation the upstream ran for one logical request (matched by its tag)."""
    return [entry for entry in ledger if tag in json.dumps(entry.get("prompt"), ensure_ascii=False)]
