"""A suite's outcome becomes one plain-data document, and every view renders that document:
a report.json read back from disk gives the same scorecard and JUnit XML as the fresh run."""

from __future__ import annotations

import json
from xml.etree import ElementTree

from middlebox.report.scorecard import junit_xml, scorecard, verdict_sections
from middlebox.run.outcome import ScenarioOutcome, SuiteOutcome
from middlebox.run.score import Check, ClientScore, RequestScore
from middlebox.scenario.model import Scenario


def suite() -> SuiteOutcome:
    scenario = Scenario(name="reset-mid-stream", seed=7, source="s.yaml", quiet_faults=("quiet",))
    silent = ClientScore(
        "reset-mid-stream",
        "raw",
        requests=[RequestScore(0, "silent_truncation", 40, 12, 1, 1)],
        metrics={"server.tokens_wasted": 3},
        faults_fired=["cut:rst"],
        faults_declared=["cut", "quiet", "latency"],
        checks=[Check("client.silent_truncations", "equals", 0, 1, False)],
    )
    fine = ClientScore(
        "reset-mid-stream",
        "resilient",
        requests=[RequestScore(0, "complete", 40, 40, 2, 2)],
        faults_fired=["cut:rst", "latency:delay"],
        faults_declared=["cut", "quiet", "latency"],
        checks=[Check("client.silent_truncations", "equals", 0, 0, True)],
    )
    outcome = ScenarioOutcome(scenario, 7, [silent, fine], problems=["a problem"])
    return SuiteOutcome([outcome], 7, ["raw", "resilient"], argv={"paths": ["s.yaml"]})


def test_the_document_carries_what_the_views_and_a_rerun_need() -> None:
    document = suite().document()
    assert document["run"] == {"paths": ["s.yaml"], "seed": 7}
    assert document["clients"] == ["raw", "resilient"] and document["passed"] is False
    (scenario,) = document["scenarios"]
    assert scenario["quiet_faults"] == ["quiet"]
    assert [r["passed"] for r in scenario["results"]] == [False, True]
    assert verdict_sections(document)["reset-mid-stream"]["raw"]["requests"] == [
        "silent_truncation"
    ]


def test_the_scorecard_names_the_symptom_the_failed_check_and_the_fault_that_never_fired() -> None:
    text = scorecard(suite().document())
    assert "SILENT 1/1 w3 ✗" in text and "ok 1/1" in text
    assert "reset-mid-stream/raw: client.silent_truncations equals 0: got 1" in text
    # quiet faults are meant not to fire: only latency is a warning, and only for raw
    assert "reset-mid-stream/raw: warning: declared fault(s) never fired: latency" in text
    assert "resilient: warning" not in text
    assert text.endswith("1/2 scenario-client runs met their expectations; FAIL")


def test_colour_is_ansi_only_when_asked_for() -> None:
    assert "\033[" not in scorecard(suite().document())
    assert "\033[31mSILENT" in scorecard(suite().document(), colour=True)


def test_a_report_read_back_from_json_renders_exactly_like_the_fresh_run() -> None:
    fresh = suite().document()
    saved = json.loads(json.dumps(fresh))
    assert scorecard(saved) == scorecard(fresh)
    assert junit_xml(saved) == junit_xml(fresh)
    root = ElementTree.fromstring(junit_xml(saved))
    failures = [f.get("message") for f in root.iter("failure")]
    assert failures[0] == "a problem"
    assert failures[1].startswith("client.silent_truncations equals 0: got 1; why: ")
