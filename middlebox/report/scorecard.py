"""Views of a suite's verdicts: the terminal scorecard, junit.xml, and the report files.

Every view takes the plain-data report document (`middlebox.run.outcome.report_document`,
the content of `report.json`), never the runner's objects, so reporting depends on no
part of running and a saved report.json renders the same as a fresh run.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any
from xml.etree import ElementTree

from middlebox.report.diagnosis import (
    FIGURE_LEGEND,
    check_said,
    diagnose,
    failure_message,
    figures,
    symptoms,
)
from middlebox.report.html_page import write_html

SEVERITY = [
    "hang",
    "acted_on_partial_call",  # agent verdicts: run/agent_checks.py
    "side_effect_repeated",
    "acted_on_invalid_json",
    "silent_truncation",
    "mojibake",
    "duplicated",
    "contradicted",
    "missing_tokens",
    "reasoning_as_answer",
    "truncation_detected",
    "error_reported",
    "abandoned",
    "complete_then_error",
    "reasoning_hidden",
    "complete",
]
GOOD = {"complete", "abandoned"}
COLOURS = {
    "hang": "red",
    "acted_on_partial_call": "red",
    "side_effect_repeated": "red",
    "acted_on_invalid_json": "red",
    "reasoning_as_answer": "red",
    "reasoning_hidden": "yellow",
    "silent_truncation": "red",
    "mojibake": "red",
    "duplicated": "red",
    "contradicted": "red",
    "missing_tokens": "red",
    "truncation_detected": "yellow",
    "error_reported": "yellow",
    "abandoned": "cyan",
    "complete_then_error": "yellow",
    "complete": "green",
}
SHORT = {
    "hang": "HANG",
    "acted_on_partial_call": "PARTIAL-CALL",
    "side_effect_repeated": "TWICE",
    "acted_on_invalid_json": "BAD-JSON",
    "reasoning_as_answer": "REASONING",
    "reasoning_hidden": "thinking-hidden",
    "silent_truncation": "SILENT",
    "mojibake": "MOJIBAKE",
    "duplicated": "DUP",
    "contradicted": "REDRAWN",
    "missing_tokens": "MISSING",
    "truncation_detected": "detected",
    "error_reported": "error",
    "abandoned": "abandoned",
    "complete_then_error": "ok+error",
    "complete": "ok",
}


# SGR foreground colours (ECMA-48), the ones click.style would write, without click here
ANSI = {"red": 31, "green": 32, "yellow": 33, "cyan": 36, "white": 37}


def styled(text: str, colour: str) -> str:
    return f"\033[{ANSI[colour]}m{text}\033[0m"


def cell(result: dict[str, Any]) -> tuple[str, str]:
    """A short summary of one client's verdicts: the worst kind and how many had it."""
    verdicts = [request["verdict"] for request in result["requests"]]
    if not verdicts:
        return "-", "white"
    worst = min(verdicts, key=SEVERITY.index)
    text = f"{SHORT[worst]} {verdicts.count(worst)}/{len(verdicts)}"
    if result["metrics"].get("server.tokens_wasted"):
        text += f" w{result['metrics']['server.tokens_wasted']}"
    if not result["passed"]:
        text += " ✗"
    return text, COLOURS[worst] if result["passed"] else "red"


def describe(check: dict[str, Any]) -> str:
    return check_said(check)


def status_of(scenario: dict[str, Any], result: dict[str, Any] | None = None) -> str | None:
    """A run that did not produce verdicts says why (e.g. "needs the emulator: <reason>"),
    in the document's `status` field of the scenario or result; None when it ran."""
    for holder in (result or {}, scenario):
        status = holder.get("status")
        if isinstance(status, str) and status not in ("", "ran", "ok"):
            return status
    return None


def symptom_table(document: dict[str, Any]) -> list[str]:
    """Per scenario and client, next to the verdict, the numbers that name the symptom and
    a one-line diagnosis (Locust's stats table is the model: one dense row per run)."""
    rows: list[list[str]] = []
    for scenario in document["scenarios"]:
        for result in scenario["results"]:
            status = status_of(scenario, result)
            verdict = status or cell(result)[0]
            numbers = figures(symptoms(result))
            rows.append(
                [f"{scenario['name']}/{result['client']}", verdict, *numbers.values(),
                 "-" if status else diagnose(result)]
            )  # fmt: skip
        if not scenario["results"] and status_of(scenario):
            rows.append([scenario["name"], str(status_of(scenario)), *["-"] * 6, "-"])
    if not rows:
        return []
    header = ["scenario/client", "verdict", *figures(symptoms({})).keys(), "diagnosis"]
    widths = [max(len(row[i]) for row in [header, *rows]) for i in range(len(header) - 1)]
    return [
        "  ".join(text.ljust(width) for text, width in zip(row, widths, strict=False))
        + "  "
        + row[-1]
        for row in [header, *rows]
    ]


TAKES_LEGEND = (
    "Taken again (against a real server a failed take is taken again, up to three takes, and "
    "the least disturbed counts: middlebox.run.takes):"
)


def take_said(take: dict[str, Any]) -> str:
    """One take of a re-taken run: kept or not, held or why not, and its disturbance."""
    said = f"take {take['take']}{' (kept)' if take['kept'] else ''} "
    said += "held" if take["held"] else f"failed ({take.get('why_not', '')})"
    said += f", server stall {take['server_stall_ms']} ms, loop lag {take['loop_lag_ms']} ms"
    return said + (f" (gc {take['gc_pause_ms']} ms)" if take.get("gc_pause_ms") else "")


def scorecard(document: dict[str, Any], *, colour: bool | None = None) -> str:
    """The scenario x client matrix, the symptom table (numbers and a diagnosis per run),
    then every failed check (what, why, what to do) and problem."""
    scenarios: list[dict[str, Any]] = document["scenarios"]
    # plus the clients only some scenarios ran (the agent clients their workload names)
    ran = [r["client"] for scenario in scenarios for r in scenario["results"]]
    clients: list[str] = list(dict.fromkeys([*document["clients"], *ran]))
    width = max([len(s["name"]) for s in scenarios] + [8])
    cells = [
        [cell(result) if result else (status_of(scenario) or "-", "yellow") for result in
         ({r["client"]: r for r in scenario["results"]}.get(client) for client in clients)]
        for scenario in scenarios
    ]  # fmt: skip
    column = max([len(c) for c in clients] + [len(t) for row in cells for t, _ in row]) + 2
    lines = ["scenario".ljust(width) + "  " + "".join(c.ljust(column) for c in clients)]
    for scenario, row_cells in zip(scenarios, cells, strict=True):
        row = scenario["name"].ljust(width) + "  "
        for text, hue in row_cells:
            padded = text.ljust(column)
            row += styled(padded, hue) if colour else padded
        lines.append(row.rstrip())
    lines.append("")
    lines.append(
        "ok = complete; SILENT = reported success with text missing; detected = "
        "truncation surfaced; DUP/MISSING/MOJIBAKE = corrupted text; wN = tokens "
        "wasted upstream; ✗ = an expect: check failed"
    )
    table = symptom_table(document)
    if table:
        lines += ["", "Symptoms:", *table, "", FIGURE_LEGEND]
    failures = []
    for scenario in scenarios:
        name = scenario["name"]
        failures += [f"  {problem}" for problem in scenario["problems"]]
        if scenario.get("needs_emulator"):
            lines.append(f"{name}: needs the emulator: {scenario['needs_emulator']}")
        if scenario.get("needs_context"):
            lines.append(f"{name}: {scenario['needs_context']}")
        for result in scenario["results"]:
            failures += [
                f"  {name}/{result['client']}: {failure_message(scenario, result['client'], check)}"
                for check in result["checks"]
                if not check["passed"]
            ]
            never = sorted(
                set(result["faults_declared"])
                - {f.split(":")[0] for f in result["verdicts"]["faults_fired"]}
                - set(scenario.get("quiet_faults", ()))
            )
            if never:
                failures.append(
                    f"  {name}/{result['client']}: warning: declared "
                    f"fault(s) never fired: {', '.join(never)}"
                )
    if failures:
        lines += ["", "Failed checks and problems:", *failures]
    retaken = [
        f"  {scenario['name']}/{result['client']}: " + "; ".join(map(take_said, result["takes"]))
        for scenario in scenarios
        for result in scenario["results"]
        if len(result.get("takes") or ()) > 1
    ]
    if retaken:
        lines += ["", TAKES_LEGEND, *retaken]
    total = sum(len(s["results"]) for s in scenarios)
    passed = sum(1 for s in scenarios for r in s["results"] if r["passed"])
    lines.append(
        f"{passed}/{total} scenario-client runs met their expectations; "
        f"{'PASS' if document['passed'] else 'FAIL'}"
    )
    return "\n".join(lines)


def verdict_sections(document: dict[str, Any]) -> dict[str, Any]:
    """What must be identical across runs with the same seeds."""
    return {
        scenario["name"]: {result["client"]: result["verdicts"] for result in scenario["results"]}
        for scenario in document["scenarios"]
    }


def junit_xml(document: dict[str, Any]) -> bytes:
    """One testsuite per scenario, one testcase per (client, check); failures name the check."""
    root = ElementTree.Element("testsuites", name="middlebox")
    for scenario in document["scenarios"]:
        name = scenario["name"]
        cases = [(result, check) for result in scenario["results"] for check in result["checks"]]
        failed = sum(1 for _, check in cases if not check["passed"]) + len(scenario["problems"])
        suite_el = ElementTree.SubElement(
            root,
            "testsuite",
            name=name,
            tests=str(len(cases) + len(scenario["problems"])),
            failures=str(failed),
        )
        for problem in scenario["problems"]:
            case = ElementTree.SubElement(suite_el, "testcase", name="scenario", classname=name)
            ElementTree.SubElement(case, "failure", message=problem)
        if scenario.get("needs_emulator"):
            case = ElementTree.SubElement(suite_el, "testcase", name="scenario", classname=name)
            reason = f"needs the emulator: {scenario['needs_emulator']}"
            ElementTree.SubElement(case, "skipped", message=reason)
        if scenario.get("needs_context"):
            case = ElementTree.SubElement(suite_el, "testcase", name="scenario", classname=name)
            ElementTree.SubElement(case, "skipped", message=scenario["needs_context"])
        for result, check in cases:
            case = ElementTree.SubElement(
                suite_el,
                "testcase",
                name=f"{result['client']}: {check['name']} {check['condition']} "
                f"{check['expected']}",
                classname=f"{name}.{result['client']}",
            )
            if not check["passed"]:
                failure = ElementTree.SubElement(
                    case, "failure", message=failure_message(scenario, result["client"], check)
                )
                failure.text = f"diagnosis: {diagnose(result)}"
    xml: bytes = ElementTree.tostring(root, encoding="utf-8", xml_declaration=True)
    return xml


def write_reports(document: dict[str, Any], directory: Path) -> None:
    """report.json, junit.xml and report.html (with its timelines) in `directory`."""
    directory.mkdir(parents=True, exist_ok=True)
    (directory / "report.json").write_text(json.dumps(document, indent=2, ensure_ascii=False))
    (directory / "junit.xml").write_bytes(junit_xml(document))
    write_html(document, directory)
