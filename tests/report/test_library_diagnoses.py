"""Across the scenario library, a buffering hop is diagnosed only where the path has one.

`data/library-facts.json` holds what the diagnosis reads of every scenario-client run of
`make run` (verdicts, faults fired, the symptom metrics), recorded from a real run of the
library on the embedded emulator. The diagnosis of each is checked against the scenario's
own path, loaded from the library (presets expanded): no buffering diagnosis without a
buffering fault in it, and one wherever the scenario pins lumps (`client.tokens_per_burst`
with a `min`). Rerecord after a change to the scorer or the library:

    .venv/bin/middlebox run --report reports/latest
    .venv/bin/python -m tests.report.test_library_diagnoses reports/latest/report.json
"""

from __future__ import annotations

import json
import sys
from functools import cache
from pathlib import Path
from typing import Any

import pytest

from middlebox.compose import load
from middlebox.library import scenario_dir
from middlebox.report.diagnosis import BUFFERING_FAULTS, diagnose
from middlebox.scenario.model import Scenario

LIBRARY = scenario_dir()
FACTS = Path(__file__).resolve().parent / "data" / "library-facts.json"
# what diagnose() reads of a result's metrics (report/diagnosis.py: symptoms, findings)
READ = (
    "client.bursts",
    "client.tokens_per_burst",
    "client.delivered_tokens_per_burst",
    "server.tokens_per_burst",
    "client.perceived_ttft_ms",
    "server.upstream_ttft_ms",
    "client.largest_gap_ms",
    "client.amplification",
    "server.generations_per_request",
    "server.tokens_wasted",
    "server.abort_latency_ms",
)


def facts_of(document: dict[str, Any]) -> list[dict[str, Any]]:
    """The part of a report document the diagnosis reads, per scenario-client run."""

    def rounded(value: Any) -> Any:
        if isinstance(value, list):
            return [rounded(v) for v in value]
        return round(value, 1) if isinstance(value, float) else value

    return [
        {
            "scenario": scenario["name"],
            "client": result["client"],
            "verdicts": result["verdicts"]["requests"],
            "attempts": [request["attempts"] for request in result["requests"]],
            "fired": result["verdicts"]["faults_fired"],
            "metrics": {k: rounded(result["metrics"][k]) for k in READ if k in result["metrics"]},
        }
        for scenario in document["scenarios"]
        for result in scenario["results"]
    ]


def as_result(run: dict[str, Any]) -> dict[str, Any]:
    """A recorded run as the report document holds it (what `diagnose` takes)."""
    return {
        "client": run["client"],
        "requests": [
            {"verdict": v, "attempts": a}
            for v, a in zip(run["verdicts"], run["attempts"], strict=True)
        ],
        "verdicts": {"requests": run["verdicts"], "faults_fired": run["fired"]},
        "metrics": run["metrics"],
    }


RUNS: list[dict[str, Any]] = json.loads(FACTS.read_text())


@cache
def scenario(name: str) -> Scenario:
    path = LIBRARY / f"{name}.yaml"
    assert path.exists(), f"{name} left the library: rerecord {FACTS.name} ({__doc__})"
    return load(path)


def buffering_faults(name: str) -> set[str]:
    return {spec.name for spec in scenario(name).path} & set(BUFFERING_FAULTS)


def pins_lumps(name: str, client: str) -> bool:
    """The scenario's `expect:` asks this client for lumps (tokens_per_burst at least 2)."""
    expect = scenario(name).sections.get("expect") or {}
    rule = {**expect, **(expect.get(client) or {})}.get("client.tokens_per_burst")
    return isinstance(rule, dict) and rule.get("min", 0) >= 2


def ids(run: dict[str, Any]) -> str:
    return f"{run['scenario']}/{run['client']}"


def test_the_facts_are_a_whole_library_run() -> None:
    assert len({run["scenario"] for run in RUNS}) >= 45
    assert len(RUNS) >= 170


@pytest.mark.parametrize("run", RUNS, ids=ids)
def test_a_buffering_hop_is_diagnosed_only_where_the_path_has_one(run: dict[str, Any]) -> None:
    line = diagnose(as_result(run))
    if not buffering_faults(run["scenario"]):
        assert "buffering" not in line and "lumps" not in line, line
    if pins_lumps(run["scenario"], run["client"]):
        assert "lumps: a buffering hop" in line, line
        assert any(f"({fault})" in line for fault in buffering_faults(run["scenario"])), line


def test_the_library_has_runs_on_both_sides_of_the_rule() -> None:
    """Guards the test above against passing vacuously."""
    lumpy = [run for run in RUNS if pins_lumps(run["scenario"], run["client"])]
    smooth = [run for run in RUNS if not buffering_faults(run["scenario"])]
    assert len(lumpy) >= 16 and len(smooth) >= 120
    # the runs the diagnosis once got wrong: lumps of tokens the client never saw
    names = {run["scenario"] for run in smooth}
    assert {"abandon-no-abort", "abandon-ignore-client-close"} <= names


def main(report: str) -> None:
    """Rerecord the facts from a report.json of a whole-library run."""
    document = json.loads(Path(report).read_text())
    lines = [
        json.dumps(run, ensure_ascii=False, separators=(",", ":")) for run in facts_of(document)
    ]
    FACTS.write_text("[\n" + ",\n".join(lines) + "\n]\n")  # a run a line: diffs read per run


if __name__ == "__main__":
    main(sys.argv[1])
