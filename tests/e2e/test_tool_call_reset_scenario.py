"""tool-call-reset-in-arguments through the emulator, as `make run` runs it: its strict,
bounded tool (the request a real vLLM 0.32 holds to the schema, see
tests/scenario/test_strict_tool_call_request.py) keeps every client's expected verdict, and
the cut fires inside the call's arguments for each of its three clients."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from middlebox.library import scenario_dir
from middlebox.run.suite import run_suite

pytestmark = pytest.mark.e2e

SCENARIO = scenario_dir() / "tool-call-reset-in-arguments.yaml"
CLIENTS = ["tools-naive", "openai-tools", "resilient"]


def test_every_client_meets_its_expectations_and_the_cut_fires_for_each(tmp_path: Path) -> None:
    suite = run_suite([str(SCENARIO)], client_names=CLIENTS, report_dir=tmp_path, jobs=1)
    [outcome] = suite.outcomes
    assert suite.passed, [outcome.problems, [s.verdicts() for s in outcome.scores]]
    cut = outcome.proof["faults"]["cut"]
    assert sorted(cut["clients_fired"]) == sorted(CLIENTS) and cut["clients_bypassed"] == []
    verdicts = {s.client: s.verdicts()["requests"] for s in outcome.scores}
    assert verdicts["tools-naive"] == ["acted_on_partial_call"]
    report = json.loads((tmp_path / "report.json").read_text())
    [scenario] = report["scenarios"]
    executed = {
        r["client"]: r["metrics"]["client.tool_calls_executed"] for r in scenario["results"]
    }
    assert executed == {"tools-naive": 2, "openai-tools": 0, "resilient": 1}
