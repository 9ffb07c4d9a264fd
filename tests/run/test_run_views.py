"""One real run (emulator, proxy, a stdlib client) seen whole: the proof fails a scenario
whose declared fault never fired, report.json counts fired and bypassed faults, and
every run gets its journal with boundaries, a timeline PNG and a place in report.html."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import pytest

from middlebox.observe.journal import facts, read_ndjson
from middlebox.run.outcome import SuiteOutcome
from middlebox.run.suite import run_suite

pytestmark = pytest.mark.e2e

CLIENT = Path(__file__).parent / "clients" / "sse_client.py"
SCENARIO = """\
name: obs-proof
description: a latency that fires and an idle reaper that never does
seed: 5
path:
  - latency: {delay: 2ms}
  - idle_reaper: {timeout: 60s}
upstream: {itl: 5ms, prefill_overhead: 10ms}
workload: {requests: 2, max_tokens: 6, timeout: 15s}
"""


@pytest.fixture(scope="module")
def run(tmp_path_factory: pytest.TempPathFactory) -> tuple[SuiteOutcome, Path]:
    root = tmp_path_factory.mktemp("views")
    (root / "obs-proof.yaml").write_text(SCENARIO)
    report = root / "report"
    suite = run_suite(
        [str(root / "obs-proof.yaml")],
        client_commands=[f"trusting={sys.executable} {CLIENT} trusting"],
        report_dir=report,
        jobs=1,
    )
    return suite, report


def document(report: Path) -> dict[str, Any]:
    return json.loads((report / "report.json").read_text())


def test_a_declared_fault_that_never_fired_fails_the_scenario_loudly(
    run: tuple[SuiteOutcome, Path],
) -> None:
    suite, report = run
    assert not suite.passed
    (outcome,) = suite.outcomes
    assert all(score.passed for score in outcome.scores)  # the checks alone would pass
    assert any("'idle_reaper' never fired for any client" in p for p in outcome.problems)
    proof = document(report)["scenarios"][0]["proof"]
    assert proof["connections"] == {"trusting": 2}  # one connection per request
    assert proof["faults"]["latency"]["fired"] == 2
    assert proof["faults"]["idle_reaper"] == {
        "fired": 0,
        "bypassed": 2,
        "clients_fired": [],
        "clients_bypassed": ["trusting"],
    }
    junit = (report / "junit.xml").read_text()
    assert "idle_reaper" in junit and "<failure" in junit


def test_the_journal_has_both_legs_boundaries_and_ends(run: tuple[SuiteOutcome, Path]) -> None:
    _, report = run
    (journal,) = report.glob("runs/*/trusting.journal.ndjson")
    views = read_ndjson(journal)
    summary = facts(views)
    assert summary["faults_fired"] == {"latency": 2}
    assert summary["sse_events_to_client"] >= 2 * 6  # tokens plus [DONE], two requests
    heads = [b for b in views[0].boundaries if b["type"] == "http_head"]
    assert {(h["leg"], h["direction"]) for h in heads} == {
        ("client", "upstream"),
        ("upstream", "upstream"),
        ("client", "downstream"),
        ("upstream", "downstream"),
    }
    request_head = next(h for h in heads if h["direction"] == "upstream")
    assert ["Authorization", "[redacted]"] in request_head["headers"]
    assert views[0].summary["scenario"] == "obs-proof"


def test_every_run_gets_a_timeline_png_and_the_html_report(
    run: tuple[SuiteOutcome, Path],
) -> None:
    _, report = run
    (png,) = report.glob("runs/*/trusting.timeline.png")
    assert png.read_bytes()[:4] == b"\x89PNG"
    timeline = json.loads(png.with_suffix(".json").read_text())
    assert [len(r["tokens"]) for r in timeline["requests"]] == [6, 6]
    result = json.loads((png.parent / "trusting.result.json").read_text())
    assert [len(r["shown"]) for r in timeline["requests"]] == [
        len([c for c in r["chunks"] if c[1]]) for r in result["results"]
    ]
    page = (report / "report.html").read_text()
    assert page.count("<svg") == 2
    assert "never fired for any client" in page
