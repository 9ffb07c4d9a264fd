"""The background proxy scores from its journals in memory, and says the same as the journal
file it would write."""

from __future__ import annotations

import json
import urllib.request
from pathlib import Path

import pytest

from middlebox.compose import load
from middlebox.observe.journal import facts, read_ndjson
from middlebox.run.background import start_background

pytestmark = pytest.mark.e2e

SCENARIO = """\
name: background-latency
seed: 2
path:
  - latency: {delay: 1ms}
upstream: {itl: 2ms, prefill_overhead: 5ms}
"""


def test_score_from_memory_matches_the_written_journal_and_names_what_fired(
    tmp_path: Path,
) -> None:
    (tmp_path / "scenario.yaml").write_text(SCENARIO)
    proxy = start_background(load(tmp_path / "scenario.yaml"), tmp_path)
    try:
        body = {"model": proxy.model, "prompt": "hi", "max_tokens": 4, "stream": True}
        request = urllib.request.Request(
            f"{proxy.base_url}/completions",
            data=json.dumps(body).encode(),
            headers={"Content-Type": "application/json"},
        )
        with urllib.request.urlopen(request, timeout=10) as response:
            received = response.read()
        assert received.endswith(b"data: [DONE]\n\n")
        score = proxy.score()
        from_file = facts(read_ndjson(proxy.write_journal(tmp_path / "journal.ndjson")))
        assert len(proxy.ledger()) == 1
    finally:
        proxy.close()
    assert {k: score[k] for k in from_file} == from_file
    assert score["connections"] == 1 and score["faults_fired"] == {"latency": 1}
    # every event the client received, [DONE] included, was journaled on the client leg
    assert score["sse_events_to_client"] == received.count(b"\n\n") >= 2
    assert score["faults_never_fired"] == []
    assert not proxy.emulator or not proxy.emulator.running()
