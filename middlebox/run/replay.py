"""`middlebox replay report.json`: rerun a report's scenarios with its seeds and clients and
list every verdict that differs, and every request whose generated or shown text differs
(the report's `run` section holds what a rerun needs; the emulator is seeded by the same
seed, so the same seed must give the same text, not only the same verdicts)."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from middlebox.report.scorecard import verdict_sections
from middlebox.run.outcome import SuiteOutcome, report_document
from middlebox.run.suite import run_suite


@dataclass
class Replay:
    suite: SuiteOutcome
    differences: list[str]

    @property
    def same(self) -> bool:
        return not self.differences


def replay_report(report_path: Path, report_dir: Path | None) -> Replay:
    """Rerun a report's scenarios with its seeds and clients; list verdicts that differ."""
    document = json.loads(report_path.read_text())
    run = document["run"]
    suite = run_suite(
        run["paths"],
        client_names=run.get("clients") or (),
        client_commands=run.get("client_commands") or (),
        seed=run.get("seed"),
        upstream_url=run.get("upstream"),
        report_dir=report_dir,
        jobs=run.get("jobs", 2),
    )
    before = verdict_sections(document)
    after = verdict_sections(report_document(suite, run))
    differences = []
    for scenario in sorted(before.keys() | after.keys()):
        for client in sorted(before.get(scenario, {}).keys() | after.get(scenario, {}).keys()):
            old = before.get(scenario, {}).get(client)
            new = after.get(scenario, {}).get(client)
            if old != new:
                differences.append(f"{scenario}/{client}: was {old}, now {new}")
    differences += text_differences(document, report_document(suite, run))
    return Replay(suite, differences)


def request_texts(document: dict[str, Any]) -> dict[tuple[str, str, int], tuple[str, str]]:
    """Per (scenario, client, request index): digests of the text the upstream generated
    (what the client should have shown) and of the text the client showed."""
    return {
        (scenario["name"], result["client"], int(request["index"])): (
            str(request.get("expected_digest", "")),
            str(request.get("shown_digest", "")),
        )
        for scenario in document.get("scenarios", [])
        for result in scenario.get("results", [])
        for request in result.get("requests", [])
    }


def text_differences(before: dict[str, Any], after: dict[str, Any]) -> list[str]:
    """Requests, present in both reports, whose generated or shown text changed."""
    old, new = request_texts(before), request_texts(after)
    differences = []
    # a report written before the digests existed has none to compare
    for key in sorted(k for k in old.keys() & new.keys() if old[k][0] and new[k][0]):
        (old_expected, old_shown), (new_expected, new_shown) = old[key], new[key]
        scenario, client, index = key
        if old_expected != new_expected:
            differences.append(f"{scenario}/{client}: request {index}: generated text differs")
        elif old_shown != new_shown:
            differences.append(f"{scenario}/{client}: request {index}: shown text differs")
    return differences
