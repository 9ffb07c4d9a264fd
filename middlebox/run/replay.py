"""`middlebox replay report.json`: rerun a report's scenarios with its seeds and clients and
list every verdict that differs (the report's `run` section holds what a rerun needs)."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

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
    return Replay(suite, differences)
