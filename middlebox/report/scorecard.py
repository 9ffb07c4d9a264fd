"""Views of a suite's verdicts: the terminal scorecard, report.json, junit.xml, replay.

Verdicts and metrics are plain data (`ClientScore.to_json`); everything here only
presents them. `report.json` keeps what a rerun needs (files, seeds, clients), so
`middlebox replay report.json` reruns with the same seeds and compares verdicts.
"""

from __future__ import annotations

import json
import platform
import sys
from pathlib import Path
from typing import Any
from xml.etree import ElementTree

import click

from middlebox import __version__
from middlebox.run.runner import SuiteOutcome, run_suite
from middlebox.run.score import ClientScore

SEVERITY = [
    "hang",
    "silent_truncation",
    "mojibake",
    "duplicated",
    "missing_tokens",
    "truncation_detected",
    "error_reported",
    "abandoned",
    "complete",
]
GOOD = {"complete", "abandoned"}
COLOURS = {
    "hang": "red",
    "silent_truncation": "red",
    "mojibake": "red",
    "duplicated": "red",
    "missing_tokens": "red",
    "truncation_detected": "yellow",
    "error_reported": "yellow",
    "abandoned": "cyan",
    "complete": "green",
}
SHORT = {
    "hang": "HANG",
    "silent_truncation": "SILENT",
    "mojibake": "MOJIBAKE",
    "duplicated": "DUP",
    "missing_tokens": "MISSING",
    "truncation_detected": "detected",
    "error_reported": "error",
    "abandoned": "abandoned",
    "complete": "ok",
}


def cell(score: ClientScore) -> tuple[str, str]:
    """A short summary of one client's verdicts: the worst kind and how many had it."""
    verdicts = [request.verdict for request in score.requests]
    if not verdicts:
        return "-", "white"
    worst = min(verdicts, key=SEVERITY.index)
    text = f"{SHORT[worst]} {verdicts.count(worst)}/{len(verdicts)}"
    if score.metrics.get("server.tokens_wasted"):
        text += f" w{score.metrics['server.tokens_wasted']}"
    if not score.passed:
        text += " ✗"
    return text, COLOURS[worst] if score.passed else "red"


def scorecard(suite: SuiteOutcome, *, colour: bool | None = None) -> str:
    """The scenario x client matrix, then every failed check and problem."""
    clients = suite.clients
    width = max([len(o.scenario.name) for o in suite.outcomes] + [8])
    cells = [
        [cell(score) if score else ("-", "white") for score in
         ({s.client: s for s in outcome.scores}.get(client) for client in clients)]
        for outcome in suite.outcomes
    ]  # fmt: skip
    column = max([len(c) for c in clients] + [len(t) for row in cells for t, _ in row]) + 2
    lines = ["scenario".ljust(width) + "  " + "".join(c.ljust(column) for c in clients)]
    for outcome, row_cells in zip(suite.outcomes, cells, strict=True):
        row = outcome.scenario.name.ljust(width) + "  "
        for text, hue in row_cells:
            padded = text.ljust(column)
            row += click.style(padded, fg=hue) if colour else padded
        lines.append(row.rstrip())
    lines.append("")
    lines.append(
        "ok = complete; SILENT = reported success with text missing; detected = "
        "truncation surfaced; DUP/MISSING/MOJIBAKE = corrupted text; wN = tokens "
        "wasted upstream; ✗ = an expect: check failed"
    )
    failures = []
    for outcome in suite.outcomes:
        failures += [f"  {problem}" for problem in outcome.problems]
        for score in outcome.scores:
            failures += [
                f"  {outcome.scenario.name}/{score.client}: {check.describe()}"
                for check in score.checks
                if not check.passed
            ]
            never = sorted(
                set(score.faults_declared)
                - {f.split(":")[0] for f in score.faults_fired}
                - set(outcome.scenario.quiet_faults)
            )
            if never:
                failures.append(
                    f"  {outcome.scenario.name}/{score.client}: warning: declared "
                    f"fault(s) never fired: {', '.join(never)}"
                )
    if failures:
        lines += ["Failed checks and problems:", *failures]
    total = sum(len(o.scores) for o in suite.outcomes)
    passed = sum(1 for o in suite.outcomes for s in o.scores if s.passed)
    lines.append(
        f"{passed}/{total} scenario-client runs met their expectations; "
        f"{'PASS' if suite.passed else 'FAIL'}"
    )
    return "\n".join(lines)


def report_document(suite: SuiteOutcome, argv: dict[str, Any]) -> dict[str, Any]:
    return {
        "middlebox": __version__,
        "python": sys.version.split()[0],
        "platform": platform.platform(),
        "run": {**argv, "seed": suite.seed},
        "passed": suite.passed,
        "scenarios": [
            {
                "name": outcome.scenario.name,
                "file": outcome.scenario.source,
                "seed": outcome.seed,
                "problems": outcome.problems,
                "proof": outcome.proof,
                "results": [score.to_json() for score in outcome.scores],
            }
            for outcome in suite.outcomes
        ],
    }


def verdict_sections(document: dict[str, Any]) -> dict[str, Any]:
    """What must be identical across runs with the same seeds."""
    return {
        scenario["name"]: {result["client"]: result["verdicts"] for result in scenario["results"]}
        for scenario in document["scenarios"]
    }


def junit_xml(suite: SuiteOutcome) -> bytes:
    """One testsuite per scenario, one testcase per (client, check); failures name the check."""
    root = ElementTree.Element("testsuites", name="middlebox")
    for outcome in suite.outcomes:
        cases = [(score, check) for score in outcome.scores for check in score.checks]
        failed = sum(1 for _, check in cases if not check.passed) + len(outcome.problems)
        suite_el = ElementTree.SubElement(
            root,
            "testsuite",
            name=outcome.scenario.name,
            tests=str(len(cases) + len(outcome.problems)),
            failures=str(failed),
        )
        for problem in outcome.problems:
            case = ElementTree.SubElement(
                suite_el, "testcase", name="scenario", classname=outcome.scenario.name
            )
            ElementTree.SubElement(case, "failure", message=problem)
        for score, check in cases:
            case = ElementTree.SubElement(
                suite_el,
                "testcase",
                name=f"{score.client}: {check.name} {check.condition} {check.expected}",
                classname=f"{outcome.scenario.name}.{score.client}",
            )
            if not check.passed:
                ElementTree.SubElement(case, "failure", message=check.describe())
    document: bytes = ElementTree.tostring(root, encoding="utf-8", xml_declaration=True)
    return document


def write_reports(suite: SuiteOutcome, directory: Path, argv: dict[str, Any]) -> None:
    directory.mkdir(parents=True, exist_ok=True)
    document = report_document(suite, argv)
    (directory / "report.json").write_text(json.dumps(document, indent=2, ensure_ascii=False))
    (directory / "junit.xml").write_bytes(junit_xml(suite))
    from middlebox.report.html_page import write_html

    write_html(document, directory)


def replay(report_path: Path, report_dir: Path | None) -> tuple[bool, list[str], SuiteOutcome]:
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
    return not differences, differences, suite
